"""Achieved RPO, when the next capture is due, and RPO misses.

Achieved RPO (DESIGN.md): now minus the capture time (`cut_at`) of the newest
recovery point.  With a replication target that is the newest *DR* recovery
point (`dr_verified_at` set); without one, the newest committed snapshot,
and the replication lag is zero.

A capture started at t yields a recovery point at about t + duration + lag.
To keep the achieved RPO under `rpo_seconds`, the next capture must start by

    due_at = newest_cut + rpo_seconds - (duration + lag + margin)

where margin is the caller's head start (Settings.capture_head_start_s:
the configured margin plus one scheduler tick).

where duration is the longest request-to-cut time of the last few captures
(queue wait + worker pickup + PREPARE), so a busy worker starts captures
earlier instead of missing, and lag, for the same reason, the longest
cut-to-verified-at-DR time of the last few DR points (`lag_s`, shown as the
replication lag, is their mean).  With the mean, a lab run at a 5 s RPO
kept the DR RPO under 5 s at p50 and not at p99: the points whose copy
took longer than the mean arrived late.

A group that replicates is not due while one of its copies waits for the
copy before it (`replication_waiting`): every committed snapshot is
replicated, one at a time per group (invariant 7, tasks_dr.replicate), so a
capture taken then only lengthens the queue.  Without that hold a copy
slower than the capture interval (the first, full one; a slow DR site)
made every tick capture, each capture queued one more copy, and the queue
never drained: in a lab run at a 5 s RPO the DR point lagged its cut by
39 s after 8 minutes while points were cut every 1.7 s.  A waiting copy
queued more than REPLICATION_HOLD_S ago no longer holds captures back (a
lost message, a copy of many minutes): then one capture goes through per
that time.

A group's first capture (it has no recovery point yet; its RPO counts from
its creation) is due at `created_at + offset`, the offset a deterministic
share of that same window (`first_capture_offset_s`): groups created
together, or all groups of a fresh installation, are captured spread over
their RPO instead of as one burst that queues behind one worker and makes
the last of them miss.  `next_due_at` in the RPO status shows it.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, NamedTuple

from cutpoint.api.models import (
    Group,
    GroupSnapshot,
    Job,
    JobState,
    Policy,
    RpoMiss,
    SnapState,
    as_utc,
    utcnow,
)
from cutpoint.api.schemas.rpo import RpoMissPublic, RpoStatus
from cutpoint.api.services import drill_schedule, webhooks
from sqlalchemy import func, select
from sqlalchemy.orm import Session

DEFAULT_DURATION_S = 2.0
HISTORY = 5
# How long a queued copy holds the group's next capture back (see above):
# longer than the copy of a 1 s-RPO group's point on a slow link, short
# enough that a lost replicate message costs a few captures, not all.
REPLICATION_HOLD_S = 30.0
# The golden ratio's fractional part: the step of first_capture_offset_s.
SPREAD_STEP = 0.6180339887498949


@dataclass
class Assessment:
    group_id: int
    rpo_seconds: int | None
    newest_cut: dt.datetime | None
    achieved_s: float | None
    duration_s: float
    lag_s: float
    due_at: dt.datetime | None
    in_flight: GroupSnapshot | None
    # The id of a copy of this group waiting for the copy before it, queued
    # less than REPLICATION_HOLD_S ago: no capture while there is one.
    replication_waiting: str | None = None

    @property
    def compliant(self) -> bool | None:
        if self.rpo_seconds is None:
            return None
        return self.achieved_s is not None and self.achieved_s <= self.rpo_seconds

    def due(self, now: dt.datetime) -> bool:
        return (self.due_at is not None and now >= self.due_at and self.in_flight is None
                and self.replication_waiting is None)


class Sched(NamedTuple):
    """What the schedule of one group depends on, read without the ORM (the
    scheduler reads it for every group at every tick)."""

    id: int
    enabled: bool
    created_at: dt.datetime
    rpo_seconds: int | None
    replication_target_id: int | None

    @classmethod
    def of(cls, g: Group) -> Sched:
        p = g.policy
        return cls(g.id, g.enabled, g.created_at, p.rpo_seconds, p.replication_target_id)


def scheduled(session: Session, ids: list[int] | None = None) -> list[Sched]:
    """Every group with an RPO (or those of `ids`), in one query."""
    q = (select(Group.id, Group.enabled, Group.created_at, Policy.rpo_seconds,
                Policy.replication_target_id)
         .join(Policy, Policy.group_id == Group.id).where(Policy.rpo_seconds.is_not(None)))
    if ids is not None:
        q = q.where(Group.id.in_(ids))
    return [Sched(*row) for row in session.execute(q)]


def assess(session: Session, g: Group, now: dt.datetime, margin_s: float) -> Assessment:
    return assess_many(session, [Sched.of(g)], now, margin_s)[g.id]


def first_capture_offset_s(g: Group | Sched, window_s: float) -> float:
    """When, within `window_s` after the group's creation, its first capture
    is due: a deterministic share of the window, the same at every tick and
    in every process (a Weyl sequence over the group id: consecutive ids
    land far apart, so N groups created together are spread evenly over
    the window rather than all due at once)."""
    return max(0.0, window_s) * ((g.id * SPREAD_STEP) % 1.0)


def _recent(session: Session, cols: tuple[Any, ...], where: Any, ids: list[int]) \
        -> dict[int, list[Any]]:
    """Per group, the newest HISTORY rows (by id) of group_snapshots matching
    `where`, as tuples of `cols`: one query for every group."""
    rn = func.row_number().over(partition_by=GroupSnapshot.group_id,
                                order_by=GroupSnapshot.id.desc()).label("rn")
    sub = (select(GroupSnapshot.group_id, *cols, rn)
           .where(GroupSnapshot.group_id.in_(ids), where).subquery())
    out: dict[int, list[Any]] = {}
    for row in session.execute(select(sub).where(sub.c.rn <= HISTORY)):
        out.setdefault(row[0], []).append(tuple(row[1:-1]))
    return out


def assess_many(session: Session, gs: list[Sched], now: dt.datetime, margin_s: float) \
        -> dict[int, Assessment]:
    """`assess` for many groups in a fixed number of queries (the
    scheduler's tick looks at every group each second; one query per group
    and fact cost about 0.7 ms of CPU per group, so 1000 groups took most of
    a core)."""
    ids = [g.id for g in gs]
    if not ids:
        return {}
    committed = GroupSnapshot.state == SnapState.committed
    newest = dict(session.execute(
        select(GroupSnapshot.group_id, func.max(GroupSnapshot.cut_at))
        .where(GroupSnapshot.group_id.in_(ids), committed)
        .group_by(GroupSnapshot.group_id)).all())
    dr_ids = [g.id for g in gs if g.replication_target_id is not None]
    newest_dr: dict[int, dt.datetime | None] = {}
    waiting: dict[int, str] = {}
    lags: dict[int, list[Any]] = {}
    if dr_ids:
        verified = GroupSnapshot.dr_verified_at.is_not(None)
        newest_dr = dict(session.execute(
            select(GroupSnapshot.group_id, func.max(GroupSnapshot.cut_at))
            .where(GroupSnapshot.group_id.in_(dr_ids), committed, verified)
            .group_by(GroupSnapshot.group_id)).all())
        lags = _recent(session, (GroupSnapshot.cut_at, GroupSnapshot.dr_verified_at),
                       verified, dr_ids)
        hold_from = now - dt.timedelta(seconds=REPLICATION_HOLD_S)
        for gid, job_id in session.execute(
                select(Job.group_id, func.min(Job.id))
                .where(Job.kind == "replicate", Job.state == JobState.queued,
                       Job.group_id.in_(dr_ids), Job.created_at >= hold_from)
                .group_by(Job.group_id)):
            waiting[gid] = job_id
    # Lead time = request to cut (queueing, worker pickup, PREPARE), the
    # longest of the last few: under load the queue wait dominates the
    # protocol itself, and starting late is what makes a miss.
    leads = _recent(session, (GroupSnapshot.requested_at, GroupSnapshot.cut_at),
                    committed & GroupSnapshot.cut_at.is_not(None), ids)
    inflight = {s.group_id: s for s in session.scalars(select(GroupSnapshot).where(
        GroupSnapshot.inflight_group_id.in_(ids)))}
    out = {}
    for g in gs:
        lag = lag_max = 0.0
        if g.replication_target_id is not None:
            nc = newest_dr.get(g.id)
            ls = [(as_utc(v) - as_utc(c)).total_seconds() for c, v in lags.get(g.id, [])
                  if c and v]
            lag = sum(ls) / len(ls) if ls else 0.0
            lag_max = max(ls, default=0.0)
        else:
            nc = newest.get(g.id)
        nc = as_utc(nc)
        ld = [(as_utc(c) - as_utc(r)).total_seconds() for r, c in leads.get(g.id, [])
              if c is not None]
        duration = max(ld) if ld else DEFAULT_DURATION_S
        achieved = (now - nc).total_seconds() if nc else None
        due_at = None
        if g.rpo_seconds is not None and g.enabled:
            window = g.rpo_seconds - duration - lag_max - margin_s
            if nc is not None:
                due_at = nc + dt.timedelta(seconds=window)
            else:
                # The first capture: spread over the window the RPO allows
                # from the group's creation, never later than that window's
                # end (the RPO is counted from creation, `overdue_s`).  N
                # groups created together are then not N captures queued
                # at once, the last of which miss.
                due_at = as_utc(g.created_at) + dt.timedelta(
                    seconds=first_capture_offset_s(g, window))
        out[g.id] = Assessment(g.id, g.rpo_seconds, nc, achieved, duration, lag, due_at,
                               inflight.get(g.id), waiting.get(g.id))
    return out


def overdue_s(a: Assessment, g: Group | Sched, now: dt.datetime) -> float:
    """Seconds the group has been out of compliance (0 when compliant)."""
    if a.rpo_seconds is None:
        return 0.0
    base = a.newest_cut or g.created_at
    return max(0.0, (now - base).total_seconds() - a.rpo_seconds)


def miss_reason(session: Session, g: Group, a: Assessment) -> tuple[str, str]:
    """Why the group is out of compliance: the newest failure since the newest RP."""
    stmt = select(GroupSnapshot).where(
        GroupSnapshot.group_id == g.id,
        GroupSnapshot.state.in_([SnapState.failed, SnapState.aborted, SnapState.aborting]))
    if a.newest_cut is not None:
        stmt = stmt.where(GroupSnapshot.requested_at >= a.newest_cut)
    failed = session.scalar(stmt.order_by(GroupSnapshot.id.desc()).limit(1))
    if failed is not None:
        code = (failed.error_code or failed.state.value).lower()
        return f"snapshot_{failed.state.value}:{code}"[:64], (failed.error or "")[:2000]
    from cutpoint.api.models import GroupDisk

    if session.scalar(select(GroupDisk.disk_id).where(GroupDisk.group_id == g.id).limit(1)) \
            is None:
        return "group_empty", "the group has no disks to snapshot"
    if a.in_flight is not None:
        return ("snapshot_in_flight",
                f"snapshot {a.in_flight.id} ({a.in_flight.state.value}) has not finished")
    if a.replication_waiting is not None:
        return ("replication_behind",
                (f"replicate job {a.replication_waiting} waits for the group's copy before"
                 " it; no capture until it runs"))
    if not g.enabled:
        return "group_disabled", "the group is disabled"
    return "scheduler_late", "no capture finished in time"


def maybe_record_miss(session: Session, g: Group, a: Assessment, now: dt.datetime) -> RpoMiss | None:
    """Record a miss when the group is out of compliance, at most once per RPO period.

    Commits.  Repeated misses while an outage lasts stay visible (one row per
    period) without flooding the table every tick.
    """
    if a.rpo_seconds is None or overdue_s(a, g, now) <= 0:
        return None
    last = session.scalar(select(func.max(RpoMiss.at)).where(RpoMiss.group_id == g.id))
    if last is not None and (now - last).total_seconds() < a.rpo_seconds:
        return None
    reason, detail = miss_reason(session, g, a)
    base = a.newest_cut or g.created_at
    miss = RpoMiss(group_id=g.id, at=now, reason=reason, detail=detail,
                   achieved_rpo_s=(now - base).total_seconds(), rpo_seconds=a.rpo_seconds)
    session.add(miss)
    webhooks.emit(session, "rpo.breached", {
        "group": g.name, "reason": reason, "detail": detail,
        "achieved_rpo_s": round(miss.achieved_rpo_s or 0.0, 3), "rpo_s": a.rpo_seconds})
    session.commit()
    return miss


def note_recovery(session: Session, g: Group, snap: GroupSnapshot) -> bool:
    """A new recovery point `snap` (committed, not yet flushed as such):
    if a miss was recorded since the group's previous recovery point, the
    group is back within its RPO; emit `rpo.recovered` (no commit: it goes
    with the caller's).  True when it did."""
    prev = session.scalar(select(func.max(GroupSnapshot.cut_at)).where(
        GroupSnapshot.group_id == g.id, GroupSnapshot.state == SnapState.committed,
        GroupSnapshot.id != snap.id))
    stmt = select(func.max(RpoMiss.at)).where(RpoMiss.group_id == g.id)
    if prev is not None:
        stmt = stmt.where(RpoMiss.at > prev)
    last_miss = session.scalar(stmt)
    if last_miss is None:
        return False
    webhooks.emit(session, "rpo.recovered", {
        "group": g.name, "recovery_point": snap.txn,
        "cut_at": snap.cut_at.isoformat() if snap.cut_at else None,
        "last_miss_at": last_miss.isoformat()})
    return True


def miss_public(m: RpoMiss, group: str) -> RpoMissPublic:
    return RpoMissPublic(id=m.id, group=group, at=m.at, reason=m.reason, detail=m.detail,
                         achieved_rpo_s=m.achieved_rpo_s, rpo_seconds=m.rpo_seconds,
                         snapshot_id=m.snapshot_id)


def status(session: Session, g: Group, margin_s: float, now: dt.datetime | None = None) \
        -> RpoStatus:
    now = now or utcnow()
    a = assess(session, g, now, margin_s)
    n = session.scalar(select(func.count()).select_from(RpoMiss).where(
        RpoMiss.group_id == g.id)) or 0
    last = session.scalar(select(RpoMiss).where(RpoMiss.group_id == g.id)
                          .order_by(RpoMiss.id.desc()).limit(1))
    return RpoStatus(group=g.name, rpo_seconds=a.rpo_seconds,
                     achieved_rpo_s=round(a.achieved_s, 3) if a.achieved_s is not None else None,
                     compliant=a.compliant, newest_recovery_point=a.newest_cut,
                     next_due_at=a.due_at, replication_lag_s=a.lag_s,
                     in_flight=a.in_flight is not None, misses=int(n),
                     last_miss=miss_public(last, g.name) if last else None,
                     drill=drill_schedule.status(session, g, now))
