"""Celery tasks of DR: replication, drills, failover and restore.  The shared
machinery is `tasks.py`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from cutpoint.api import jobclaim
from cutpoint.api.grouplock import GroupLock, retry_wait_s
from cutpoint.api.models import GroupSnapshot, Job, JobState
from cutpoint.api.tasks import (
    Ctx,
    JobFailed,
    _open_job,
    _run_job,
    _snapshot_of_job,
    cutpoint_task,
)
from sqlalchemy import select

log = logging.getLogger("cutpoint.tasks")


@cutpoint_task("replicate", job=False, max_retries=None)
def replicate(ctx: Ctx) -> dict[str, Any] | None:
    """Copy every member disk of the job's group snapshot to the group's DR site.

    Not under the group lock: replication runs while later snapshots (and
    drills) of the group go on.  One replication per group at a time, under
    the group's *replicate* lock (Redis, lease refreshed while the copy
    runs, so a killed worker frees the group within the TTL): two copies
    at once would race on the same DR images, and the first to finish would
    move `replication_base` away from the base the other still copies from.
    A second job waits rather than being refused: the replication queued
    after each snapshot must not be dropped (invariant 7).  While it waits
    the job stays `queued` and its message names the job it waits for; it
    becomes `running` only once it holds the lock.  A delivery of a job
    whose own run holds the lock (Redis hands the message out again when a
    copy outlasts the visibility timeout) leaves the job's row alone: it
    logs `event=running_elsewhere`, as `tasks._claim` does, and looks again
    until the job has finished.
    """
    with ctx.sf() as s:
        job = _open_job(s, ctx.job_id)
        group_id = job.group_id
        if group_id is None and job.snapshot_id is not None:
            snap = s.get(GroupSnapshot, job.snapshot_id)
            group_id = snap.group_id if snap is not None else None
    if group_id is None:  # nothing to serialise on: let the job fail clearly
        _run_job(ctx, _replicate, "replicate")
        return None
    lock = GroupLock(ctx.redis, group_id, ctx.settings.group_lock_ttl_s, kind="replicate")
    if not lock.acquire():
        later = retry_wait_s(ctx.task.request.retries or 0, ctx.settings.group_lock_ttl_s)
        who = jobclaim.holder(ctx.redis, ctx.job_id) if ctx.job_id else None
        if who is not None:
            # This very job runs on another worker: the broker handed its
            # message out again (a copy outlasts the visibility timeout).
            # Its row is the runner's: it is not waiting, it is running.
            log.info("job=%s event=running_elsewhere holder=%s: checking again in %.0f s",
                     ctx.job_id, who, later)
        else:
            _wait_for_replication(ctx, group_id)
        raise ctx.task.retry(countdown=later)
    try:
        ctx.hold(lock)
        _run_job(ctx, _replicate, "replicate")
    finally:
        lock.release()
    return None


def _replicate(ctx: Ctx) -> dict[str, Any] | None:
    from cutpoint.api.services import replication

    with ctx.sf() as s:
        job, snap_id = _snapshot_of_job(s, ctx.job_id)
        params = dict(job.params or {})
        if job.message.startswith("waiting"):
            job.message = "running"
            s.commit()
    try:
        return replication.run(ctx.fenced or ctx.sf, ctx.settings, snap_id,
                               expected_epoch=(int(params["epoch"])
                                               if params.get("epoch") is not None else None),
                               jobs=int(params.get("jobs", 2)),
                               verify_full=bool(params.get("verify_full", False)),
                               rate_mbps=(float(params["rate_mbps"])
                                          if params.get("rate_mbps") else None))
    except replication.ReplicationFailed as exc:
        raise JobFailed(exc.code, str(exc)) from exc


def _wait_for_replication(ctx: Ctx, group_id: int) -> None:
    """Show a job that waits for the group's replication lock as queued, and why."""
    with ctx.sf() as s:
        job = s.get(Job, ctx.job_id)
        if job is None or job.state in (JobState.succeeded, JobState.failed):
            # Finished meanwhile (its runner released its claim, not yet the
            # lock): marked queued it would run again on the next retry.
            return
        # A failover holds the replicate lock too (it writes the DR images).
        holder = s.scalar(select(Job).where(
            Job.kind.in_(("replicate", "failover")), Job.group_id == group_id,
            Job.state == JobState.running, Job.id != job.id)
            .order_by(Job.started_at.desc()).limit(1))
        if holder is not None:
            snap = s.get(GroupSnapshot, holder.snapshot_id) if holder.snapshot_id else None
            what = "replication" if holder.kind == "replicate" else holder.kind
            why = (f"waiting: {what} job {holder.id}"
                   f"{f' (snapshot {snap.txn})' if snap else ''} of this group is running")
        else:
            why = ("waiting: the group's replication lock is held (a killed worker's "
                   "lease ends within the lock TTL)")
        job.state, job.message = JobState.queued, why[:255]
        s.commit()


