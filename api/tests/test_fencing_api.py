"""Fencing reaches replication, over a real database (SQLite and PostgreSQL):
once a failover made the DR site the group's active site, a replication
into it is refused at the request (409) and by the worker's own path
(`replication.run`, what the `replicate` task calls), before any Ceph site
is even looked up.  Job events are read back through the jobs API.  The lab
run (a real failover, the old primary's replication refused, the DR images'
checksums unchanged) is test_fencing_lab.py; cutpoint-sync's own refusal is
dr-tests/tests/test_sync.py::test_a_fenced_dr_image_is_never_written."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest
from cutpoint.api.models import FencingEpoch, Group, Job, JobState, utcnow
from cutpoint.api.services import fencing, jobs, replication
from sqlalchemy import select


def _epoch(session_factory: Any, epoch: int, active: str, fenced: str,
           at: dt.datetime | None = None) -> None:
    with session_factory() as s:
        g = s.scalar(select(Group).where(Group.name == "app"))
        s.add(FencingEpoch(group_id=g.id, epoch=epoch, active_site=active, fenced_site=fenced,
                           job_id=None, at=at or utcnow()))
        s.commit()


def test_replication_into_the_active_site_is_refused(
        api: Any, settings: Any, session_factory: Any,
        dr_snapshot: Callable[..., int]) -> None:
    sid = dr_snapshot(disks=(0, 1))
    # Before any failover the request is accepted (queued under epoch 0).
    r = api.post(f"/v1/snapshots/{sid}/replicate")
    assert r.status_code == 202, r.text
    with session_factory() as s:
        assert s.get(Job, r.json()["id"]).params["epoch"] == 0
    _epoch(session_factory, 1, "dr", "primary")
    r = api.post(f"/v1/snapshots/{sid}/replicate")
    assert r.status_code == 409, r.text
    p = r.json()
    assert p["code"] == "fenced" and "active at 'dr' since fencing epoch 1" in p["detail"], p
    assert "would overwrite the live copy" in p["detail"]
    # The worker's path: refused before any site's Ceph access is read (the
    # sites here have none: a lookup would fail with site_has_no_ceph).
    with pytest.raises(replication.ReplicationFailed) as ei:
        replication.run(session_factory, settings, sid)
    assert ei.value.code == "fenced", ei.value
    # The job queued before the failover is refused too when it runs.
    with pytest.raises(replication.ReplicationFailed) as ei:
        replication.run(session_factory, settings, sid, expected_epoch=0)
    assert ei.value.code == "fenced"


def test_a_snapshot_cut_before_the_newest_epoch_is_never_replicated(
        api: Any, settings: Any, session_factory: Any,
        dr_snapshot: Callable[..., int]) -> None:
    """After a failback (epoch 2: the primary active again) the target is a
    replica again, but a snapshot from before the epochs stays the old
    primary's: refused; a job queued under another epoch too."""
    sid = dr_snapshot(disks=(0,))  # cut 30 s ago
    _epoch(session_factory, 1, "dr", "primary", utcnow() - dt.timedelta(seconds=20))
    _epoch(session_factory, 2, "primary", "dr", utcnow() - dt.timedelta(seconds=10))
    r = api.post(f"/v1/snapshots/{sid}/replicate")
    assert r.status_code == 409 and r.json()["code"] == "epoch_moved", r.text
    assert "cut before fencing epoch 2" in r.json()["detail"]
    with session_factory() as s:
        from cutpoint.api.models import GroupSnapshot

        snap = s.get(GroupSnapshot, sid)
        snap.cut_at = utcnow()  # as if taken after the failback
        s.commit()
        assert fencing.replication_refusal(s, snap, "dr") is None
        code, msg = fencing.replication_refusal(s, snap, "dr", expected_epoch=1)  # type: ignore[misc]
        assert code == "epoch_moved" and "queued under fencing epoch 1" in msg
        assert fencing.current_epoch(s, snap.group_id) == 2


def test_job_events_are_listed_in_order(api: Any, session_factory: Any) -> None:
    with session_factory() as s:
        job = jobs.create(s, "failover", actor="t")
        jobs.add_event(s, job.id, "request", t_s=0.0, detail={"mode": "planned"})
        jobs.add_event(s, job.id, "precondition", status="failed", t_s=0.25,
                       detail={"check": "dr_site_reachable", "at": dt.datetime(2026, 1, 1)})
        job.state = JobState.failed
        s.commit()
        jid = job.id
    r = api.get(f"/v1/jobs/{jid}/events")
    assert r.status_code == 200, r.text
    evs = r.json()
    assert [(e["seq"], e["step"], e["status"], e["t_s"]) for e in evs] == [
        (1, "request", "ok", 0.0), (2, "precondition", "failed", 0.25)]
    assert evs[1]["detail"] == {"check": "dr_site_reachable", "at": "2026-01-01 00:00:00"}
    assert evs[0]["at"] <= evs[1]["at"]
    assert api.as_("viewer").get(f"/v1/jobs/{jid}/events").status_code == 200
    assert api.get("/v1/jobs/nosuch/events").status_code == 404
