"""Planned failover through the API against the lab.

A 2-VM writer group (2 primary hosts x 1 guest x 2 RBD disks, the writer
ring across both guests) is defined through the API; two group snapshots
are taken and replicated by the control plane's own paths (the snapshot
job queues the replicate job).  Then `POST /v1/groups/app/failover
{mode: planned}` is followed to the end, and the test checks what the job
claims against the lab itself:

- the job succeeded, with `rto_s` counted from the HTTP request (its
  `requested_at` lies inside the test's POST, the queue wait agrees with
  `Job.started_at`, and the RTO is no longer than the test saw);
- fencing epoch 1 is recorded (DR active, primary fenced) and the group's
  schedule is off;
- the primary guests are gone (their QEMU pids, the agents' inventory);
- the DR guests run and printed their ready line;
- planned mode loses nothing written before the fence: the recovery point
  is a snapshot of the stopped primary disks (after an online final
  snapshot, both replicated), and the writer checker passes on the DR
  images with the same records as it.

A second test fails over in unplanned mode from the newest DR point with
one primary agent stopped: that host is recorded as unreachable (not waited
for) and its guest keeps running, the other is stopped, epoch 1 is
recorded, both guests boot at DR and the writer checker at DR matches the
recovery point.

The DR guests are stopped at the end (`stop_guests`).  The primary guests
stay stopped: the lab fixture brings up a fresh lab for the next test.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cutpoint.api import services_local
from cutpoint.api.models import FencingEpoch
from fastapi.testclient import TestClient
from labflow import (  # api/tests/labflow.py
    failover_plane,
    finish,
    inventory_states,
    lab_site,
    register,
    snapshot_and_replicate,
    writer_verdict,
)
from plane import Plane
from sqlalchemy import select

pytestmark = [pytest.mark.lab,
              pytest.mark.lab_config(hosts=2, vms_per_host=1, disks=2, backend="rbd",
                                     workload="writer")]



@pytest.fixture
def plane(lab: dict[str, Any], agents: list[dict[str, Any]], tmp_path: Path,
          local_services: services_local.Endpoints) -> Iterator[Plane]:
    with failover_plane(lab, tmp_path, local_services) as p:
        yield p


def _refused(c: TestClient, status: int, code: str, precondition: str) -> dict[str, Any]:
    """A planned failover asked for now: refused with that problem, and no job."""
    t0 = time.monotonic()
    r = c.post("/v1/groups/app/failover", json={"mode": "planned"})
    took = time.monotonic() - t0
    assert r.status_code == status, r.text
    p = dict(r.json())
    assert (p["code"], p["precondition"]) == (code, precondition), p
    assert r.headers["content-type"].startswith("application/problem+json")
    assert c.get("/v1/jobs", params={"kind": "failover"}).json()["items"] == []
    print(f"  {status} {code} ({precondition}) after {took:.2f} s: {p['detail']}")
    return p


def _production_runs(c: TestClient, lab: dict[str, Any], plane: Plane) -> None:
    """Every primary VM runs: its agent says so and its QEMU is alive; the
    group's schedule is on."""
    states = inventory_states(lab, plane)
    assert set(states.values()) == {"running"}, states
    for v in lab["vms"]:
        if v["site"] == "primary":
            assert Path(f"/proc/{v['pid']}").exists(), f"{v['name']} QEMU is gone"
    assert c.get("/v1/groups/app").json()["enabled"] is True


def _patch_dr(c: TestClient, ceph: dict[str, Any] | None, check: bool = True) -> Any:
    """`PATCH /v1/sites/{dr}`: the DR site's Ceph access as the operator sets it."""
    sid = next(s["id"] for s in c.get("/v1/sites").json()["items"] if s["name"] == "dr")
    return c.patch(f"/v1/sites/{sid}", json={"ceph": ceph, "check": check})


