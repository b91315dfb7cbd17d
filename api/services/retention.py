"""Retention: which committed snapshots of a group may go.

A committed snapshot is kept when any of these holds:
- it is among the `keep_last` newest;
- it is younger than `keep_within` seconds;
- it is the newest recovery point, or the newest DR recovery point
  (invariant 6);
- it is a replication base (`replication_base`; invariant 6);
- a replication is copying it now, or copying from it (its base) now,
  whatever the flag says (`replication.in_flight`; invariant 6).
Everything else is deleted through the agents (`snapshot.delete`, which is
idempotent: an absent snapshot is ok).  The row goes committed → deleting →
deleted, so a crash mid-way is finished by the next run.

A run holds the group lock, so no capture of the group starts while it
deletes.  Each delete is an RBD snapshot removal per member (0.5-0.7 s
per group snapshot of 10 disks at both sites, `cutpoint-lab bench dr-rpo`
on the lab's tuned mon),
and at a short RPO a run has many to delete: in a lab run at a 5 s RPO,
runs of 10-28 s held the group's captures back, and the DR RPO peaked at
34 s.  So a run stops after a group snapshot when a capture of the group
waits (`capture_waiting`; `stop` of `apply`), having deleted at least one,
and the task comes back for the rest once the capture has run.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from cutpoint.api.models import Group, GroupSnapshot, SnapState
from cutpoint.api.services.replication import in_flight
from sqlalchemy import select
from sqlalchemy.orm import Session


def plan(session: Session, g: Group, now: dt.datetime) -> list[GroupSnapshot]:
    """The snapshots to delete now, oldest first (no side effects)."""
    p = g.policy
    snaps = list(session.scalars(
        select(GroupSnapshot).where(GroupSnapshot.group_id == g.id,
                                    GroupSnapshot.state == SnapState.committed)
        .order_by(GroupSnapshot.cut_at.desc(), GroupSnapshot.id.desc())))
    if not snaps:
        return []
    keep: set[int] = {s.id for s in snaps[: p.keep_last]}
    keep.add(snaps[0].id)  # the newest recovery point
    dr = [s for s in snaps if s.dr_verified_at is not None]
    if dr:
        keep.add(dr[0].id)  # the newest DR recovery point
    keep.update(s.id for s in snaps if s.replication_base)
    sources, bases = in_flight(session, g.id)
    keep.update(sources | bases)
    if p.keep_within_seconds > 0:
        cutoff = now - dt.timedelta(seconds=p.keep_within_seconds)
        keep.update(s.id for s in snaps if s.cut_at is not None and s.cut_at >= cutoff)
    doomed = [s for s in snaps if s.id not in keep]
    doomed.reverse()
    return doomed


# A retention job of the group queued or running, made less than this ago,
# is the group's retention: the tick queues no other.  Older, it is taken
# for lost (its worker killed before it could record an end).
RUNNING_JOB_FRESH_S = 300.0


def groups_to_run(session: Session, now: dt.datetime) -> list[Group]:
    """The groups the retention tick queues a job for: something to delete
    (at the primary or at DR), and no retention job of theirs queued or
    running already.  A run that gives way to captures comes back by
    itself (tasks.retention), and one more job per tick for the same group
    only made them take the group lock in turn (four at once were seen at
    a 5 s RPO)."""
    from cutpoint.api.models import Job, JobState
    from cutpoint.api.services import replication

    busy = set(session.scalars(select(Job.group_id).where(
        Job.kind == "retention", Job.state.in_([JobState.queued, JobState.running]),
        Job.created_at >= now - dt.timedelta(seconds=RUNNING_JOB_FRESH_S))))
    return [g for g in session.scalars(select(Group))
            if g.id not in busy
            and (plan(session, g, now) or pending_deletes(session, g)
                 or replication.dr_plan(session, g, now))]


def capture_waiting(session: Session, group_id: int) -> bool:
    """A capture of the group is requested and waits for the group lock."""
    return session.scalar(select(GroupSnapshot.id).where(
        GroupSnapshot.inflight_group_id == group_id,
        GroupSnapshot.state == SnapState.pending).limit(1)) is not None


def pending_deletes(session: Session, g: Group) -> list[GroupSnapshot]:
    return list(session.scalars(select(GroupSnapshot).where(
        GroupSnapshot.group_id == g.id, GroupSnapshot.state == SnapState.deleting)))


def apply(sf: Any, settings: Any, group_id: int,
          stop: Callable[[Session], bool] | None = None) -> dict[str, Any]:
    """Delete what `plan` selects (and finish interrupted deletes) via the agents.

    A member snapshot whose host cannot be reached stays `deleting`; the
    next run retries it.  Commits after each group snapshot.  After each
    one, `stop(session)` true ends the run early: the result then says
    `yielded`, and the snapshots left stay `deleting` for the next run.
    """
    from cutpoint.api.models import Host, utcnow
    from cutpoint.api.services import agents

    deleted, failed = 0, []
    with sf() as s:
        g = s.get(Group, group_id)
        if g is None:
            return {"deleted": 0}
        for snap in plan(s, g, utcnow()):
            snap.state = SnapState.deleting
        s.commit()
        for i, snap in enumerate(pending_deletes(s, g)):
            if i and stop is not None and stop(s):
                return {"deleted": deleted, "yielded": True,
                        **({"failed": failed} if failed else {})}
            by_host: dict[str, list[Any]] = {}
            for m in snap.members:
                if m.state != "deleted":
                    by_host.setdefault(m.host, []).append(m)
            hosts = {h: s.scalar(select(Host).where(Host.name == h)) for h in by_host}
            # End the read before the agents' calls: on SQLite an open
            # transaction holds the database's write lock, so a run that
            # kept one across its deletes (0.5 s and more each) held back
            # every capture and the scheduler's own writes (sessions keep
            # their objects loaded after a commit).
            s.commit()
            ok = True
            for host_name, members in by_host.items():
                host = hosts[host_name]
                if host is None:
                    ok = False
                    failed.append(f"{snap.txn}: host {host_name} is gone")
                    continue
                try:
                    agents.call(host, settings, *[("snapshot.delete",
                                                   {"disk": m.disk, "name": m.name})
                                                  for m in members])
                except agents.AgentCallError as exc:
                    ok = False
                    failed.append(f"{snap.txn}: {exc}")
                    continue
                for m in members:
                    m.state = "deleted"
            if ok:
                snap.state = SnapState.deleted
                deleted += 1
            s.commit()
    out: dict[str, Any] = {"deleted": deleted}
    if failed:
        out["failed"] = failed
    return out
