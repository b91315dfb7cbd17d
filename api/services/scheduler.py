"""The RPO scheduler: one tick (Celery beat, every `scheduler_tick_s`).

1. for every group, scheduled or not: re-send the job of an in-flight
   snapshot nobody is working on (its worker died and the lock expired;
   the job is idempotent by txn);
then for each group with an `rpo_seconds`, all assessed in one read
transaction (`rpo.assess_many`):
2. record an RPO miss if the group is out of compliance (services/rpo.py);
3. request a group snapshot of every group that is due (services/rpo.py
   `due_at`), all in one write transaction, then queue the jobs.
A failure on one group is logged and does not stop the tick for the others.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

import redis
from cutpoint.api.config import Settings
from cutpoint.api.models import Group, GroupSnapshot, Job, utcnow
from cutpoint.api.services import queue, rpo, snapshots
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

log = logging.getLogger("cutpoint.scheduler")


def tick(sf: sessionmaker[Session], settings: Settings, r: redis.Redis,
         read_sf: sessionmaker[Session] | None = None,
         now: dt.datetime | None = None) -> dict[str, Any]:
    now = now or utcnow()
    margin = settings.capture_head_start_s
    stats = {"groups": 0, "enqueued": 0, "misses": 0, "resent": 0, "errors": 0}
    try:
        stats["resent"] = resend_orphans(read_sf or sf, settings, r, now)
    except Exception:
        stats["errors"] += 1
        log.exception("event=orphan_scan_failed")
    # Assess every scheduled group in one read transaction and a fixed
    # number of queries (rpo.assess_many); take the write lock only for the
    # few groups that need a miss recorded or a capture started.
    with (read_sf or sf)() as s:
        gs = rpo.scheduled(s)
        stats["groups"] = len(gs)
        found = rpo.assess_many(s, gs, now, margin)
        overdue = [g.id for g in gs if rpo.overdue_s(found[g.id], g, now) > 0]
        due = [g.id for g in gs if g.enabled and found[g.id].due(now)]
    for gid in overdue:
        try:
            with sf() as s:
                g = s.get(Group, gid)
                if g is None:
                    continue
                a = rpo.assess(s, g, now, margin)
                if rpo.maybe_record_miss(s, g, a, now) is not None:
                    stats["misses"] += 1
                    log.warning("group=%s event=rpo_miss achieved_s=%s", g.name, a.achieved_s)
        except Exception:
            stats["errors"] += 1
            log.exception("group=%s event=tick_failed", gid)
    if due:
        try:
            stats["enqueued"], errors = _request_due(sf, settings, due, now, margin)
            stats["errors"] += errors
        except Exception:
            stats["errors"] += 1
            log.exception("event=tick_failed groups=%d", len(due))
    return stats


def _request_due(sf: sessionmaker[Session], settings: Settings, ids: list[int],
                 now: dt.datetime, margin: float) -> tuple[int, int]:
    """Request a capture of each group in `ids` that is still due, in one
    write transaction (one commit for all, not one per group), then queue
    the jobs.  Returns (queued, errors)."""
    with sf() as s:
        gs = rpo.scheduled(s, ids)
        found = rpo.assess_many(s, gs, now, margin)  # again, under the write lock
        jobs = snapshots.request_many(
            s, [g.id for g in gs if g.enabled and found[g.id].due(now)],
            trigger="schedule", actor="scheduler")
        queued = errors = 0
        for job in jobs:
            try:
                queue.enqueue(s, settings, job)
                queued += 1
            except queue.BrokerUnavailable:
                errors += 1
                log.exception("group_id=%s job=%s event=tick_failed", job.group_id, job.id)
    return queued, errors


def resend_orphans(sf: sessionmaker[Session], settings: Settings, r: redis.Redis,
                   now: dt.datetime) -> int:
    """Re-send the job of every in-flight snapshot nobody is working on.

    In flight for longer than the lock TTL with the group lock free means its
    worker died (or its message was lost).  The job is idempotent by txn, so
    a duplicate delivery is harmless; a Redis marker limits re-sends to one
    per TTL.  Every group counts here, scheduled or not.
    """
    n = 0
    with sf() as s:
        for snap in s.scalars(select(GroupSnapshot).where(
                GroupSnapshot.inflight_group_id.is_not(None))).all():
            started = snap.started_at or snap.requested_at
            if (now - started).total_seconds() <= settings.group_lock_ttl_s or not snap.job_id:
                continue
            if r.exists(f"cutpoint:lock:group:{snap.group_id}"):
                continue
            if r.set(f"cutpoint:resent:{snap.id}", "1", nx=True,
                     ex=max(1, int(settings.group_lock_ttl_s))):
                log.warning("group_id=%s snapshot=%s job=%s event=resend_orphan",
                            snap.group_id, snap.id, snap.job_id)
                job = s.get(Job, snap.job_id)
                if job is not None:
                    queue.enqueue(s, settings, job)
                    n += 1
    return n
