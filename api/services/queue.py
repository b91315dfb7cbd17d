"""The one door to the job queue: routes, the scheduler and tasks all queue
a job with `enqueue(session, settings, job)`.

The job row is committed before it is queued (a worker that picks the task
up at once must find it).  A broker that refuses the task (down,
unreachable: `send` gives up after a bounded retry, so a request fails
fast) is handled here, the same way for every caller:

- a job that never ran is closed as failed with `broker_unavailable`:
  nothing will ever run it.  When it is the capture job of a group
  snapshot, that snapshot (pending, nothing taken) is closed too, which
  frees the group's in-flight slot for the next request;
- a job that ran before (the re-send of an orphaned capture) is left as it
  is: its work may be half done, and the next re-send takes it up again;
- then `BrokerUnavailable` (503, `broker_unavailable`) is raised.  A route
  lets it through as a problem response; the scheduler and tasks log it.

Any other row a job names (the committed snapshot a replicate, drill or
failover job is about) is never touched: the refusal is the job's, not the
snapshot's.
"""

from __future__ import annotations

from cutpoint.api.config import Settings
from cutpoint.api.errors import Unavailable
from cutpoint.api.models import (
    Group,
    GroupSnapshot,
    Job,
    JobState,
    Site,
    SnapState,
    utcnow,
)
from sqlalchemy.orm import Session


class BrokerUnavailable(Unavailable):
    code = "broker_unavailable"


def queue_of(session: Session, settings: Settings, job: Job) -> str | None:
    """The queue `job` goes to when it is not its kind's own: with
    `dr_site_queues`, a DR job of a group with a DR site goes to that site's
    queue (worker.site_queue), which only workers with its Ceph access take."""
    from cutpoint.api.worker import DR_KINDS, site_queue

    if not settings.dr_site_queues or job.kind not in DR_KINDS or job.group_id is None:
        return None
    g = session.get(Group, job.group_id)
    target = g.policy.replication_target_id if g is not None and g.policy else None
    site = session.get(Site, target) if target is not None else None
    return site_queue(site.name) if site is not None else None


def enqueue(session: Session, settings: Settings, job: Job) -> None:
    """Queue `job` (its kind names the task); BrokerUnavailable if the broker refuses."""
    from cutpoint.api.worker import send

    try:
        send(job.kind, job.id, settings, queue_of(session, settings, job))
    except Exception as exc:  # any refusal of the broker: handled once, here
        reason = f"{type(exc).__name__}: {exc}"
        if job.attempts == 0 and job.started_at is None:
            _close_unqueued(session, job, reason)
        raise BrokerUnavailable(f"the job broker refused {job.kind} job {job.id}: {reason}",
                                extra={"job_id": job.id}) from exc


def enqueue_sweep(settings: Settings, kind: str, reason: str) -> None:
    """Queue a task that has no job row (a sweep over every group, as beat
    sends them); `reason` goes where a job id would, into its log line.  A
    refusal raises BrokerUnavailable: there is no row to close."""
    from cutpoint.api.worker import send

    try:
        send(kind, reason, settings)
    except Exception as exc:
        raise BrokerUnavailable(f"the job broker refused {kind}: {type(exc).__name__}: "
                                f"{exc}") from exc


def _close_unqueued(session: Session, job: Job, reason: str) -> None:
    now = utcnow()
    job.state, job.error_code, job.error = JobState.failed, "broker_unavailable", reason
    job.message, job.finished_at = "failed: the job broker refused it", now
    snap = session.get(GroupSnapshot, job.snapshot_id) if job.snapshot_id else None
    if snap is not None and snap.job_id == job.id and snap.state == SnapState.pending:
        snap.state = SnapState.failed
        snap.inflight_group_id = None
        snap.error_code, snap.error = "broker_unavailable", reason
        snap.finished_at = now
    session.commit()