def test_a_failover_that_cannot_succeed_leaves_production_running(
        lab: dict[str, Any], agents: list[dict[str, Any]], plane: Plane,
        client: TestClient) -> None:
    """Real agents, real QEMU, the control plane with no usable DR site:
    each planned failover is refused at the request with a problem naming
    the failed precondition, and the primary agents still report every VM
    running.  In turn, each set through the sites API: no Ceph access for
    DR; a DR site whose mon does not answer; then, the DR site's access
    restored, the DR agent does not know the VMs (restarted without its
    standbys); the DR agent down."""
    from cutpoint.lab.agents import start_agent, stop_agent_pid
    from cutpoint.lab.sites import access

    c = client
    plane.start("worker")
    register(c, lab, plane)
    _production_runs(c, lab, plane)
    print()

    r = _patch_dr(c, None)
    assert r.status_code == 200 and r.json()["ceph"] is None, r.text
    p = _refused(c, 409, "no_ceph_site", "dr_site_reachable")
    assert "site 'dr' has no Ceph access: set it with PATCH /v1/sites/" in p["detail"], p
    _production_runs(c, lab, plane)

    # Mon addresses where nothing answers.  The site check refuses to store
    # them; an operator can still store them unchecked (`check: false`).
    dead = {**access(lab, "dr"), "ceph_conf": None, "mon_host": ["v2:127.0.0.1:9"],
            "connect_timeout_s": 3}
    r = _patch_dr(c, dead)
    assert r.status_code == 503 and r.json()["code"] == "site_check_failed", r.text
    r = _patch_dr(c, dead, check=False)
    assert r.status_code == 200 and r.json()["ceph"]["mon_host"] == dead["mon_host"], r.text
    t0 = time.monotonic()
    p = _refused(c, 503, "ceph_unreachable", "dr_site_reachable")
    assert time.monotonic() - t0 < 15
    assert {ch["name"]: ch["status"] for ch in p["checks"]}["dr_agents_ready"] == "pass"
    _production_runs(c, lab, plane)

    # The lab's access again, checked.
    r = _patch_dr(c, {**access(lab, "dr"), "mon_host": None, "connect_timeout_s": 10})
    assert r.status_code == 200 and r.json()["last_check"]["ok"], r.text
    # The DR site answers, but its agent no longer defines the standbys (the
    # control plane's inventory, synced before, still says it does).
    dr = next(h for h in lab["hosts"] if h["site"] == "dr")
    certs = Path(lab["state_dir"]) / "certs"
    stop_agent_pid(next(a["pid"] for a in agents if a["host"] == dr["name"]))
    start_agent(lab, dr, certs, standby=False)
    try:
        p = _refused(c, 409, "dr_agent_unknown_vm", "dr_agents_ready")
        primaries = sorted(v["name"] for v in lab["vms"] if v["site"] == "primary")
        for name in primaries:
            assert f"{name}: agent {dr['address']}:7443 does not define it" in p["detail"], p
        assert [ch["status"] for ch in p["checks"]] == ["pass", "skip", "fail", "pass"]
        _production_runs(c, lab, plane)
        # The DR agent down: 503, within the check deadline.
        stop_agent_pid(int((Path(lab["state_dir"]) / "agents" / dr["name"] / "agent.pid")
                           .read_text()))
        p = _refused(c, 503, "dr_agent_unreachable", "dr_agents_ready")
        _production_runs(c, lab, plane)
    finally:
        start_agent(lab, dr, certs)  # as the fixture started it, standbys defined
    # With everything back the checks pass (no failover is asked for here).
    with plane.sf() as s:
        from cutpoint.api.models import Group
        from cutpoint.api.services import failover_checks

        g = s.scalar(select(Group).where(Group.name == "app"))
        checks = failover_checks.run(s, plane.settings, g, failover_checks.members(s, g, None),
                                     None)
        assert [ch.status for ch in checks] == ["pass", "skip", "pass", "pass"], checks


