"""Celery tasks that run on their own: the beat's ticks and sweeps (in-doubt
transactions, orphan member snapshots, retention, inventory), and what a
starting worker queues.  The shared machinery is `tasks.py`."""

from __future__ import annotations

from typing import Any

from celery.signals import worker_ready
from cutpoint.api.grouplock import GroupLock
from cutpoint.api.models import Group, Host, Job, utcnow
from cutpoint.api.tasks import (
    Ctx,
    JobFailed,
    Skip,
    _pull_inventory,
    cutpoint_task,
    get_settings,
    log,
)
from sqlalchemy import select


@cutpoint_task("resolve_in_doubt", job=False, max_retries=None)
def resolve_in_doubt(ctx: Ctx) -> dict[str, Any] | None:
    """Resolve every group's in-doubt txns, each under its group lock
    (services/indoubt.py).  Sent when a worker starts and by beat.  A group
    whose lock is busy, or whose txn may still be driven by a live worker,
    is looked at again shortly (a few times; beat's pass catches the rest)."""
    from cutpoint.api.services import indoubt

    out, later = {}, []
    for name in indoubt.groups_in_doubt(ctx.settings):
        with ctx.sf() as s:
            gid = s.scalar(select(Group.id).where(Group.name == name))
        if gid is None:  # the group is gone; its agents still need the decision
            out[name] = indoubt.resolve_group(ctx.sf, ctx.settings, name).to_dict()
            continue
        lock = GroupLock(ctx.redis, gid, ctx.settings.group_lock_ttl_s)
        if not lock.acquire():
            later.append(name)
            continue
        try:
            res = indoubt.resolve_group(lock.fence(ctx.sf), ctx.settings, name)
        finally:
            lock.release()
        out[name] = res.to_dict()
        if res.too_recent:
            later.append(name)
    if later and ctx.task.request.retries < 10:
        raise ctx.task.retry(countdown=max(1.0, ctx.settings.group_lock_ttl_s / 3))
    return {"groups": out, "later": later}


@worker_ready.connect
def _resolve_at_start(**_: Any) -> None:
    """A starting worker resolves what a dead one left in doubt, for every
    group, without waiting for the next snapshot of that group."""
    from cutpoint.api.services import queue

    try:
        queue.enqueue_sweep(get_settings(), "resolve_in_doubt", "worker-start")
    except queue.BrokerUnavailable:  # beat's periodic pass does it later
        log.exception("event=resolve_at_start_not_queued")
    # And what an abort or a crash left behind (older than the grace period).
    try:
        queue.enqueue_sweep(get_settings(), "orphan_sweep_tick", "worker-start")
    except queue.BrokerUnavailable:
        log.exception("event=orphan_sweep_at_start_not_queued")
    # And what a drill killed with its worker left at DR (tagged clones, VMs).
    try:
        queue.enqueue_sweep(get_settings(), "drill_sweep_tick", "worker-start")
    except queue.BrokerUnavailable:
        log.exception("event=drill_sweep_at_start_not_queued")


@cutpoint_task("drill_sweep_tick", job=False)
def drill_sweep_tick(ctx: Ctx) -> dict[str, Any] | None:
    """The sweep of drill leftovers by tag (services/drill_sweeper.py), sent by
    beat and at worker start; one at a time across workers."""
    from cutpoint.api.services import drill_sweeper

    lock = ctx.redis.lock("cutpoint:lock:drill-sweep", timeout=600, thread_local=False)
    if not lock.acquire(blocking=False):
        raise Skip("another drill sweep is running")
    try:
        return drill_sweeper.sweep(ctx.sf, ctx.settings)
    finally:
        lock.release()


@cutpoint_task("orphan_sweep_tick", job=False)
def orphan_sweep_tick(ctx: Ctx) -> dict[str, Any] | None:
    """The routine sweep of orphan member snapshots (services/sweeper.py),
    sent by beat and at worker start; one at a time across workers."""
    from cutpoint.api.services import sweeper

    lock = ctx.redis.lock("cutpoint:lock:orphan-sweep", timeout=600, thread_local=False)
    if not lock.acquire(blocking=False):
        raise Skip("another orphan sweep is running")
    try:
        res = sweeper.sweep(ctx.sf, ctx.settings, actor="sweeper",
                            request_id=f"orphan-sweep:{ctx.job_id or 'beat'}")
    finally:
        lock.release()
    out = res.to_dict()
    out.pop("verdicts")
    return out


