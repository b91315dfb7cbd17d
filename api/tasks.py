"""Celery tasks.  Every task goes through `cutpoint_task`, so that all share:

- ids in, never objects; a job id names the row that tracks the work;
- idempotent: a finished job is not run again, and a group snapshot
  re-run with its txn resumes or resolves the same coordinator transaction;
- acks_late + reject_on_worker_lost: a killed worker's job is redelivered;
- metrics (runs by outcome, duration) and one structured log line per run.

A group's snapshots are serialised by a Redis lock with a TTL (refreshed
while the work runs, so it outlives a killed worker by at most the TTL) and,
durably, by the UNIQUE in-flight column of group_snapshots.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis
from celery import Task
from celery.exceptions import Retry
from celery.signals import worker_ready
from cutpoint.api.config import Settings, get_settings
from cutpoint.api.db import get_sessionmaker
from cutpoint.api.grouplock import GroupLock, LockLost
from cutpoint.api.models import (
    Group,
    GroupSnapshot,
    Host,
    Job,
    JobState,
    SnapState,
    utcnow,
)
from cutpoint.api.worker import _lazy
from cutpoint.coordinator.dr.ceph_errors import CephError
from prometheus_client import Counter, Histogram
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

log = logging.getLogger("cutpoint.tasks")
celery_app = _lazy.get()

TASK_RUNS = Counter("cutpoint_task_runs", "Task runs by outcome", ["task", "outcome"])
TASK_SECONDS = Histogram("cutpoint_task_seconds", "Task run time", ["task"])


class Skip(Exception):
    """Nothing to do on this delivery (another worker holds the work)."""


class JobFailed(Exception):
    def __init__(self, code: str, message: str) -> None:
        self.code = code
        super().__init__(message)


@dataclass
class Ctx:
    settings: Settings
    sf: sessionmaker[Session]
    job_id: str | None
    task: Task
    # The group locks this run holds, and the session factory for the
    # group's rows: every commit through it checks their fencing tokens.
    locks: list[GroupLock] = field(default_factory=list)
    fenced: sessionmaker[Session] | None = None
    attempt: int = 0

    @functools.cached_property
    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.settings.redis_url, socket_timeout=5)

    def hold(self, lock: GroupLock) -> sessionmaker[Session]:
        """Work under `lock` (acquired): its token guards every write to
        the group's rows from now on."""
        self.locks.append(lock)
        self.fenced = lock.fence(self.fenced or self.sf)
        return self.fenced

    def lost_lock(self) -> GroupLock | None:
        return next((lk for lk in self.locks if lk.lost.is_set()), None)


def cutpoint_task(name: str, *, job: bool = True, **opts: Any) \
        -> Callable[[Callable[[Ctx], dict[str, Any] | None]], Task]:
    def wrap(fn: Callable[[Ctx], dict[str, Any] | None]) -> Task:
        @celery_app.task(name=f"cutpoint.{name}", bind=True, acks_late=True,
                         reject_on_worker_lost=True, **opts)
        def run(self: Task, job_id: str | None = None) -> None:
            settings = get_settings()
            sf = get_sessionmaker(settings.database_url)
            ctx = Ctx(settings, sf, job_id, self)
            t0 = time.monotonic()
            outcome = "ok"
            try:
                if job:
                    _run_job(ctx, fn, name)
                else:
                    fn(ctx)
            except Skip as exc:
                outcome = "skipped"
                log.info("task=%s job=%s outcome=skipped why=%s", name, job_id, exc)
            except Retry:
                outcome = "retry"
                raise
            except Exception:
                outcome = "error"
                log.exception("task=%s job=%s outcome=error", name, job_id)
                raise
            finally:
                dt = time.monotonic() - t0
                TASK_RUNS.labels(name, outcome).inc()
                TASK_SECONDS.labels(name).observe(dt)
                if outcome != "error":
                    log.info("task=%s job=%s outcome=%s seconds=%.3f delivery=%s", name,
                             job_id, outcome, dt,
                             "redelivered" if self.request.delivery_info.get("redelivered")
                             else "first")
        return run
    return wrap


