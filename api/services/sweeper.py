"""The sweeper of orphan member snapshots (DESIGN.md invariant 3).

A run, in steps:

1. `_list`: ask every host's agent for the snapshots of each of its RBD
   disks (`snapshot.list`, agent-protocol §4.7: name, snap id, owner txn,
   creation time).  The agents own Ceph access on the hosts; the control
   plane has none of its own here.
2. `orphans.load_facts` + `orphans.decide`: what the database and the
   coordinator's log say of each owner txn, and the verdict on each
   snapshot (services/orphans.py has the rule).  The facts are read
   *after* the listing, so a txn begun meanwhile is in flight, never
   unknown-then-deleted.
3. `_delete` (not in a dry run): `snapshot.delete{disk, name, id, owner}`
   of each orphan.  The agent deletes by snap id and only while that id is
   still the listed name and its owner key still names the txn
   (`NOT_OWNED` otherwise), so nothing made since the listing can go.
   Each deletion, refusal and failure is written to the audit log.

It runs at worker start and every `orphan_sweep_interval_s` (tasks.py
`orphan_sweep_tick`), and when an admin asks (`POST /v1/orphans/sweep`, a
job; `GET /v1/orphans` is the dry run).  Snapshots younger than
`orphan_grace_s` are left for a later pass.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cutpoint.api.config import Settings
from cutpoint.api.models import Disk, Host, Vm, utcnow
from cutpoint.api.services import orphans
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

log = logging.getLogger("cutpoint.sweeper")

Progress = Callable[[float, str], None]


@dataclass
class SweepResult:
    dry_run: bool
    grace_s: float
    hosts: int = 0
    disks: int = 0
    unreachable: list[str] = field(default_factory=list)   # "host: error"
    list_errors: list[str] = field(default_factory=list)   # "disk: error"
    verdicts: list[orphans.Verdict] = field(default_factory=list)
    deleted: list[dict[str, Any]] = field(default_factory=list)
    absent: list[dict[str, Any]] = field(default_factory=list)   # gone before the delete
    refused: list[dict[str, Any]] = field(default_factory=list)  # NOT_OWNED: changed
    failed: list[dict[str, Any]] = field(default_factory=list)

    @property
    def orphans(self) -> list[orphans.Verdict]:
        return [v for v in self.verdicts if v.action == orphans.DELETE]

    def to_dict(self) -> dict[str, Any]:
        kept: dict[str, int] = {}
        for v in self.verdicts:
            if v.action == orphans.KEEP:
                kept[v.reason] = kept.get(v.reason, 0) + 1
        return {"dry_run": self.dry_run, "grace_s": self.grace_s, "hosts": self.hosts,
                "disks": self.disks, "snapshots": len(self.verdicts),
                "orphans": len(self.orphans), "kept": kept,
                "deleted": self.deleted, "absent": self.absent, "refused": self.refused,
                "failed": self.failed, "unreachable": self.unreachable,
                "list_errors": self.list_errors,
                "verdicts": [v.to_dict() for v in self.verdicts]}


def _targets(s: Session) -> list[tuple[Host, list[str]]]:
    """Every host with the ids of its present RBD disks (the inventory)."""
    out = []
    for host in s.scalars(select(Host).order_by(Host.name)):
        keys = list(s.scalars(select(Disk.key).join(Vm, Vm.id == Disk.vm_id)
                              .where(Vm.host_id == host.id, Vm.present, Disk.present,
                                     Disk.backend == "rbd").order_by(Disk.key)))
        if keys:
            out.append((host, keys))
    return out


def _list(sf: sessionmaker[Session], settings: Settings, res: SweepResult,
          progress: Progress) -> list[orphans.Found]:
    from cutpoint.api.services import agents

    found: list[orphans.Found] = []
    # No session stays open across the agent calls: on SQLite a session's
    # transaction holds the database's write lock.
    with sf() as s:
        targets = _targets(s)
        s.expunge_all()
    res.hosts = len(targets)
    for i, (host, keys) in enumerate(targets):
        progress(0.5 * i / max(1, len(targets)), f"listing {host.name} ({len(keys)} disks)")
        try:
            replies = agents.call_each(host, settings,
                                       [("snapshot.list", {"disk": k}) for k in keys])
        except agents.AgentCallError as exc:
            res.unreachable.append(f"{host.name}: {exc}")
            log.warning("event=sweep_host_unreachable host=%s error=%s", host.name, exc)
            continue
        for key, r in zip(keys, replies, strict=True):
            if isinstance(r, agents.AgentCallError):
                res.list_errors.append(f"{host.name} {key}: {r}")
                continue
            res.disks += 1
            found += [orphans.Found.from_reply(host.name, key, item)
                      for item in r.get("snapshots", []) if isinstance(item, dict)]
    return found


def plan(sf: sessionmaker[Session], settings: Settings, *, grace_s: float | None = None,
         now: dt.datetime | None = None, progress: Progress | None = None,
         dry_run: bool = True) -> SweepResult:
    """Steps 1 and 2: every listed snapshot with its verdict (nothing deleted)."""
    from cutpoint.api.services import capture

    grace = settings.orphan_grace_s if grace_s is None else grace_s
    res = SweepResult(dry_run=dry_run, grace_s=grace)
    say = progress or (lambda _f, _m: None)
    found = _list(sf, settings, res, say)
    with sf() as s:
        facts = orphans.load_facts(s, capture.txlog_for(settings.database_url),
                                   [f.owner for f in found if f.owner])
    at = now or utcnow()
    res.verdicts = [orphans.decide(f, facts, at, grace) for f in found]
    return res


def _audit(sf: sessionmaker[Session], actor: str, role: str | None, request_id: str,
           v: orphans.Verdict, status: int, outcome: str, error: str | None = None) -> None:
    from cutpoint.api.services import audit

    snap = v.snap
    with sf() as s:
        audit.record(s, actor=actor, role=role, method="DELETE",
                     path=f"agent:{snap.host}/{snap.disk}@{snap.name}", status=status,
                     request_id=request_id, remote=None,
                     detail={"what": "orphan_snapshot", "outcome": outcome, "snap_id": snap.id,
                             "owner": snap.owner, "created": snap.created,
                             "why": v.detail, **({"error": error[:500]} if error else {})})


def _delete(sf: sessionmaker[Session], settings: Settings, res: SweepResult, actor: str,
            role: str | None, request_id: str, progress: Progress) -> None:
    from cutpoint.api.services import agents

    by_host: dict[str, list[orphans.Verdict]] = {}
    for v in res.orphans:
        by_host.setdefault(v.snap.host, []).append(v)
    total, done = len(res.orphans), 0
    for host_name, items in by_host.items():
        with sf() as s:
            host = s.scalar(select(Host).where(Host.name == host_name))
            if host is not None:
                s.expunge(host)
        progress(0.5 + 0.5 * done / max(1, total),
                 f"deleting {len(items)} orphan(s) on {host_name}")
        if host is None:
            replies: list[Any] = [agents.AgentCallError(host_name, "host_gone",
                                                        "the host was removed")] * len(items)
        else:
            try:
                replies = agents.call_each(host, settings, [
                    ("snapshot.delete", {"disk": v.snap.disk, "name": v.snap.name,
                                         "id": v.snap.id, "owner": v.snap.owner})
                    for v in items])
            except agents.AgentCallError as exc:
                replies = [exc] * len(items)
        for v, r in zip(items, replies, strict=True):
            row = v.to_dict()
            if isinstance(r, agents.AgentCallError):
                row["error"] = str(r)
                if r.code == "NOT_OWNED":
                    res.refused.append(row)
                    _audit(sf, actor, role, request_id, v, 409, "refused", str(r))
                else:
                    res.failed.append(row)
                    _audit(sf, actor, role, request_id, v, 502, "failed", str(r))
                log.warning("event=orphan_not_deleted host=%s disk=%s name=%s id=%s owner=%s "
                            "error=%s", host_name, v.snap.disk, v.snap.name, v.snap.id,
                            v.snap.owner, r)
            elif r.get("deleted"):
                res.deleted.append(row)
                _audit(sf, actor, role, request_id, v, 200, "deleted")
                log.warning("event=orphan_deleted host=%s disk=%s name=%s id=%s owner=%s "
                            "why=%r", host_name, v.snap.disk, v.snap.name, v.snap.id,
                            v.snap.owner, v.detail)
            else:
                res.absent.append(row)
                _audit(sf, actor, role, request_id, v, 404, "absent")
            done += 1


def sweep(sf: sessionmaker[Session], settings: Settings, *, dry_run: bool = False,
          actor: str = "sweeper", role: str | None = None, request_id: str | None = None,
          grace_s: float | None = None, progress: Progress | None = None) -> SweepResult:
    """A whole run: list, decide, and (unless `dry_run`) delete the orphans."""
    say = progress or (lambda _f, _m: None)
    res = plan(sf, settings, grace_s=grace_s, progress=say, dry_run=dry_run)
    log.info("event=sweep_planned dry_run=%s hosts=%d disks=%d snapshots=%d orphans=%d "
             "unreachable=%d", dry_run, res.hosts, res.disks, len(res.verdicts),
             len(res.orphans), len(res.unreachable))
    if not dry_run and res.orphans:
        _delete(sf, settings, res, actor, role, request_id or str(uuid.uuid4()), say)
    say(1.0, f"{len(res.deleted)} deleted, {len(res.orphans)} orphan(s), "
             f"{len(res.verdicts) - len(res.orphans)} kept")
    return res