@cutpoint_task("orphan_sweep")
def orphan_sweep(ctx: Ctx) -> dict[str, Any] | None:
    """An admin's sweep (POST /v1/orphans/sweep): the job shows progress and
    keeps the summary; every deletion is in the audit log."""
    from cutpoint.api.services import sweeper

    def progress(frac: float, message: str) -> None:
        with ctx.sf() as s:
            job = s.get(Job, ctx.job_id)
            if job is not None:
                job.progress, job.message = min(0.99, frac), message[:255]
                s.commit()

    with ctx.sf() as s:
        job = s.get(Job, ctx.job_id)
        assert job is not None
        actor = job.created_by or "admin"
        grace = (job.params or {}).get("grace_s")
    lock = ctx.redis.lock("cutpoint:lock:orphan-sweep", timeout=600, thread_local=False)
    if not lock.acquire(blocking=True, blocking_timeout=60):
        raise JobFailed("sweep_busy", "another orphan sweep is still running")
    try:
        res = sweeper.sweep(ctx.sf, ctx.settings, actor=actor, role="admin",
                            request_id=ctx.job_id, progress=progress,
                            grace_s=float(grace) if grace is not None else None)
    finally:
        lock.release()
    out = res.to_dict()
    out["verdicts"] = [v for v in out["verdicts"] if v["action"] == "delete"]
    if res.failed or res.unreachable or res.list_errors:
        failed = JobFailed("sweep_incomplete",
                           f"{len(res.failed)} deletion(s) failed, {len(res.unreachable)} "
                           f"host(s) unreachable, {len(res.list_errors)} disk(s) not listed")
        failed.result = out  # type: ignore[attr-defined]  what was done stays visible
        raise failed
    return out


@cutpoint_task("webhook_tick", job=False)
def webhook_tick(ctx: Ctx) -> dict[str, Any] | None:
    """Record `cert.expiring` for certificates newly within the warning
    window, then send the webhook deliveries that are due
    (services/webhook_delivery.py); one sender at a time, so no delivery
    goes out twice."""
    from cutpoint.api.services import webhook_delivery

    lock = ctx.redis.lock("cutpoint:lock:webhooks", timeout=600, thread_local=False)
    if not lock.acquire(blocking=False):
        raise Skip("another webhook sender is running")
    try:
        from cutpoint.api.services import webhooks

        with ctx.sf() as s:
            if webhooks.cert_expiring(s):
                s.commit()
        sent = webhook_delivery.deliver_due(ctx.sf)
    finally:
        lock.release()
    return {"delivered": len(sent.delivered), "retrying": len(sent.retrying),
            "failed": len(sent.failed)}


@cutpoint_task("history_prune_tick", job=False)
def history_prune_tick(ctx: Ctx) -> dict[str, Any] | None:
    """Delete finished jobs, their events and audit entries older than
    history_keep_days (services/history.py); sent by beat."""
    from cutpoint.api.services import history

    with ctx.sf() as s:
        return history.prune(s, ctx.settings.history_keep_days,
                             keep_drills=ctx.settings.drill_reports_kept).as_dict()


@cutpoint_task("drill_tick", job=False)
def drill_tick(ctx: Ctx) -> dict[str, Any] | None:
    """Ask for a drill of each group whose drill schedule is due
    (services/drill_schedule.py), as POST /v1/groups/{g}/drills would; a group
    that cannot have one now (no DR recovery point, a booter that cannot boot
    drills) is logged and stays overdue."""
    from cutpoint.api.errors import ApiError
    from cutpoint.api.services import drill_schedule, drills, queue

    asked, refused = [], {}
    with ctx.sf() as s:
        for g in drill_schedule.due(s):
            try:
                job = drills.request(s, g, "latest", drill_schedule.last_checks(s, g),
                                     drill_schedule.ACTOR, ctx.settings.booter,
                                     ctx.settings)
            except ApiError as exc:
                s.rollback()
                refused[g.name] = f"{exc.code}: {exc}"
                log.warning("event=drill_schedule group=%s result=refused code=%s why=%s",
                            g.name, exc.code, exc)
                continue
            queue.enqueue(s, ctx.settings, job)
            asked.append(g.name)
            log.info("event=drill_schedule group=%s result=asked job=%s", g.name, job.id)
    return {"asked": asked, "refused": refused}


@cutpoint_task("retention_tick", job=False)
def retention_tick(ctx: Ctx) -> dict[str, Any] | None:
    """Queue a retention job for each group that has something to delete
    and none queued or running (services/retention.py `groups_to_run`)."""
    from cutpoint.api.services import jobs, queue
    from cutpoint.api.services import retention as ret

    n = 0
    with ctx.sf() as s:
        for g in ret.groups_to_run(s, utcnow()):
            job = jobs.create(s, "retention", actor="scheduler", group_id=g.id,
                              params={"group_id": g.id})
            queue.enqueue(s, ctx.settings, job)
            n += 1
    return {"groups": n}


@cutpoint_task("inventory_tick", job=False)
def inventory_tick(ctx: Ctx) -> dict[str, Any] | None:
    """Refresh every host's inventory and reachability (no job rows: it is routine)."""
    from cutpoint.api.services import agents

    ok = bad = 0
    with ctx.sf() as s:
        for host in list(s.scalars(select(Host))):
            try:
                _pull_inventory(s, host, ctx.settings, ctx.redis)
            except agents.AgentCallError:
                bad += 1
                continue
            ok += 1
    return {"reachable": ok, "unreachable": bad}


@cutpoint_task("inventory_watch", job=False)
def inventory_watch(ctx: Ctx) -> dict[str, Any] | None:
    """Every agent's inventory, applied where it changed (services/inventory_watch.py)."""
    from cutpoint.api.services import inventory_watch as watch

    with watch.inventory_lock(ctx.redis, wait_s=None) as got:
        if not got:
            raise Skip("another inventory writer is running")
        return watch.watch_round(ctx.sf, ctx.settings)