def test_planned_failover_through_the_api(lab: dict[str, Any], plane: Plane,
                                          client: TestClient) -> None:
    from cutpoint.lab.drillboot import stop_guests, stop_standbys

    c = client
    t_start = time.monotonic()
    plane.start("worker")
    register(c, lab, plane)
    first = snapshot_and_replicate(c, plane)
    second = snapshot_and_replicate(c, plane)
    assert all(m["full"] for m in first["members"]), first
    assert not any(m["full"] for m in second["members"]), second
    print(f"\nreplicated: {first['txn']} (full, {first['bytes_shipped']} B), "
          f"{second['txn']} (incremental, {second['bytes_shipped']} B)")
    primaries = [v for v in lab["vms"] if v["site"] == "primary"]
    assert len(primaries) == 2
    assert set(inventory_states(lab, plane).values()) == {"running"}

    t_before = time.time()
    r = c.post("/v1/groups/app/failover", json={"mode": "planned"})
    t_posted = time.time()
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    guests: list[dict[str, Any]] = []
    try:
        job = finish(c, job_id, "the failover job", plane, 480, follow=True)
        t_seen = time.time()
        res = job["result"] or {}
        guests = list(res.get("guests") or [])
        assert job["state"] == "succeeded", (job["error_code"], job["error"], plane.tail())

        # RTO from the request: the origin is stamped inside our POST, the
        # worker's queue wait covers Job.started_at, and the RTO is no
        # longer than what we saw from before the POST to seeing the result.
        assert t_before <= res["requested_at"] <= t_posted, (t_before, res["requested_at"])
        bd = res["breakdown"]
        started = dt.datetime.fromisoformat(job["started_at"]).timestamp()
        # (later than Job.started_at only if the first delivery found the
        # group locked and retried)
        assert bd["queue_wait_s"] >= started - res["requested_at"] - 0.5, (bd, started)
        assert 0 < res["rto_s"] <= t_seen - t_before, (res["rto_s"], t_seen - t_before)
        steps = [e["step"] for e in res["timeline"]]
        assert steps[0] == "request" and steps[-1] == "running", steps
        for k in ("final_snapshot_s", "replication_s", "fence_s", "stopped_snapshot_s",
                  "stopped_replication_s", "rollback_s", "boot_s"):
            assert bd[k] is not None and bd[k] >= 0, (k, bd)
        parts = sum(v for v in bd.values() if v is not None)
        assert abs(parts - res["rto_s"]) < 0.05, (parts, res["rto_s"])
        print(f"failover RTO {res['rto_s']:.1f} s from the request "
              f"(test saw {t_seen - t_before:.1f} s); breakdown {bd}")

        # Every step is a job event with its time, in the order it happened;
        # the last is the last VM running, at the RTO.
        evs = c.get(f"/v1/jobs/{job_id}/events").json()
        names = [e["step"] for e in evs]
        assert names[0] == "request" and names[-1] == "running", names
        for step in ("worker_start", "preconditions", "final_snapshot", "replicated", "fence",
                     "stopped_snapshot", "stopped_replicated", "epoch", "failover_start",
                     "rollback", "vm_start", "ready"):
            assert step in names, (step, names)
        assert [e["seq"] for e in evs] == list(range(1, len(evs) + 1))
        assert [e["at"] for e in evs] == sorted(e["at"] for e in evs)
        checks = [e for e in evs if e["step"] == "precondition"]
        assert {e["detail"]["at"] for e in checks} == {"request", "job"}
        assert all(e["status"] in ("ok", "skipped") for e in checks), checks
        assert abs(evs[-1]["t_s"] - res["rto_s"]) < 0.01, (evs[-1], res["rto_s"])
        epoch_ev = evs[names.index("epoch")]["detail"]
        assert epoch_ev["epoch"] == 1 and len(epoch_ev["dr_images_marked"]) == 4, epoch_ev
        print(f"job events: {len(evs)} ({', '.join(dict.fromkeys(names))})")

        # Two final snapshots, both replicated: one with the guests running,
        # then one of the stopped disks, which is the recovery point.
        assert res["recovery_point"] not in (first["txn"], second["txn"])
        assert res["stopped_snapshot_id"] == res["snapshot_id"], res
        online = c.get(f"/v1/snapshots/{res['online_snapshot_id']}/replication").json()
        final = c.get(f"/v1/snapshots/{res['snapshot_id']}/replication").json()
        assert online["recovery_point"] and final["recovery_point"], (online, final)
        assert final["txn"] == res["recovery_point"]
        assert res["snapshot_name"] == f"cp.app.{final['txn']}"
        assert not any(m["full"] for m in online["members"] + final["members"])
        print(f"final snapshots: online {online['txn']} ({online['bytes_shipped']} B), "
              f"stopped {final['txn']} ({final['bytes_shipped']} B)")

        # Fencing: epoch 1, DR active, the schedule is off.
        assert res["fence"]["epoch"] == 1, res["fence"]
        assert res["fence"]["unreachable"] == [], res["fence"]
        assert sorted(res["fence"]["stopped"]) == sorted(v["name"] for v in primaries)
        rep = c.get("/v1/groups/app/replication").json()
        assert (rep["fencing_epoch"], rep["active_site"]) == (1, "dr"), rep
        with plane.sf() as s:
            fe = s.scalars(select(FencingEpoch)).all()
            assert [(f.epoch, f.active_site, f.fenced_site, f.job_id) for f in fe] \
                == [(1, "dr", "primary", job_id)]
        assert c.get("/v1/groups/app").json()["enabled"] is False

        # The primary guests are gone.
        for v in primaries:
            assert not Path(f"/proc/{v['pid']}").exists(), f"{v['name']} still runs"
        states = inventory_states(lab, plane)
        assert "running" not in states.values(), states
        print(f"primary after fencing: {states}")

        # The DR guests run, in the DR host's namespace, and are ready; the
        # DR host's agent (the registered one) started them and lists them.
        dr_ns = {h["netns"] for h in lab["hosts"] if h["site"] == "dr"}
        dr_agents = {f"{h['address']}:7443" for h in lab["hosts"] if h["site"] == "dr"}
        assert sorted(g["vm"] for g in guests) == sorted(v["name"] for v in primaries)
        assert inventory_states(lab, plane, "dr") == {v["name"]: "running" for v in primaries}
        for g in guests:
            assert g.get("agent") in dr_agents, g
            assert Path(f"/proc/{g['pid']}").exists(), g
            assert g["netns"] in dr_ns, g
            assert "cp-init: ready" in Path(g["console"]).read_text(errors="replace"), g

        # The writer checker on the DR images the guests run from.  Nothing
        # written before the fence is lost: DR holds the same records as the
        # primary's disks as the fence left them (its stopped snapshot), more
        # than the online final snapshot had.
        images = [d["image"] for v in primaries for d in v["disks"]]
        at_dr = writer_verdict(lab_site(lab, "dr"), images, None)
        assert at_dr.ok and at_dr.p > 0, at_dr.summary()
        stopped = writer_verdict(lab_site(lab, "primary"), images,
                                 f"cp.app.{res['recovery_point']}")
        assert stopped.ok and stopped.p == at_dr.p, (stopped.summary(), at_dr.summary())
        at_online = writer_verdict(lab_site(lab, "primary"), images, f"cp.app.{online['txn']}")
        assert at_online.ok and at_online.p <= at_dr.p, at_online.summary()
        print(f"writer at DR: {at_dr.summary()}; the online final snapshot had "
              f"p={at_online.p}: {at_dr.p - at_online.p} records written between its cut "
              f"and the fence are at DR through the stopped-disk snapshot")
    finally:
        stop_guests(guests)
        stop_standbys(lab)  # any the job did not report (a failed job)
    for g in guests:
        assert not Path(f"/proc/{g['pid']}").exists(), f"DR guest {g['vm']} left running"
    print(f"test time {time.monotonic() - t_start:.0f} s")