@cutpoint_task("drill")
def drill(ctx: Ctx) -> dict[str, Any] | None:
    from cutpoint.api.services import drills

    try:
        return drills.run_job(ctx.sf, ctx.settings, ctx.job_id or "")
    except drills.DrillFailed as exc:
        failed = JobFailed(exc.code, str(exc))
        failed.result = exc.result  # type: ignore[attr-defined]  the evidence stays
        raise failed from exc


def _under_group_locks(ctx: Ctx, run: Callable[[Any], dict[str, Any]],
                       failure: type[Exception]) -> dict[str, Any] | None:
    """Run `run(fenced session factory)` holding the job's group lock and the
    group's replicate lock; `failure` (with `code` and `result`) fails the
    job with its result kept.

    The group lock: no scheduled snapshot or retention meanwhile, and a
    redelivered copy (these jobs outlast the broker's visibility timeout)
    waits, then finds the job finished, instead of doing it a second time.
    The replicate lock: these jobs write the images a replicate job writes
    (a final snapshot's replication, a rollback, a reverse copy).  Waiting
    for a lock is a retry without limit (a failed job here would be marked
    failed while the first delivery still runs)."""
    with ctx.sf() as s:
        job = s.get(Job, ctx.job_id)
        assert job is not None
        if job.group_id is None:
            raise JobFailed("bad_job", f"job {ctx.job_id} names no group")
        group_id = job.group_id
    ttl = ctx.settings.group_lock_ttl_s
    lock = GroupLock(ctx.redis, group_id, ttl)
    later = retry_wait_s(ctx.task.request.retries or 0, ttl)
    if not lock.acquire():
        raise ctx.task.retry(countdown=later)
    rlock = GroupLock(ctx.redis, group_id, ttl, kind="replicate")
    if not rlock.acquire():
        lock.release()
        raise ctx.task.retry(countdown=later)
    try:
        ctx.hold(lock)
        return run(ctx.hold(rlock))
    except failure as exc:
        failed = JobFailed(getattr(exc, "code", "failed"), str(exc))
        # What was done: where it stopped, whether production was touched,
        # the next step (failover); what was undone (restore).
        failed.result = getattr(exc, "result", None)  # type: ignore[attr-defined]
        raise failed from exc
    finally:
        rlock.release()
        lock.release()


@cutpoint_task("failover", max_retries=None)
def failover(ctx: Ctx) -> dict[str, Any] | None:
    """Fence, roll back and boot at DR (services/failover.py)."""
    from cutpoint.api.services import failover as fo

    return _under_group_locks(
        ctx, lambda sf: fo.run_job(sf, ctx.settings, ctx.job_id or ""), fo.FailoverFailed)


@cutpoint_task("restore", max_retries=None)
def restore(ctx: Ctx) -> dict[str, Any] | None:
    """Restore a group snapshot (services/restore.py); the group lock also keeps
    retention from deleting the snapshot being restored."""
    from cutpoint.api.services import restore as rs

    return _under_group_locks(
        ctx, lambda sf: rs.run_job(sf, ctx.settings, ctx.job_id or ""), rs.RestoreFailed)


@cutpoint_task("reprotect", max_retries=None)
def reprotect(ctx: Ctx) -> dict[str, Any] | None:
    """Turn a failed-over group around and replicate it back (services/reprotect.py)."""
    from cutpoint.api.services import reprotect as rp

    return _under_group_locks(
        ctx, lambda sf: rp.run_reprotect(sf, ctx.settings, ctx.job_id or ""),
        rp.ReprotectFailed)


@cutpoint_task("failback", max_retries=None)
def failback(ctx: Ctx) -> dict[str, Any] | None:
    """Planned failover back to the original primary, then re-protect."""
    from cutpoint.api.services import reprotect as rp

    return _under_group_locks(
        ctx, lambda sf: rp.run_failback(sf, ctx.settings, ctx.job_id or ""),
        rp.ReprotectFailed)
