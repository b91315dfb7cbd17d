"""The one door to the job queue, with the broker down.

The broker is a real Redis URL on which nothing listens.  Every caller
(a route, the scheduler, the re-send of an orphaned capture) goes through
`queue.enqueue`, so one broker failure gets one treatment: a job that never
ran is closed as failed (`broker_unavailable`), the capture's pending
snapshot with it, and nothing else a job names is touched.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from cutpoint.api import services_local
from cutpoint.api.app import create_app
from cutpoint.api.config import Settings
from cutpoint.api.models import GroupSnapshot, Job, JobState, SnapState, utcnow
from cutpoint.api.services import queue, scheduler, snapshots
from fastapi.testclient import TestClient
from queued import queued_tasks  # api/tests/queued.py
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker


@pytest.fixture
def dead_broker(settings: Settings) -> Settings:
    """The test's settings with a broker URL nothing listens on."""
    return settings.model_copy(
        update={"redis_url": f"redis://127.0.0.1:{services_local.free_port()}/0"})


@pytest.fixture
def dead_api(api: Any, dead_broker: Settings, session_factory: sessionmaker[Session],
             tokens_by_role: dict[str, str]) -> Iterator[Any]:
    """Like the `api` fixture (same database and tokens), its app on the dead broker."""
    with TestClient(create_app(dead_broker, session_factory),
                    raise_server_exceptions=False) as client:
        yield type(api)(client, tokens_by_role)


def _job(sf: sessionmaker[Session], job_id: str) -> Job:
    with sf() as s:
        job = s.get(Job, job_id)
        assert job is not None
        return job


def test_a_refused_capture_closes_its_job_and_frees_the_group(
        dead_api: Any, session_factory: sessionmaker[Session], inventory: dict[str, Any]) -> None:
    assert dead_api.post("/v1/groups", json={"name": "g"}).status_code == 201
    assert dead_api.post("/v1/groups/g/members",
                         json={"vm": "primary-h1-vm1"}).status_code == 201
    for _ in range(2):  # the second is not 409: the refused one left no snapshot in flight
        r = dead_api.post("/v1/groups/g/snapshots")
        assert r.status_code == 503, r.text
        problem = r.json()
        assert problem["code"] == "broker_unavailable", problem
        job = _job(session_factory, problem["job_id"])
        assert (job.state, job.error_code) == (JobState.failed, "broker_unavailable")
        assert job.finished_at is not None
        with session_factory() as s:
            snap = s.get(GroupSnapshot, job.snapshot_id)
            assert snap is not None and snap.state == SnapState.failed
            assert snap.inflight_group_id is None and snap.error_code == "broker_unavailable"


def test_a_refused_replication_leaves_the_committed_snapshot_alone(
        api: Any, dead_api: Any, settings: Settings, session_factory: sessionmaker[Session],
        dr_snapshot: Any) -> None:
    sid = dr_snapshot(disks=(0,))
    r = dead_api.post(f"/v1/snapshots/{sid}/replicate")
    assert r.status_code == 503 and r.json()["code"] == "broker_unavailable", r.text
    job = _job(session_factory, r.json()["job_id"])
    assert (job.state, job.error_code) == (JobState.failed, "broker_unavailable")
    with session_factory() as s:
        snap = s.get(GroupSnapshot, sid)
        assert snap is not None and snap.state == SnapState.committed, snap.state
    # The same request with the broker up is queued, and the snapshot can be
    # replicated: the refusal was the job's only.
    r = api.post(f"/v1/snapshots/{sid}/replicate")
    assert r.status_code == 202, r.text
    assert queued_tasks(settings, r.json()["id"]) == ["cutpoint.replicate"]
    assert _job(session_factory, r.json()["id"]).state == JobState.queued


def test_the_scheduler_goes_through_the_same_door(
        api: Any, dead_broker: Settings, session_factory: sessionmaker[Session],
        inventory: dict[str, Any]) -> None:
    r = api.post("/v1/groups", json={"name": "sched", "policy": {"rpo_seconds": 60}})
    assert r.status_code == 201, r.text
    assert api.post("/v1/groups/sched/members", json={"vm": "primary-h1-vm1"}).status_code == 201
    r = redis.Redis.from_url(dead_broker.redis_url)
    # One RPO after its creation the group is due whatever its first
    # capture's offset (services/rpo.py first_capture_offset_s).
    stats = scheduler.tick(session_factory, dead_broker, r,
                           now=utcnow() + dt.timedelta(seconds=60))
    assert stats["errors"] == 1 and stats["enqueued"] == 0, stats
    with session_factory() as s:
        job = s.scalar(select(Job).where(Job.kind == "group_snapshot").order_by(
            Job.created_at.desc()).limit(1))
        assert job is not None
        assert (job.state, job.error_code) == (JobState.failed, "broker_unavailable")
        snap = s.get(GroupSnapshot, job.snapshot_id)
        assert snap is not None and snap.state == SnapState.failed


def test_a_job_that_ran_before_is_left_for_the_next_resend(
        api: Any, dead_broker: Settings, session_factory: sessionmaker[Session],
        inventory: dict[str, Any]) -> None:
    """The re-send of an orphaned capture: its worker died mid-way, so member
    snapshots may exist; a refused re-send must not close it."""
    assert api.post("/v1/groups", json={"name": "o"}).status_code == 201
    assert api.post("/v1/groups/o/members", json={"vm": "primary-h1-vm1"}).status_code == 201
    with session_factory() as s:
        from cutpoint.api.models import Group

        g = s.scalar(select(Group).where(Group.name == "o"))
        assert g is not None
        job = snapshots.request(s, g, trigger="manual", actor="t")
        job.state, job.attempts = JobState.running, 1
        job.started_at = utcnow() - dt.timedelta(minutes=5)
        s.commit()
        with pytest.raises(queue.BrokerUnavailable):
            queue.enqueue(s, dead_broker, job)
        job_id, snap_id = job.id, job.snapshot_id
    with session_factory() as s:
        job2, snap = s.get(Job, job_id), s.get(GroupSnapshot, snap_id)
        assert job2 is not None and job2.state == JobState.running and job2.error_code is None
        assert snap is not None and snap.state == SnapState.pending
        assert snap.inflight_group_id is not None