def test_unplanned_failover_records_an_unreachable_primary(
        lab: dict[str, Any], agents: list[dict[str, Any]], plane: Plane,
        client: TestClient) -> None:
    """Unplanned, one primary agent down: its host is recorded, not waited for."""
    from cutpoint.lab.agents import stop_agent_pid
    from cutpoint.lab.drillboot import stop_guests, stop_standbys

    c = client
    plane.start("worker")
    register(c, lab, plane)
    point = snapshot_and_replicate(c, plane)
    primaries = sorted((v for v in lab["vms"] if v["site"] == "primary"),
                       key=lambda v: v["index"])
    up, down = primaries
    stop_agent_pid(next(a["pid"] for a in agents if a["host"] == down["host"]))

    r = c.post("/v1/groups/app/failover", json={"mode": "unplanned"})
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    guests: list[dict[str, Any]] = []
    try:
        job = finish(c, job_id, "the failover job", plane, 480, follow=True)
        res = job["result"] or {}
        guests = list(res.get("guests") or [])
        assert job["state"] == "succeeded", (job["error_code"], job["error"], plane.tail())
        assert res["recovery_point"] == point["txn"]  # "latest": the newest DR point
        bd = res["breakdown"]
        assert bd["final_snapshot_s"] is None and bd["stopped_snapshot_s"] is None, bd
        assert bd["fence_s"] is not None and bd["boot_s"] is not None, bd
        fence = res["fence"]
        assert fence["stopped"] == [up["name"]], fence
        assert [u["host"] for u in fence["unreachable"]] == [down["host"]], fence
        assert fence["epoch"] == 1
        print(f"\nunplanned RTO {res['rto_s']:.1f} s; breakdown {bd}; unreachable "
              f"{fence['unreachable'][0]['error'][:120]}")
        assert not Path(f"/proc/{up['pid']}").exists(), f"{up['name']} still runs"
        # The unreachable host's guest still runs: fencing epoch 1 is what
        # makes its later writes detectable.
        assert Path(f"/proc/{down['pid']}").exists(), f"{down['name']} was stopped"
        rep = c.get("/v1/groups/app/replication").json()
        assert (rep["fencing_epoch"], rep["active_site"]) == (1, "dr"), rep
        assert sorted(g["vm"] for g in guests) == [up["name"], down["name"]]
        images = [d["image"] for v in primaries for d in v["disks"]]
        at_dr = writer_verdict(lab_site(lab, "dr"), images, None)
        at_point = writer_verdict(lab_site(lab, "primary"), images, f"cp.app.{point['txn']}")
        assert at_dr.ok and at_dr.p == at_point.p > 0, (at_dr.summary(), at_point.summary())
    finally:
        stop_guests(guests)
        stop_standbys(lab)
