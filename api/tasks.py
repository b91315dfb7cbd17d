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

import datetime as dt
import functools
import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis
from celery import Task
from celery.exceptions import Retry
from cutpoint.api import jobclaim
from cutpoint.api.config import Settings, get_settings
from cutpoint.api.db import get_sessionmaker
from cutpoint.api.grouplock import GroupLock, LockLost, retry_wait_s
from cutpoint.api.jobclaim import JobClaim
from cutpoint.api.models import (
    Group,
    GroupSnapshot,
    Host,
    Job,
    JobState,
    SnapState,
    utcnow,
)
from cutpoint.api.services import webhooks
from cutpoint.api.worker import _lazy
from cutpoint.coordinator.dr.ceph_errors import CephError
from prometheus_client import Counter, Histogram
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
    def reads(self) -> sessionmaker[Session]:
        """Sessions for reads only: on SQLite their BEGIN does not take the
        write lock, so they never queue behind another worker's writes."""
        return get_sessionmaker(self.settings.database_url, readonly=True)

    @functools.cached_property
    def redis(self) -> redis.Redis:
        return redis_for(self.settings.redis_url)

    def hold(self, lock: GroupLock) -> sessionmaker[Session]:
        """Work under `lock` (acquired): its token guards every write to
        the group's rows from now on."""
        self.locks.append(lock)
        self.fenced = lock.fence(self.fenced or self.sf)
        return self.fenced

    def lost_lock(self) -> GroupLock | None:
        return next((lk for lk in self.locks if lk.lost.is_set()), None)


_redis: dict[str, redis.Redis] = {}
_redis_lock = threading.Lock()


def redis_for(url: str) -> redis.Redis:
    """This process's Redis client for `url`, shared by its tasks (and
    threads: its connection pool is thread-safe).  One client per task
    opened a new connection, with its handshake, for every task: a third
    of a millisecond of CPU and a round trip or two, each time."""
    with _redis_lock:
        r = _redis.get(url)
        if r is None:
            r = _redis[url] = redis.Redis.from_url(url, socket_timeout=5)
        return r


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


# Waiting for another delivery's claim has no limit of its own: the claim
# ends with its holder (its TTL) or with the job.  Celery's retry() reads
# max_retries=None as "the task's default" (3), not as no limit; a drill
# job redelivered after its worker was killed gave up after 3 checks (CI
# rehearsal of 7b6d99e: MaxRetriesExceededError while the dead worker's
# claim was still live).
CLAIM_RETRIES = sys.maxsize


def _claim(ctx: Ctx) -> JobClaim:
    """This delivery's claim on the job (jobclaim.py), or a retry: the job
    runs on another worker (a redelivery after the visibility timeout), or
    Redis did not answer."""
    with ctx.reads() as s:
        attempt = _open_job(s, ctx.job_id).attempts + 1
    assert ctx.job_id is not None
    later = max(1.0, min(10.0, ctx.settings.job_claim_ttl_s / 3))
    claim = JobClaim(ctx.redis, ctx.job_id, ctx.settings.job_claim_ttl_s, attempt)
    try:
        if claim.acquire():
            return claim
        who = jobclaim.holder(ctx.redis, ctx.job_id)
    except redis.RedisError as exc:
        log.warning("job=%s event=claim_failed error=%r", ctx.job_id, exc)
        raise ctx.task.retry(countdown=later, max_retries=CLAIM_RETRIES) from exc
    log.info("job=%s event=running_elsewhere holder=%s: checking again in %.0f s",
             ctx.job_id, who, later)
    raise ctx.task.retry(countdown=later, max_retries=CLAIM_RETRIES)


def _run_job(ctx: Ctx, fn: Callable[[Ctx], dict[str, Any] | None], name: str) -> None:
    claim = _claim(ctx)
    try:
        _run_claimed(ctx, fn, name)
    finally:
        claim.release()


def _run_claimed(ctx: Ctx, fn: Callable[[Ctx], dict[str, Any] | None], name: str) -> None:
    with ctx.sf() as s:
        job = _open_job(s, ctx.job_id)  # again: it may have finished meanwhile
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
        event = webhooks.for_job(job.kind, state.value)
        if event is not None:
            group = s.get(Group, job.group_id) if job.group_id is not None else None
            webhooks.emit(s, event, webhooks.job_payload(job, group.name if group else None))
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

    with ctx.reads() as s:
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
        raise ctx.task.retry(countdown=retry_wait_s(ctx.task.request.retries or 0,
                                                    ctx.settings.group_lock_ttl_s))
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

    # End the transaction before the agent call: on SQLite an open one holds
    # the database's write lock, and every other writer (a redelivery of
    # this job, the orphan sweep at worker start) failed "database is
    # locked" while a slow agent answered.
    s.commit()
    peer: dict[str, Any] = {}
    try:
        hello, inv = agents.call(host, settings, ("hello", {}), ("inventory", {}), peer=peer)
    except agents.AgentCallError as exc:
        host.reachable = False
        host.last_error = str(exc)[:2000]
        s.commit()
        raise
    host.agent_version = str(hello.get("version", ""))[:64] or None
    if peer.get("not_after") is not None:
        host.cert_not_after = dt.datetime.fromtimestamp(peer["not_after"], dt.UTC)
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


# A run that yields to a waiting capture (services/retention.py) comes back
# this much later, for the rest: time for the capture to take the group.
RETENTION_YIELD_S = 2.0


@cutpoint_task("retention", max_retries=None)
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

    def waiting(s: Session) -> bool:
        return ret.capture_waiting(s, group_id)

    try:
        fsf = ctx.hold(lock)
        out = ret.apply(fsf, ctx.settings, group_id, stop=waiting)
        # DR retention (its own policy) after the primary's, in the same job.
        from cutpoint.api.services import replication

        dr: dict[str, Any] = {"deleted": []}
        if not out.get("yielded"):
            try:
                dr = replication.dr_apply(fsf, group_id, stop=waiting)
            except replication.ReplicationFailed as exc:
                dr = {"deleted": [], "failed": [f"{exc.code}: {exc}"]}
        out["dr_deleted"] = dr["deleted"]
        if dr.get("failed"):
            out["dr_failed"] = dr["failed"]
    finally:
        lock.release()
    if out.get("yielded") or dr.get("yielded"):
        log.info("job=%s group_id=%s event=retention_yielded deleted=%s dr_deleted=%d: a capture"
                 " waits; the rest in %.0f s", ctx.job_id, group_id, out["deleted"],
                 len(dr["deleted"]), RETENTION_YIELD_S)
        raise ctx.task.retry(countdown=RETENTION_YIELD_S)
    return out


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


def _queue_replication(ctx: Ctx, snap_id: int) -> None:
    """After a commit: replicate the snapshot if its group has a replication target.

    A broker that refuses the replicate job fails that job (the queue's
    rule), not the group snapshot, which is committed and can be replicated
    later (`POST /v1/snapshots/{id}/replicate`)."""
    from cutpoint.api.models import Policy
    from cutpoint.api.services import fencing, jobs, queue

    with ctx.reads() as s:
        snap = s.get(GroupSnapshot, snap_id)
        pol = s.get(Policy, snap.group_id) if snap else None
        if snap is None or pol is None or pol.replication_target_id is None:
            return
    with ctx.sf() as s:
        snap = s.get(GroupSnapshot, snap_id)
        if snap is None:
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


# The other task modules register their tasks with the same Celery app when
# imported; importing them here keeps `include=["cutpoint.api.tasks"]` whole.
from cutpoint.api import tasks_dr, tasks_periodic  # noqa: F401
