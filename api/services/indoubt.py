"""In-doubt transactions of every group, resolved (DESIGN.md invariant 4).

A txn is in doubt while the coordinator's log has it PREPARING, COMMITTING
or ABORTING: its worker died, or its abort could not confirm the cleanup.
The coordinator resolves one (`resolve_in_doubt`: PREPARING → abort,
COMMITTING → re-commit or abort, ABORTING → abort again and check that no
member snapshot is left) once no live worker can still be driving it; here
that is done for every group that has one, each under its group's lock,
and each outcome is settled on the txn's snapshot (`capture.settle`).

The worker runs it when it starts (so a leftover is cleaned up without a
new snapshot of its group), and beat every `resolve_interval_s`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from cutpoint.api.config import Settings
from cutpoint.api.services import capture
from sqlalchemy.orm import Session, sessionmaker

log = logging.getLogger("cutpoint.indoubt")


@dataclass
class Resolution:
    resolved: dict[str, str] = field(default_factory=dict)  # txn -> state now
    # In doubt but possibly still driven by a live worker: not touched yet.
    too_recent: list[str] = field(default_factory=list)
    # Resolved again, still not final (an agent still cannot clean up).
    unresolved: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"resolved": self.resolved, "too_recent": self.too_recent,
                "unresolved": self.unresolved}


def groups_in_doubt(settings: Settings) -> list[str]:
    return sorted({r.group for r in capture.txlog_for(settings.database_url).in_doubt()})


def resolve_group(sf: sessionmaker[Session], settings: Settings, group: str) -> Resolution:
    """Resolve the group's in-doubt txns that no live worker can be driving
    (the caller holds the group's lock and passes its fenced `sf`)."""
    from cutpoint.coordinator.twophase import resolve_in_doubt

    txlog = capture.txlog(sf, settings)
    before = {r.txn for r in txlog.in_doubt(group=group)}
    results = capture._run_async(resolve_in_doubt(
        txlog, capture.pool(settings), group=group, wait=False,
        offload=capture._mode() == capture.SHARED))
    out = Resolution()
    for r in results:
        capture.settle(sf, settings, r)
        out.resolved[r.txn] = r.state
        log.warning("event=txn_resolved group=%s txn=%s state=%s", group, r.txn, r.state)
    still = {r.txn for r in txlog.in_doubt(group=group)}
    out.too_recent = sorted((before - set(out.resolved)) & still)
    out.unresolved = sorted(still & set(out.resolved))
    return out