def _open_job(s: Session, job_id: str | None) -> Job:
    """The job to run; Skip when it is gone or already finished (a redelivery)."""
    job = s.get(Job, job_id)
    if job is None:
        raise Skip(f"job {job_id} does not exist")
    if job.state in (JobState.succeeded, JobState.failed):
        raise Skip(f"job {job_id} is already {job.state.value}")
    return job


def _snapshot_of_job(s: Session, job_id: str | None) -> tuple[Job, int]:
    """The job (which exists: it is running) and the group snapshot it is
    about; JobFailed no_snapshot when it names none."""
    job = s.get(Job, job_id)
    assert job is not None
    if job.snapshot_id is None:
        raise JobFailed("no_snapshot", "the job names no snapshot")
    return job, job.snapshot_id


def _run_job(ctx: Ctx, fn: Callable[[Ctx], dict[str, Any] | None], name: str) -> None:
    with ctx.sf() as s:
        job = _open_job(s, ctx.job_id)
        job.state = JobState.running
        job.attempts += 1
        job.started_at = job.started_at or utcnow()
        ctx.attempt = job.attempts
        s.commit()
    try:
        result = fn(ctx)
    except JobFailed as exc:
        _finish(ctx, JobState.failed, getattr(exc, "result", None), exc.code, str(exc))
        return
    except CephError as exc:  # a site's cluster failed the job: its typed code, not "internal"
        _finish(ctx, JobState.failed, None, exc.code, str(exc))
        return
    except (Skip, Retry):
        raise
    except Exception as exc:
        lost = ctx.lost_lock()
        if lost is not None:
            # Another worker may own the group now: stop here, write
            # nothing more to the group, and say so on the job.
            log.error("task=%s job=%s event=lock_lost_stopped lock=%s error=%r", name,
                      ctx.job_id, lost.key, exc)
            _finish(ctx, JobState.failed, None, "lock_lost",
                    f"stopped: {type(exc).__name__}: {exc}")
            return
        _finish(ctx, JobState.failed, None, "internal", f"{type(exc).__name__}: {exc}")
        raise
    _finish(ctx, JobState.succeeded, result, None, None)


def _finish(ctx: Ctx, state: JobState, result: dict[str, Any] | None, code: str | None,
            error: str | None) -> None:
    with ctx.sf() as s:
        job = s.get(Job, ctx.job_id)
        if job is None:
            return
        if ctx.attempt and job.attempts != ctx.attempt:
            # A later delivery of this job runs it now (ours lost its lock,
            # or outlived the broker's visibility timeout): its outcome is
            # the job's, not ours.
            log.warning("job=%s event=finish_skipped attempt=%s current=%s state=%s",
                        ctx.job_id, ctx.attempt, job.attempts, state.value)
            return
        job.state, job.result, job.error_code = state, result, code
        job.error = error[:4000] if error else None
        job.progress = 1.0
        job.message = state.value
        job.finished_at = utcnow()
        s.commit()


def _note(ctx: Ctx, message: str) -> None:
    """Say on the job why this delivery stopped (the job itself goes on)."""
    with ctx.sf() as s:
        job = s.get(Job, ctx.job_id)
        if job is not None and (not ctx.attempt or job.attempts == ctx.attempt):
            job.message = message[:255]
            s.commit()


