"""A replicate job delivered again while it runs leaves the job alone, with a
real Celery worker on real Redis (no Ceph: the tasks never get past the
group's replicate lock, held here as the running copy holds it).

A copy outlives the broker's visibility timeout, so Redis hands its message
out again: that delivery finds the group's replicate lock held by the job's
own run.  It must not show the running job as `queued` and "waiting" (the
row is the runner's), and once the run has finished it must not mark the
finished job queued either (the next retry would run the copy again).
The lab run of the same path (a real copy of 170 s against 120 s) is
test_redelivery_lab.py.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import redis
from cutpoint.api import jobclaim
from cutpoint.api.models import (
    Group,
    GroupSnapshot,
    Job,
    JobState,
    Policy,
    SnapState,
    utcnow,
)
from cutpoint.api.tasks import GroupLock
from cutpoint.api.worker import send
from plane import Plane, wait_for  # api/tests/plane.py
from test_replication_serial import (  # api/tests/test_replication_serial.py
    lock_ttl_plane_fixture,  # noqa: F401  (the fixture `plane`)
)


def _running_job(plane: Plane) -> tuple[int, str]:
    """A group and its replicate job, running (attempt 1): (group id, job id)."""
    with plane.sf() as s:
        g = Group(name="redeliver")
        g.policy = Policy(keep_last=5)
        s.add(g)
        s.flush()
        snap = GroupSnapshot(group_id=g.id, txn="t1", state=SnapState.committed,
                             cut_at=utcnow() - dt.timedelta(seconds=5))
        s.add(snap)
        s.flush()
        job = Job(id="00000000-0000-4000-8000-00000000000a", kind="replicate",
                  state=JobState.running, group_id=g.id, snapshot_id=snap.id,
                  message="copying", attempts=1, started_at=utcnow())
        s.add(job)
        s.commit()
        return g.id, job.id


def _row(plane: Plane, job_id: str) -> dict[str, Any]:
    with plane.sf() as s:
        j = s.get(Job, job_id)
        assert j is not None
        return {"state": j.state.value, "message": j.message, "attempts": j.attempts}


def test_a_redelivered_replication_leaves_its_running_job_alone(plane: Plane) -> None:
    gid, job_id = _running_job(plane)
    r = redis.Redis.from_url(plane.settings.redis_url)
    # The run in progress: it holds the group's replicate lock and its claim.
    lock = GroupLock(r, gid, 60, kind="replicate")
    assert lock.acquire()
    assert r.set(jobclaim.key(job_id), "other-host:1234:attempt-1", ex=60)
    plane.start("worker")
    send("replicate", job_id, plane.settings)  # the broker's second delivery
    wait_for(lambda: plane.tail(200_000).count(f"job={job_id} event=running_elsewhere") >= 2,
             60, "the redelivery held back twice", plane)
    row = _row(plane, job_id)
    print(f"\nwhile it runs elsewhere: {row}")
    assert row == {"state": "running", "message": "copying", "attempts": 1}, row

    # The run ends: job finished, claim and lock freed.  The next delivery
    # finds it finished and does nothing.
    with plane.sf() as s:
        j = s.get(Job, job_id)
        assert j is not None
        j.state, j.message = JobState.succeeded, "succeeded"
        s.commit()
    r.delete(jobclaim.key(job_id))
    lock.release()
    wait_for(lambda: f"job={job_id} outcome=skipped" in plane.tail(200_000), 60,
             "the redelivery to find the job finished", plane)
    row = _row(plane, job_id)
    print(f"after the run: {row}")
    assert row == {"state": "succeeded", "message": "succeeded", "attempts": 1}, row


def test_a_finished_job_is_not_marked_waiting(plane: Plane) -> None:
    """The delivery that found the lock held looks at the job after the run
    has finished it (the runner frees its claim before the lock): the job
    stays finished, else the next retry would run the copy again."""
    from cutpoint.api.tasks import Ctx
    from cutpoint.api.tasks_dr import _wait_for_replication

    gid, job_id = _running_job(plane)
    with plane.sf() as s:
        j = s.get(Job, job_id)
        assert j is not None
        j.state, j.message = JobState.failed, "failed"
        s.commit()
    _wait_for_replication(Ctx(plane.settings, plane.sf, job_id, None), gid)  # type: ignore[arg-type]
    assert _row(plane, job_id) == {"state": "failed", "message": "failed", "attempts": 1}
