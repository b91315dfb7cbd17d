"""Failover request path over a real database (SQLite and PostgreSQL): the
preconditions are checked at the request (a failure is a problem naming
the precondition, and no job), and the RTO breakdown is read from the job's
timeline.  The lab runs of the whole path, including a failover that goes
through and one refused with real agents and QEMU, are test_failover_lab.py."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from cutpoint.api.models import Job
from cutpoint.api.services.failover_timeline import breakdown
from sqlalchemy import select


def _set_ceph(api: Any, site: str, access: dict[str, Any]) -> None:
    """Give `site` this Ceph access through the API, unchecked (its cluster
    need not answer: that is what the tests below are about)."""
    sid = next(s["id"] for s in api.get("/v1/sites").json()["items"] if s["name"] == site)
    r = api.patch(f"/v1/sites/{sid}", json={"check": False, "ceph": access})
    assert r.status_code == 200, r.text


def _failover_jobs(session_factory: Any) -> list[Job]:
    with session_factory() as s:
        return list(s.scalars(select(Job).where(Job.kind == "failover")))


def test_a_failover_without_a_dr_site_is_refused_at_the_request(
        api: Any, settings: Any, session_factory: Any,
        dr_snapshot: Callable[..., int]) -> None:
    """No Ceph access configured for the DR site: 409 naming the precondition,
    every check reported, and no job (so nothing at the primary is touched)."""
    dr_snapshot(disks=(0,), dr_verified_after_s=5)  # site "dr" has no Ceph access
    r = api.post("/v1/groups/app/failover", json={"mode": "unplanned", "recovery_point": "t1"})
    assert r.status_code == 409, r.text
    p = r.json()
    assert r.headers["content-type"].startswith("application/problem+json")
    assert (p["code"], p["precondition"]) == ("no_ceph_site", "dr_site_reachable"), p
    assert "site 'dr' has no Ceph access: set it with PATCH /v1/sites/" in p["detail"], p
    assert "(site_has_no_ceph)" in p["detail"], p
    assert "every primary VM still runs" in p["detail"]
    assert [(c["name"], c["status"]) for c in p["checks"]] == [
        ("dr_site_reachable", "fail"), ("recovery_point_at_dr", "skip"),
        ("dr_agents_ready", "fail"), ("fencing_epoch_available", "pass")]
    agents = p["checks"][2]
    assert agents["code"] == "no_dr_agent" and "primary-h1-vm1" in agents["message"], agents
    assert _failover_jobs(session_factory) == []
    # Planned without a recovery point: the same refusal, the recovery point
    # being checked on the final snapshot later.
    r = api.post("/v1/groups/app/failover", json={"mode": "planned"})
    assert r.status_code == 409 and r.json()["precondition"] == "dr_site_reachable", r.text
    assert r.json()["checks"][1]["message"].startswith("planned: checked on the final snapshot")
    assert _failover_jobs(session_factory) == []


def test_an_unreachable_dr_site_is_a_503_within_the_deadline(
        api: Any, session_factory: Any, dr_snapshot: Callable[..., int]) -> None:
    """The DR mon address answers nothing: librados gives up after the site's
    connect timeout (2 s here), the request says 503 ceph_unreachable."""
    dr_snapshot(disks=(0, 1), dr_verified_after_s=5)
    _set_ceph(api, "dr", {"mon_host": ["v2:127.0.0.1:9"], "client_id": "cutpoint",
                          "pools": {"rbd": "rbd"}, "connect_timeout_s": 2})
    t0 = time.monotonic()
    r = api.post("/v1/groups/app/failover", json={"mode": "unplanned", "recovery_point": "t1"})
    took = time.monotonic() - t0
    assert r.status_code == 503, r.text
    p = r.json()
    assert (p["code"], p["precondition"]) == ("ceph_unreachable", "dr_site_reachable"), p
    assert "not reachable" in p["detail"]
    assert 1.5 < took < 15, took
    assert _failover_jobs(session_factory) == []


def test_the_fencing_epoch_precondition(api: Any, session_factory: Any,
                                        dr_snapshot: Callable[..., int]) -> None:
    """Active at DR already: refused (nothing to fail over).  The epoch of a
    failover that failed after taking it is reused by a retry."""
    from cutpoint.api.models import FencingEpoch, Group, JobState

    dr_snapshot(disks=(0,), dr_verified_after_s=5)
    with session_factory() as s:
        g = s.scalar(select(Group).where(Group.name == "app"))
        job = Job(id="00000000-0000-0000-0000-00000000f001", kind="failover",
                  group_id=g.id, state=JobState.succeeded)
        s.add(job)
        s.add(FencingEpoch(group_id=g.id, epoch=1, active_site="dr", fenced_site="primary",
                           job_id=job.id))
        s.commit()
    r = api.post("/v1/groups/app/failover", json={"mode": "unplanned", "recovery_point": "t1"})
    checks = {c["name"]: c for c in r.json()["checks"]}
    fe = checks["fencing_epoch_available"]
    assert (fe["status"], fe["code"]) == ("fail", "already_failed_over"), fe
    assert "since fencing epoch 1" in fe["message"]
    with session_factory() as s:
        s.get(Job, "00000000-0000-0000-0000-00000000f001").state = JobState.failed
        s.commit()
    r = api.post("/v1/groups/app/failover", json={"mode": "unplanned", "recovery_point": "t1"})
    fe = {c["name"]: c for c in r.json()["checks"]}["fencing_epoch_available"]
    assert fe["status"] == "pass" and fe["detail"] == {"epoch": 1, "reuse": True}, fe


def test_breakdown_from_a_recorded_timeline() -> None:
    # A planned failover's timeline (the coordinator's events merged with
    # the service's own), t_s from the request.
    timeline = [
        {"t_s": 0.0, "step": "request"},
        {"t_s": 0.41, "step": "worker_start", "mode": "planned"},
        {"t_s": 0.5, "step": "precondition", "check": "dr_site_reachable"},
        {"t_s": 0.6, "step": "preconditions", "checks": 4},
        {"t_s": 2.9, "step": "final_snapshot", "snapshot_id": 3},
        {"t_s": 9.75, "step": "replicated", "snapshot_id": 3},
        {"t_s": 9.8, "step": "precondition", "check": "recovery_point_at_dr"},
        {"t_s": 10.6, "step": "fence", "stopped": ["a", "b"]},
        {"t_s": 11.5, "step": "stopped_snapshot", "snapshot_id": 4},
        {"t_s": 12.7, "step": "stopped_replicated", "snapshot_id": 4},
        {"t_s": 12.75, "step": "epoch", "epoch": 1},
        {"t_s": 12.8, "step": "failover_start", "recovery_point": "x"},
        {"t_s": 13.4, "step": "rollback", "rolled_back": []},
        {"t_s": 30.5, "step": "ready", "vm": "a"},
        {"t_s": 31.0, "step": "ready", "vm": "b"},
        {"t_s": 31.0, "step": "running", "vms": ["a", "b"]},
    ]
    bd = breakdown(timeline)
    assert bd == {"queue_wait_s": 0.41, "preconditions_s": 0.19, "final_snapshot_s": 2.3,
                  "replication_s": 6.85, "fence_s": 0.85, "stopped_snapshot_s": 0.9,
                  "stopped_replication_s": 1.2, "epoch_s": 0.05, "setup_s": 0.05,
                  "rollback_s": 0.6, "boot_s": 17.6}
    assert abs(sum(v for v in bd.values() if v is not None) - 31.0) < 1e-6
    # Unplanned: no final snapshots; their keys are None, not made up.
    unplanned = [{"t_s": 0.0, "step": "request"}, {"t_s": 0.3, "step": "worker_start"},
                 {"t_s": 0.4, "step": "preconditions"}, {"t_s": 0.9, "step": "fence"},
                 {"t_s": 1.0, "step": "epoch"}, {"t_s": 1.05, "step": "failover_start"},
                 {"t_s": 2.5, "step": "rollback"}, {"t_s": 20.0, "step": "running"}]
    bd = breakdown(unplanned)
    assert bd["final_snapshot_s"] is None and bd["stopped_replication_s"] is None
    assert (bd["queue_wait_s"], bd["preconditions_s"], bd["fence_s"], bd["epoch_s"],
            bd["setup_s"], bd["rollback_s"], bd["boot_s"]) == (0.3, 0.1, 0.5, 0.1, 0.05,
                                                                 1.45, 17.5)


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
        host = Host(name="dr-h1", site_id=dr.id, address="10.77.2.1", port=7443,
                    cert_fingerprint="ab" * 32)
        s.add(host)
        s.flush()
        # The DR agent lists the standby copies (shutoff) under the VMs' names.
        inv.apply(s, host, {"vms": [
            {"name": n, "driver": "qmp", "state": "shutoff",
             "disks": [{"id": f"{n}/disk0", "node": "disk0", "backend": "rbd",
                        "pool": "rbd", "image": f"{n}-disk0"}]} for n in ("a", "b")]})
        s.commit()
        both = {"agents": {"a": ("10.77.2.1", 7443, "ab" * 32),
                           "b": ("10.77.2.1", 7443, "ab" * 32)},
                "tls": ("/c/ca.pem", "/c/co.pem", "/c/co.key")}
        assert dr_agent_for(s, st, "dr", ["a", "b"]) == both
        # A VM no host lists is left out (the boot's preflight names it).
        assert dr_agent_for(s, st, "dr", ["a", "c"])["agents"] == {"a": both["agents"]["a"]}
        assert dr_agent_for(s, st, "primary", ["a"])["agents"] == {}
        host.cert_fingerprint = None  # an agent with no pin is never called
        s.flush()
        assert dr_agent_for(s, st, "dr", ["a", "b"])["agents"] == {}
        host.cert_fingerprint = "ab" * 32
        no_tls = settings.model_copy(update=dict.fromkeys(tls))
        assert dr_agent_for(s, no_tls, "dr", ["a"]) == {}