@cutpoint_task("group_snapshot", max_retries=None)
def group_snapshot(ctx: Ctx) -> dict[str, Any] | None:
    from cutpoint.api.services import capture

    with ctx.sf() as s:
        _, snapshot_id = _snapshot_of_job(s, ctx.job_id)
        snap = s.get(GroupSnapshot, snapshot_id)
        assert snap is not None
        snap_id, group_id = snap.id, snap.group_id
        if snap.state in (SnapState.committed, SnapState.aborted, SnapState.failed):
            return {"snapshot_id": snap.id, "state": snap.state.value}
    lock = GroupLock(ctx.redis, group_id, ctx.settings.group_lock_ttl_s)
    if not lock.acquire():
        # Another worker runs this group (maybe this very job, delivered
        # twice), or a killed worker's lock has not expired yet: look again
        # later rather than ack the message away.
        raise ctx.task.retry(countdown=max(1.0, ctx.settings.group_lock_ttl_s / 3))
    try:
        try:
            fsf = ctx.hold(lock)
        except LockLost as exc:  # gone before we started: nothing done, come back
            _note(ctx, f"lock lost, retried: {exc}")
            raise ctx.task.retry(countdown=max(1.0, ctx.settings.group_lock_ttl_s / 3),
                                 exc=exc) from exc
        try:
            summary = capture.run(fsf, ctx.settings, snap_id)
        except capture.CaptureError as exc:
            capture.fail(fsf, snap_id, exc.code, str(exc))
            raise JobFailed(exc.code, str(exc)) from exc
        except Exception as exc:
            from cutpoint.coordinator.twophase import GroupBusy, TxnInFlight

            if lock.lost.is_set():
                # The coordinator has aborted what it could (presumed abort)
                # and the snapshot row is the next holder's to close: this
                # delivery stops, and the job comes back to resolve its txn
                # under the lock.
                _note(ctx, f"lock lost, retried: {exc}")
                raise ctx.task.retry(countdown=max(1.0, ctx.settings.group_lock_ttl_s / 3),
                                     exc=exc) from exc
            if isinstance(exc, TxnInFlight) or capture.txn_in_doubt(ctx.sf, ctx.settings,
                                                                    snap_id):
                # The coordinator's log holds this txn undecided (a killed
                # worker's, not stale yet, or the log failed mid-protocol):
                # never close the row while member snapshots may exist.
                # Come back after the lease; the coordinator resolves it.
                raise ctx.task.retry(countdown=3, exc=exc) from exc
            code = "group_busy" if isinstance(exc, GroupBusy) else type(exc).__name__
            capture.fail(fsf, snap_id, code, str(exc))
            raise JobFailed(code, str(exc)) from exc
    finally:
        lock.release()
    if summary["state"] != "committed":
        raise JobFailed(summary.get("error_code") or "aborted",
                        summary.get("reason") or "aborted")
    _queue_replication(ctx, snap_id)  # to the DR site, if the group has one
    return summary


def _pull_inventory(s: Session, host: Host, settings: Settings,
                    r: redis.Redis) -> dict[str, int]:
    """Ask the host's agent for hello and inventory and apply them (commits),
    under the inventory lock (services/inventory_watch.py).  An agent that
    cannot be reached is recorded on the host (committed) and its
    AgentCallError raised again."""
    from cutpoint.api.services import agents, inventory, inventory_watch

    try:
        hello, inv = agents.call(host, settings, ("hello", {}), ("inventory", {}))
    except agents.AgentCallError as exc:
        host.reachable = False
        host.last_error = str(exc)[:2000]
        s.commit()
        raise
    host.agent_version = str(hello.get("version", ""))[:64] or None
    with inventory_watch.inventory_lock(r, wait_s=30) as got:
        if not got:
            raise agents.AgentCallError(host.name, "busy", "another inventory writer "
                                        "held the lock for 30 s")
        counts = inventory.apply(s, host, inv)
        inventory_watch.record(s, host, inv, counts)
    return counts


