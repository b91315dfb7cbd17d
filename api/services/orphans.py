"""Which member snapshots are orphans: the sweeper's decision rule.

An orphan is a snapshot cutpoint made for a transaction that ended without
a recovery point, and that nothing cleaned up: an abort that spared a
create still running at the budget deadline (it records its owner when it
completes, after the abort), an abort whose agent never answered and that
was later settled by hand, a group snapshot row closed as failed after its
members were made.  Invariant 3 says no member of an aborted txn may be
left; the sweeper (services/sweeper.py) removes what is.

The rule, for one snapshot an agent listed (`snapshot.list`, agent-protocol
§4.7), first match wins:

| what | verdict |
|---|---|
| its owner key cannot be read | keep `owner_unreadable` |
| no owner key (`cutpoint.snap.<id>`) | keep `not_cutpoints`: someone else's, or a QMP-internal snapshot (that backend records no owner) |
| no snap id (not an RBD snapshot) | keep `no_snap_id` |
| its txn is unknown to the database and the coordinator's log | keep `unknown_txn`: made by another control plane or a stand-alone `cutpoint snapshot --db` |
| its group snapshot is committed (or being deleted by retention) | keep `committed` |
| its group snapshot is a DR recovery point, a replication base, or a copy running now | keep `dr_reference` |
| the coordinator's log has the txn undecided (preparing, committing, aborting) | keep `in_doubt`: the in-doubt resolver owns it |
| its group snapshot is in flight (pending, preparing, committing, aborting) | keep `in_flight` |
| the coordinator's log says committed | keep `committed_in_log` |
| younger than the grace period (by its creation time, else its txn's) | keep `too_young` |
| otherwise (aborted, failed or deleted, and old enough) | **delete** `orphan` |

Only `decide` is the rule; `load_facts` reads what it needs from the
database in one pass.  Everything here is free of I/O to agents, so the
rule is tested on recorded agent replies (api/tests/test_orphan_rule.py).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cutpoint.api.models import IN_FLIGHT, GroupSnapshot, SnapState
from sqlalchemy import select
from sqlalchemy.orm import Session

DELETE, KEEP = "delete", "keep"
# Group snapshot states whose members retention owns (never the sweeper's).
RETAINED = (SnapState.committed.value, SnapState.deleting.value)
# The coordinator's undecided states (cutpoint.coordinator.txlog.IN_DOUBT).
LOG_IN_DOUBT = frozenset({"preparing", "committing", "aborting"})


@dataclass(frozen=True)
class Found:
    """One snapshot as an agent's `snapshot.list` reported it."""

    host: str
    disk: str                   # "<vm>/<node>", the agent's disk id
    name: str
    id: int | None = None       # RBD snap id
    owner: str | None = None    # the txn of its cutpoint.snap.<id> key
    created: int | None = None  # Unix seconds (librbd's snap timestamp)
    owner_error: str | None = None

    @classmethod
    def from_reply(cls, host: str, disk: str, item: dict[str, Any]) -> Found:
        """From one entry of `snapshot.list`'s `snapshots` (agent-protocol §4.7)."""
        def _int(v: Any) -> int | None:
            return v if isinstance(v, int) and not isinstance(v, bool) else None

        owner = item.get("owner")
        err = item.get("owner_error")
        return cls(host=host, disk=disk, name=str(item.get("name", "")),
                   id=_int(item.get("id")), owner=owner if isinstance(owner, str) else None,
                   created=_int(item.get("created")),
                   owner_error=str(err) if err is not None else None)


@dataclass(frozen=True)
class TxnFacts:
    """What the control plane knows of one txn."""

    db_state: str | None = None     # its group snapshot's state; None: no row
    dr_reference: bool = False      # DR recovery point, replication base or copy running
    log_state: str | None = None    # the coordinator's log; None: not in it
    started_at: dt.datetime | None = None  # the group snapshot's request time


@dataclass(frozen=True)
class Verdict:
    snap: Found
    action: str     # DELETE or KEEP
    reason: str     # a stable code (table above)
    detail: str     # for people

    def to_dict(self) -> dict[str, Any]:
        s = self.snap
        return {"host": s.host, "disk": s.disk, "name": s.name, "id": s.id, "owner": s.owner,
                "created": s.created, "action": self.action, "reason": self.reason,
                "detail": self.detail}


