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
earlier instead of missing.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from cutpoint.api.models import Group, GroupSnapshot, RpoMiss, SnapState, utcnow
from cutpoint.api.schemas.rpo import RpoMissPublic, RpoStatus
from cutpoint.api.services import drill_schedule, webhooks
from sqlalchemy import func, select
from sqlalchemy.orm import Session

DEFAULT_DURATION_S = 2.0
HISTORY = 5


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

    @property
    def compliant(self) -> bool | None:
        if self.rpo_seconds is None:
            return None
        return self.achieved_s is not None and self.achieved_s <= self.rpo_seconds

    def due(self, now: dt.datetime) -> bool:
        return self.due_at is not None and now >= self.due_at and self.in_flight is None


def assess(session: Session, g: Group, now: dt.datetime, margin_s: float) -> Assessment:
    p = g.policy
    rp = select(GroupSnapshot.cut_at).where(GroupSnapshot.group_id == g.id,
                                            GroupSnapshot.state == SnapState.committed)
    lag = 0.0
    if p.replication_target_id is not None:
        rp = rp.where(GroupSnapshot.dr_verified_at.is_not(None))
        rows = session.execute(
            select(GroupSnapshot.cut_at, GroupSnapshot.dr_verified_at)
            .where(GroupSnapshot.group_id == g.id, GroupSnapshot.dr_verified_at.is_not(None))
            .order_by(GroupSnapshot.id.desc()).limit(HISTORY)).all()
        lags = [(v - c).total_seconds() for c, v in rows if c and v]
        lag = sum(lags) / len(lags) if lags else 0.0
    newest = session.scalar(rp.order_by(GroupSnapshot.cut_at.desc()).limit(1))
    # Lead time = request to cut (queueing, worker pickup, PREPARE), the
    # longest of the last few: under load the queue wait dominates the
    # protocol itself, and starting late is what makes a miss.
    leads = [(c - r).total_seconds() for r, c in session.execute(
        select(GroupSnapshot.requested_at, GroupSnapshot.cut_at).where(
            GroupSnapshot.group_id == g.id, GroupSnapshot.state == SnapState.committed,
            GroupSnapshot.cut_at.is_not(None))
        .order_by(GroupSnapshot.id.desc()).limit(HISTORY)).all() if c is not None]
    duration = max(leads) if leads else DEFAULT_DURATION_S
    inflight = session.scalar(select(GroupSnapshot).where(
        GroupSnapshot.inflight_group_id == g.id))
    achieved = (now - newest).total_seconds() if newest else None
    due_at = None
    if p.rpo_seconds is not None and g.enabled:
        base = newest or g.created_at
        due_at = base + dt.timedelta(seconds=p.rpo_seconds - duration - lag - margin_s)
        if newest is None:
            due_at = min(due_at, now)
    return Assessment(g.id, p.rpo_seconds, newest, achieved, duration, lag, due_at, inflight)


def overdue_s(a: Assessment, g: Group, now: dt.datetime) -> float:
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
