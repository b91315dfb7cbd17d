"""Failover request path over a real database (SQLite and PostgreSQL): the
route stamps the request's wall-clock time (the RTO origin) into the job,
and the RTO breakdown is read from the job's timeline.  The lab run of the
whole path is test_failover_lab.py."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from cutpoint.api.models import Job
from cutpoint.api.services.failover import breakdown
from queued import queued_tasks  # api/tests/queued.py


def test_failover_job_carries_the_request_time(api: Any, settings: Any, session_factory: Any,
                                               dr_snapshot: Callable[..., int]) -> None:
    dr_snapshot(disks=(0,), dr_verified_after_s=5)
    txn = "t1"
    t0 = time.time()
    r = api.post("/v1/groups/app/failover", json={"mode": "unplanned", "recovery_point": txn})
    t1 = time.time()
    assert r.status_code == 202, r.text
    assert r.headers["Location"] == f"/v1/jobs/{r.json()['id']}"
    assert queued_tasks(settings, r.json()["id"]) == ["cutpoint.failover"]
    with session_factory() as s:
        job = s.get(Job, r.json()["id"])
        assert job.params["mode"] == "unplanned" and job.params["recovery_point"] == txn
        assert t0 <= job.params["requested_at"] <= t1, (t0, job.params["requested_at"], t1)
    # Planned mode without a recovery point: the worker takes the final one.
    r = api.post("/v1/groups/app/failover", json={"mode": "planned"})
    assert r.status_code == 202, r.text
    with session_factory() as s:
        job = s.get(Job, r.json()["id"])
        assert job.snapshot_id is None and job.params["recovery_point"] is None
        assert job.params["requested_at"] >= t1


def test_breakdown_from_a_recorded_timeline() -> None:
    # A planned failover's timeline (the coordinator's events merged with
    # the service's own), t_s from the request.
    timeline = [
        {"t_s": 0.0, "step": "request"},
        {"t_s": 0.41, "step": "worker_start", "mode": "planned"},
        {"t_s": 2.9, "step": "final_snapshot", "snapshot_id": 3},
        {"t_s": 9.75, "step": "replicated", "snapshot_id": 3},
        {"t_s": 10.6, "step": "fence", "epoch": 1},
        {"t_s": 11.5, "step": "stopped_snapshot", "snapshot_id": 4},
        {"t_s": 12.7, "step": "stopped_replicated", "snapshot_id": 4},
        {"t_s": 12.8, "step": "failover_start", "recovery_point": "x"},
        {"t_s": 13.4, "step": "rollback", "rolled_back": []},
        {"t_s": 30.5, "step": "ready", "vm": "a"},
        {"t_s": 31.0, "step": "ready", "vm": "b"},
        {"t_s": 31.0, "step": "running", "vms": ["a", "b"]},
    ]
    bd = breakdown(timeline)
    assert bd == {"queue_wait_s": 0.41, "final_snapshot_s": 2.49, "replication_s": 6.85,
                  "fence_s": 0.85, "stopped_snapshot_s": 0.9, "stopped_replication_s": 1.2,
                  "setup_s": 0.1, "rollback_s": 0.6, "boot_s": 17.6}
    assert abs(sum(v for v in bd.values() if v is not None) - 31.0) < 1e-6
    # Unplanned: no final snapshots; their keys are None, not made up.
    unplanned = [{"t_s": 0.0, "step": "request"}, {"t_s": 0.3, "step": "worker_start"},
                 {"t_s": 0.5, "step": "failover_start"}, {"t_s": 1.8, "step": "fence"},
                 {"t_s": 2.5, "step": "rollback"}, {"t_s": 20.0, "step": "running"}]
    bd = breakdown(unplanned)
    assert bd["final_snapshot_s"] is None and bd["stopped_replication_s"] is None
    assert (bd["queue_wait_s"], bd["setup_s"], bd["fence_s"], bd["rollback_s"],
            bd["boot_s"]) == (0.3, 0.2, 1.3, 0.7, 17.5)


def test_dr_agent_from_the_registered_dr_host(session_factory: Any, settings: Any) -> None:
    from cutpoint.api.models import Host, Site
    from cutpoint.api.services import inventory as inv
    from cutpoint.api.services.failover import dr_agent_for

    tls = {"agent_ca": "/c/ca.pem", "agent_cert": "/c/co.pem", "agent_key": "/c/co.key"}
    st = settings.model_copy(update=tls)
    with session_factory() as s:
        dr = Site(name="dr")
        s.add(dr)
        s.flush()
        host = Host(name="dr-h1", site_id=dr.id, address="10.77.2.1", port=7443)
        s.add(host)
        s.flush()
        # The DR agent lists the standby copies (shutoff) under the VMs' names.
        inv.apply(s, host, {"vms": [
            {"name": n, "driver": "qmp", "state": "shutoff",
             "disks": [{"id": f"{n}/disk0", "node": "disk0", "backend": "rbd",
                        "pool": "rbd", "image": f"{n}-disk0"}]} for n in ("a", "b")]})
        s.commit()
        assert dr_agent_for(s, st, "dr", ["a", "b"]) == {
            "agent": ("10.77.2.1", 7443), "tls": ("/c/ca.pem", "/c/co.pem", "/c/co.key")}
        assert dr_agent_for(s, st, "dr", ["a", "c"]) == {}  # no host has every VM
        assert dr_agent_for(s, st, "primary", ["a"]) == {}
        no_tls = settings.model_copy(update=dict.fromkeys(tls))
        assert dr_agent_for(s, no_tls, "dr", ["a"]) == {}
