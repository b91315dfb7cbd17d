"""The RPO scheduler: one tick (Celery beat, every `scheduler_tick_s`).

For each group with an `rpo_seconds`:
1. resend the job of an in-flight snapshot nobody is working on (its
   worker died and the lock expired; the job is idempotent by txn);
2. record an RPO miss if the group is out of compliance (services/rpo.py);
3. enqueue a group snapshot when it is due (services/rpo.py `due_at`).
A failure on one group is logged and does not stop the tick for the others.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import redis
from cutpoint.api.config import Settings
from cutpoint.api.errors import Conflict
from cutpoint.api.models import Group, Policy, utcnow
from cutpoint.api.services import rpo, snapshots
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

log = logging.getLogger("cutpoint.scheduler")


def tick(sf: sessionmaker[Session], settings: Settings, r: redis.Redis,
         send: Callable[[str, str, Settings], None]) -> dict[str, Any]:
    now = utcnow()
    stats = {"groups": 0, "enqueued": 0, "misses": 0, "resent": 0, "errors": 0}
    with sf() as s:
        ids = list(s.scalars(select(Group.id).join(Policy, Policy.group_id == Group.id)
                             .where(Policy.rpo_seconds.is_not(None))))
    for gid in ids:
        stats["groups"] += 1
        try:
            with sf() as s:
                g = s.get(Group, gid)
                if g is None:
                    continue
                a = rpo.assess(s, g, now, settings.scheduler_margin_s)
                if a.in_flight is not None:
                    snap = a.in_flight
                    started = snap.started_at or snap.requested_at
                    stale = (now - started).total_seconds() > settings.group_lock_ttl_s
                    locked = bool(r.exists(f"cutpoint:lock:group:{gid}"))
                    if stale and not locked and snap.job_id and r.set(
                            f"cutpoint:resent:{snap.id}", "1", nx=True,
                            ex=max(1, int(settings.group_lock_ttl_s))):
                        log.warning("group=%s snapshot=%s job=%s event=resend_orphan",
                                    g.name, snap.id, snap.job_id)
                        send("group_snapshot", snap.job_id, settings)
                        stats["resent"] += 1
                if rpo.maybe_record_miss(s, g, a, now) is not None:
                    stats["misses"] += 1
                    log.warning("group=%s event=rpo_miss achieved_s=%s", g.name, a.achieved_s)
                if g.enabled and a.due(now):
                    try:
                        job = snapshots.request(s, g, trigger="schedule", actor="scheduler")
                    except Conflict:
                        continue  # empty group, or a snapshot slipped in meanwhile
                    try:
                        send("group_snapshot", job.id, settings)
                    except Exception as exc:
                        snapshots.fail_unqueued(s, job, f"{type(exc).__name__}: {exc}")
                        raise
                    stats["enqueued"] += 1
        except Exception:
            stats["errors"] += 1
            log.exception("group=%s event=tick_failed", gid)
    return stats
