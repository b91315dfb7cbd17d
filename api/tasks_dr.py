"""Celery tasks of DR: replication, drills, failover and restore.  The shared
machinery is `tasks.py`."""

from __future__ import annotations

from typing import Any

from cutpoint.api.grouplock import GroupLock
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
    becomes `running` only once it holds the lock.
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
        _wait_for_replication(ctx, group_id)
        raise ctx.task.retry(countdown=max(1.0, ctx.settings.group_lock_ttl_s / 3))
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
        if job is None:
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


@cutpoint_task("failover", max_retries=None)
def failover(ctx: Ctx) -> dict[str, Any] | None:
    """Under the group lock: no scheduled snapshot meanwhile, and a redelivered
    copy (a failover outlasts the broker's visibility timeout) waits, then
    finds the job finished, instead of fencing and booting a second time.
    Waiting for a lock is a retry without limit (a failed job here would
    be marked failed while the first delivery still runs)."""
    from cutpoint.api.services import failover as fo

    with ctx.sf() as s:
        job = s.get(Job, ctx.job_id)
        assert job is not None
        if job.group_id is None:
            raise JobFailed("bad_job", f"job {ctx.job_id} names no group")
        group_id = job.group_id
    ttl = ctx.settings.group_lock_ttl_s
    lock = GroupLock(ctx.redis, group_id, ttl)
    if not lock.acquire():
        raise ctx.task.retry(countdown=max(1.0, ttl / 3))
    # And the group's replicate lock: the final snapshot's replication (and,
    # in both modes, the rollback of the DR images) must not race a
    # replicate job writing the same DR images.
    rlock = GroupLock(ctx.redis, group_id, ttl, kind="replicate")
    if not rlock.acquire():
        lock.release()
        raise ctx.task.retry(countdown=max(1.0, ttl / 3))
    try:
        ctx.hold(lock)
        return fo.run_job(ctx.hold(rlock), ctx.settings, ctx.job_id or "")
    except fo.FailoverFailed as exc:
        failed = JobFailed(exc.code, str(exc))
        # Where it stopped, whether production was touched, the next step.
        failed.result = exc.result  # type: ignore[attr-defined]
        raise failed from exc
    finally:
        rlock.release()
        lock.release()


@cutpoint_task("restore", max_retries=None)
def restore(ctx: Ctx) -> dict[str, Any] | None:
    """Under the group lock (retention must not delete the snapshot being
    restored, and no snapshot of the group is taken meanwhile) and its
    replicate lock (an in-place restore at DR rewrites the images that
    replication writes).  Waiting for them is a retry without limit."""
    from cutpoint.api.services import restore as rs

    with ctx.sf() as s:
        job = s.get(Job, ctx.job_id)
        assert job is not None
        if job.group_id is None:
            raise JobFailed("bad_job", f"job {ctx.job_id} names no group")
        group_id = job.group_id
    ttl = ctx.settings.group_lock_ttl_s
    lock = GroupLock(ctx.redis, group_id, ttl)
    if not lock.acquire():
        raise ctx.task.retry(countdown=max(1.0, ttl / 3))
    rlock = GroupLock(ctx.redis, group_id, ttl, kind="replicate")
    if not rlock.acquire():
        lock.release()
        raise ctx.task.retry(countdown=max(1.0, ttl / 3))
    try:
        ctx.hold(lock)
        return rs.run_job(ctx.hold(rlock), ctx.settings, ctx.job_id or "")
    except rs.RestoreFailed as exc:
        failed = JobFailed(exc.code, str(exc))
        failed.result = exc.result  # type: ignore[attr-defined]  what was done, undone
        raise failed from exc
    finally:
        rlock.release()
        lock.release()