@cutpoint_task("inventory_sync")
def inventory_sync(ctx: Ctx) -> dict[str, Any] | None:
    from cutpoint.api.services import agents

    with ctx.sf() as s:
        job = s.get(Job, ctx.job_id)
        assert job is not None
        host = s.get(Host, job.host_id) if job.host_id else None
        if host is None:
            raise JobFailed("host_not_found", "the job's host is gone")
        try:
            counts = _pull_inventory(s, host, ctx.settings, ctx.redis)
        except agents.AgentCallError as exc:
            raise JobFailed(exc.code.lower(), str(exc)) from exc
        return {"host": host.name, **counts}


@cutpoint_task("retention")
def retention(ctx: Ctx) -> dict[str, Any] | None:
    from cutpoint.api.services import retention as ret

    with ctx.sf() as s:
        job = s.get(Job, ctx.job_id)
        assert job is not None and job.group_id is not None
        g = s.get(Group, job.group_id)
        if g is None:
            raise JobFailed("group_not_found", "the job's group is gone")
        group_id = g.id
    lock = GroupLock(ctx.redis, group_id, ctx.settings.group_lock_ttl_s)
    if not lock.acquire():
        raise ctx.task.retry(countdown=5)
    try:
        fsf = ctx.hold(lock)
        out = ret.apply(fsf, ctx.settings, group_id)
        # DR retention (its own policy) after the primary's, in the same job.
        from cutpoint.api.services import replication

        try:
            dr = replication.dr_apply(fsf, group_id)
        except replication.ReplicationFailed as exc:
            dr = {"deleted": [], "failed": [f"{exc.code}: {exc}"]}
        out["dr_deleted"] = dr["deleted"]
        if dr.get("failed"):
            out["dr_failed"] = dr["failed"]
        return out
    finally:
        lock.release()


@cutpoint_task("scheduler_tick", job=False)
def scheduler_tick(ctx: Ctx) -> dict[str, Any] | None:
    from cutpoint.api.services import scheduler

    lock = ctx.redis.lock("cutpoint:lock:scheduler", timeout=30, thread_local=False)
    if not lock.acquire(blocking=False):
        raise Skip("another tick is running")
    try:
        return scheduler.tick(ctx.sf, ctx.settings, ctx.redis,
                              get_sessionmaker(ctx.settings.database_url, readonly=True))
    finally:
        lock.release()


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


@cutpoint_task("retention_tick", job=False)
def retention_tick(ctx: Ctx) -> dict[str, Any] | None:
    """Queue a retention job for each group that has something to delete."""
    from cutpoint.api.services import jobs, queue, replication
    from cutpoint.api.services import retention as ret

    n = 0
    now = utcnow()
    with ctx.sf() as s:
        for g in list(s.scalars(select(Group))):
            if not (ret.plan(s, g, now) or ret.pending_deletes(s, g)
                    or replication.dr_plan(s, g, now)):
                continue
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


# --- DR: replication, drills, failover --------------------------------------


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


def _queue_replication(ctx: Ctx, snap_id: int) -> None:
    """After a commit: replicate the snapshot if its group has a replication target.

    A broker that refuses the replicate job fails that job (the queue's
    rule), not the group snapshot, which is committed and can be replicated
    later (`POST /v1/snapshots/{id}/replicate`)."""
    from cutpoint.api.models import Policy
    from cutpoint.api.services import fencing, jobs, queue

    with ctx.sf() as s:
        snap = s.get(GroupSnapshot, snap_id)
        pol = s.get(Policy, snap.group_id) if snap else None
        if snap is None or pol is None or pol.replication_target_id is None:
            return
        # The epoch it is queued under: a failover before it runs refuses it.
        job = jobs.create(s, "replicate", actor="scheduler", group_id=snap.group_id,
                          snapshot_id=snap.id,
                          params={"jobs": 2, "epoch": fencing.current_epoch(s, snap.group_id)})
        try:
            queue.enqueue(s, ctx.settings, job)
        except queue.BrokerUnavailable as exc:
            log.warning("snapshot=%s job=%s event=replication_not_queued why=%s", snap_id,
                        job.id, exc)