def _age_s(snap: Found, facts: TxnFacts, now: dt.datetime) -> float | None:
    if snap.created is not None:
        return now.timestamp() - snap.created
    if facts.started_at is not None:
        return (now - facts.started_at).total_seconds()
    return None


def decide(snap: Found, facts: dict[str, TxnFacts], now: dt.datetime,
           grace_s: float) -> Verdict:
    """The verdict on one listed snapshot (the table of the module doc)."""
    def keep(reason: str, detail: str) -> Verdict:
        return Verdict(snap, KEEP, reason, detail)

    if snap.owner_error is not None:
        return keep("owner_unreadable", f"its owner key could not be read: {snap.owner_error}")
    if snap.owner is None:
        return keep("not_cutpoints", "no cutpoint.snap.<id> owner key: not made by cutpoint's "
                                     "rbd method (or made by QMP, which records no owner)")
    if snap.id is None:
        return keep("no_snap_id", "listed without a snap id: not an RBD snapshot")
    txn = snap.owner
    f = facts.get(txn)
    if f is None or (f.db_state is None and f.log_state is None):
        return keep("unknown_txn", f"txn {txn} is in neither the database nor the "
                                   "coordinator's log of this control plane")
    if f.db_state in RETAINED:
        return keep("committed", f"txn {txn} is a {f.db_state} group snapshot (retention's)")
    if f.dr_reference:
        return keep("dr_reference", f"txn {txn} is a DR recovery point, a replication base "
                                    "or being copied")
    if f.log_state in LOG_IN_DOUBT:
        return keep("in_doubt", f"txn {txn} is {f.log_state} in the coordinator's log "
                                "(the in-doubt resolver's)")
    if f.db_state in {s.value for s in IN_FLIGHT}:
        return keep("in_flight", f"txn {txn}'s group snapshot is {f.db_state}")
    if f.log_state == "committed":
        return keep("committed_in_log", f"txn {txn} is committed in the coordinator's log")
    age = _age_s(snap, f, now)
    if age is None:
        return keep("age_unknown", f"txn {txn}: neither the snapshot nor its txn has a time")
    if age < grace_s:
        return keep("too_young", f"txn {txn} is {f.db_state or f.log_state}; the snapshot is "
                                 f"{age:.0f} s old, under the grace period of {grace_s:.0f} s")
    return Verdict(snap, DELETE, "orphan",
                   f"txn {txn} is {f.db_state or 'not in the database'} (log: "
                   f"{f.log_state or 'none'}); {age:.0f} s old")


def load_facts(session: Session, txlog: Any, txns: Iterable[str]) -> dict[str, TxnFacts]:
    """The facts of each txn: its group snapshot row (and whether DR needs
    it) and its record in the coordinator's log (`txlog.get`)."""
    from cutpoint.api.services.replication import in_flight

    want = sorted(set(txns))
    # The log first, before this session begins: on SQLite the log's own
    # transaction would otherwise wait behind this session's write lock.
    logged = {txn: txlog.get(txn) for txn in want}
    rows: dict[str, GroupSnapshot] = {}
    for i in range(0, len(want), 500):
        for g in session.scalars(select(GroupSnapshot)
                                 .where(GroupSnapshot.txn.in_(want[i:i + 500]))):
            rows[g.txn] = g
    copying: dict[int, set[int]] = {}
    out = {}
    for txn in want:
        g = rows.get(txn)
        dr = False
        if g is not None:
            if g.group_id not in copying:
                sources, bases = in_flight(session, g.group_id)
                copying[g.group_id] = sources | bases
            dr = (g.dr_verified_at is not None or g.replication_base
                  or g.id in copying[g.group_id])
        rec = logged[txn]
        out[txn] = TxnFacts(db_state=g.state.value if g is not None else None,
                            dr_reference=dr, log_state=rec.state if rec is not None else None,
                            started_at=g.requested_at if g is not None else None)
    return out
