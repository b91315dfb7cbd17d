"""The RPO scheduler: one tick (Celery beat, every `scheduler_tick_s`).

1. for every group, scheduled or not: re-send the job of an in-flight
   snapshot nobody is working on (its worker died and the lock expired;
   the job is idempotent by txn);
then for each group with an `rpo_seconds`:
2. record an RPO miss if the group is out of compliance (services/rpo.py);
3. enqueue a group snapshot when it is due (services/rpo.py `due_at`).
A failure on one group is logged and does not stop the tick for the others.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

import redis
from cutpoint.api.config import Settings
from cutpoint.api.errors import Conflict
from cutpoint.api.models import Group, GroupSnapshot, Job, Policy, utcnow
from cutpoint.api.services import queue, rpo, snapshots
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

log = logging.getLogger("cutpoint.scheduler")


def tick(sf: sessionmaker[Session], settings: Settings, r: redis.Redis,
         read_sf: sessionmaker[Session] | None = None) -> dict[str, Any]:
    now = utcnow()
    stats = {"groups": 0, "enqueued": 0, "misses": 0, "resent": 0, "errors": 0}
    try:
        stats["resent"] = resend_orphans(read_sf or sf, settings, r, now)
    except Exception:
        stats["errors"] += 1
        log.exception("event=orphan_scan_failed")
    with sf() as s:
        ids = list(s.scalars(select(Group.id).join(Policy, Policy.group_id == Group.id)
                             .where(Policy.rpo_seconds.is_not(None))))
    rsf = read_sf or sf
    for gid in ids:
        stats["groups"] += 1
        try:
            # Assess in a read transaction; take the write lock only for the
            # few groups that need a miss recorded or a capture started.
            with rsf() as s:
                g = s.get(Group, gid)
                if g is None:
                    continue
                a = rpo.assess(s, g, now, settings.capture_head_start_s)
                act = (g.enabled and a.due(now)) or (
                    a.rpo_seconds is not None and rpo.overdue_s(a, g, now) > 0)
            if not act:
                continue
            with sf() as s:
                g = s.get(Group, gid)
                if g is None:
                    continue
                a = rpo.assess(s, g, now, settings.capture_head_start_s)
                if rpo.maybe_record_miss(s, g, a, now) is not None:
                    stats["misses"] += 1
                    log.warning("group=%s event=rpo_miss achieved_s=%s", g.name, a.achieved_s)
                if g.enabled and a.due(now):
                    try:
                        job = snapshots.request(s, g, trigger="schedule", actor="scheduler")
                    except Conflict:
                        continue  # empty group, or a snapshot slipped in meanwhile
                    queue.enqueue(s, settings, job)
                    stats["enqueued"] += 1
        except Exception:
            stats["errors"] += 1
            log.exception("group=%s event=tick_failed", gid)
    return stats


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
