"""The fault matrix, DR cells (docs/reliability.md, "Fault matrix"): kill -9
of the worker in the middle of a failover and of a drill.

Same lab as the other cells (faultkit.MARKS); the control plane on a Redis
of the test's own (faultkit `fault_plane`, `redis_box`), the lab's booter.
Each cell takes minutes (a full replication, a boot at DR under TCG) and
the failover cell leaves the primary VMs stopped (the next test gets a
fresh lab): all are `slow`, out of `make faults`, run by `make faults-slow`
(.ci/run's last stage).
Each asserts the matrix's outcomes where they apply: the job ends in a
clear state with its reason, nothing at DR started twice or left running
half-way, production running (a drill) or stopped with a recorded reason
(a failover).
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cutpoint.api.models import FencingEpoch
from fastapi.testclient import TestClient
from faultkit import (  # api/tests/faultkit.py
    MARKS,
    fault_plane,
    redis_box_fixture,  # noqa: F401  (the fixture `redis_box`)
)
from labflow import finish, inventory_states, lab_site, register, snapshot_and_replicate
from plane import Plane, wait_for  # api/tests/plane.py
from sqlalchemy import select

pytestmark = [*MARKS, pytest.mark.slow]


@pytest.fixture
def plane(lab: dict[str, Any], agents: list[dict[str, Any]], tmp_path: Path,
          redis_box: dict[str, Any]) -> Iterator[Plane]:
    with fault_plane(lab, tmp_path, redis_box["port"],
                     CP_DRILL_DIR=str(tmp_path / "drills")) as p:
        yield p


def _events(c: TestClient, job_id: str) -> list[dict[str, Any]]:
    return list(c.get(f"/v1/jobs/{job_id}/events").json())


def _dr_agent_log(agents: list[dict[str, Any]], lab: dict[str, Any]) -> Path:
    dr = next(h["name"] for h in lab["hosts"] if h["site"] == "dr")
    return Path(next(a["log"] for a in agents if a["host"] == dr))


def _started(log: Path, offset: int) -> dict[str, int]:
    """VM -> how many times the DR agent started it (not found running) since `offset`."""
    out: dict[str, int] = {}
    for m in re.finditer(r"event=vm_start vm=(\S+) result=started",
                         log.read_text(errors="replace")[offset:]):
        out[m.group(1)] = out.get(m.group(1), 0) + 1
    return out


def test_worker_kill9_mid_failover(lab: dict[str, Any], agents: list[dict[str, Any]],
                                   plane: Plane, client: TestClient) -> None:
    """kill -9 of the worker (its process group) once the unplanned failover
    has fenced the primary and started booting at DR; a new worker: the job
    ends once, succeeded or failed with its stage and reason; every DR VM
    started once, none twice; the primary VMs stopped, the stop recorded;
    one fencing epoch."""
    from cutpoint.lab.drillboot import stop_guests, stop_standbys

    c = client
    plane.start("worker")
    register(c, lab, plane)
    point = snapshot_and_replicate(c, plane)
    primaries = sorted(v["name"] for v in lab["vms"] if v["site"] == "primary")
    dr_log = _dr_agent_log(agents, lab)
    off = len(dr_log.read_text(errors="replace"))
    r = c.post("/v1/groups/app/failover", json={"mode": "unplanned"})
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    guests: list[dict[str, Any]] = []
    try:
        def booting() -> list[str] | None:
            steps = [e["step"] for e in _events(c, job_id)]
            assert "failed" not in steps, steps
            return steps if "vm_start" in steps else None
        t0 = time.monotonic()
        at_kill = wait_for(booting, 300, "the failover booting at DR", plane, every=0.1)
        plane.kill9("worker")
        job = c.get(f"/v1/jobs/{job_id}").json()
        print(f"\nworker killed {time.monotonic() - t0:.1f} s into the failover, job "
              f"{job['state']} ({job['message']}); steps {at_kill}; "
              f"DR starts so far {_started(dr_log, off)}")
        assert job["state"] == "running", job
        plane.start("worker")
        t1 = time.monotonic()
        job = finish(c, job_id, "the failover job after a new worker", plane, 420)
        res = job["result"] or {}
        guests = list(res.get("guests") or [])
        starts = _started(dr_log, off)
        steps = [e["step"] for e in _events(c, job_id)]
        print(f"new worker: job {job['state']} {time.monotonic() - t1:.1f} s after, attempts "
              f"{job['attempts']}, {job['error_code']}: {job['error']}; DR starts {starts}; "
              f"steps {steps}")
        if job["state"] == "succeeded":
            assert res["recovery_point"] == point["txn"], res
            assert inventory_states(lab, plane, "dr") == {n: "running" for n in primaries}
        else:
            assert job["error_code"] and job["error"] and res.get("stage"), job
            # What it says of production is true: the primary VMs were stopped.
            assert res.get("production_touched") and res.get("next_step"), res
        # Nothing at DR started twice, and no image rolled back under a DR
        # VM the first attempt had started.
        assert all(n == 1 for n in starts.values()), starts
        rolled = [e["detail"].get("rolled_back") for e in _events(c, job_id)
                  if e["step"] == "rollback"]
        print(f"rollbacks (images rolled back, per attempt): {rolled}")
        assert not any(rolled[1:]), rolled
        # The primary VMs: stopped by the fence, and the job says so.
        states = inventory_states(lab, plane)
        fenced = {vm for e in _events(c, job_id) if e["step"] == "fence"
                  for vm in (e["detail"].get("stopped") or [])}
        print(f"primary {states}; fence events stopped {sorted(fenced)}")
        assert "running" not in states.values(), states
        assert set(primaries) <= fenced, (fenced, primaries)
        with plane.sf() as s:
            epochs = [(f.epoch, f.active_site) for f in s.scalars(select(FencingEpoch))]
        assert epochs == [(1, "dr")], epochs
    finally:
        stop_guests(guests)
        stop_standbys(lab)


def _dr_images(lab: dict[str, Any], prefix: str) -> list[str]:
    from cutpoint.coordinator.dr.site import CephConnection

    with CephConnection(lab_site(lab, "dr")) as ceph:
        return [i for i in ceph.list_images("rbd") if i.startswith(prefix)]


def _qemus(tag: str) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True,
                        check=True).stdout
    return [ln.strip()[:120] for ln in ps.splitlines() if f"{tag}-" in ln and "qemu" in ln]


def _point_unprotected_production_running(lab: dict[str, Any], plane: Plane,
                                          point: dict[str, Any]) -> None:
    """After a drill: no DR snapshot of the recovery point is left protected
    (its clones are gone), and every primary VM runs, in its own QEMU."""
    from cutpoint.coordinator.dr.site import CephConnection
    from plane import agent_vm_states  # api/tests/plane.py

    with CephConnection(lab_site(lab, "dr")) as ceph:
        prot = [img for v in lab["vms"] if v["site"] == "primary" for img in
                (d["image"] for d in v["disks"])
                if ceph.is_protected("rbd", img, f"cp.app.{point['txn']}")]
    assert prot == [], prot
    assert set(agent_vm_states(lab, plane).values()) == {"running"}
    for v in lab["vms"]:
        if v["site"] == "primary":
            assert Path(f"/proc/{v['pid']}").exists(), v["name"]


def test_worker_kill9_mid_drill(lab: dict[str, Any], agents: list[dict[str, Any]],
                                plane: Plane, client: TestClient) -> None:
    """kill -9 of the worker while a drill's clones boot at DR; a new worker
    (the drill job redelivered): the drill is recorded failed,
    `drill_interrupted`, with the earlier attempt's guests stopped, clones
    removed and the recovery point unprotected; production ran throughout."""

    c = client
    plane.start("worker")
    register(c, lab, plane)
    point = snapshot_and_replicate(c, plane)
    r = c.post("/v1/groups/app/drills", json={"recovery_point": point["txn"]})
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    tag = f"drill-{job_id.replace('-', '')[:8]}"

    def booting() -> list[str] | None:
        j = c.get(f"/v1/jobs/{job_id}").json()
        assert j["state"] not in ("succeeded", "failed"), j
        q = _qemus(tag)
        return q if q and j["message"].startswith("boot") else None
    t0 = time.monotonic()
    wait_for(booting, 300, "the drill's clones booting", plane, every=0.2)
    plane.kill9("worker")
    left = {"clones": _dr_images(lab, f"{tag}-"), "qemu": _qemus(tag)}
    print(f"\nworker killed {time.monotonic() - t0:.1f} s into the drill: left {left}")
    assert left["clones"] and left["qemu"], left
    plane.start("worker")
    t1 = time.monotonic()
    job = finish(c, job_id, "the drill job after a new worker", plane, 300)
    print(f"new worker: drill {job['state']} {time.monotonic() - t1:.1f} s after, attempts "
          f"{job['attempts']}: {job['error_code']}: {job['error']}")
    assert (job["state"], job["error_code"]) == ("failed", "drill_interrupted"), job
    assert "interrupted" in job["error"] and "cleaned up" in job["error"], job["error"]
    # Nothing of the drill is left at DR.
    assert _dr_images(lab, f"{tag}-") == []
    assert _qemus(tag) == []
    _point_unprotected_production_running(lab, plane, point)


def test_blackhole_during_drill(lab: dict[str, Any], agents: list[dict[str, Any]],
                                plane: Plane, client: TestClient) -> None:
    """iptables DROP, in the DR host's namespace, of all traffic with the DR
    site's Ceph while a drill boots there (its clones' QEMUs cannot open
    their disks): the drill fails with a reason naming the boot, within the
    bounds of the boot (the lab booter's QEMU start, QEMU's Ceph op
    timeout); its clones and guests are gone, the recovery point
    unprotected; production ran throughout; with the path back, the group's
    next snapshot replicates into a recovery point."""
    from faultkit import blackhole, site_address

    c = client
    plane.start("worker")
    register(c, lab, plane)
    point = snapshot_and_replicate(c, plane)
    dr_host = next(h["name"] for h in lab["hosts"] if h["site"] == "dr")
    with blackhole(lab, dr_host, peer=site_address(lab, "dr")):
        t0 = time.monotonic()
        r = c.post("/v1/groups/app/drills", json={"recovery_point": point["txn"]})
        assert r.status_code == 202, r.text
        job_id = r.json()["id"]
        tag = f"drill-{job_id.replace('-', '')[:8]}"
        job = finish(c, job_id, "the drill with the DR host cut off from Ceph", plane, 420)
        took = time.monotonic() - t0
        res = job["result"] or {}
        steps = [(e["step"], e["status"]) for e in res.get("timeline") or []]
        print(f"\ndrill {job['state']} {took:.1f} s after the request: {job['error_code']}: "
              f"{job['error']}\nsteps {steps}\ncleanup {res.get('cleanup')}")
        assert (job["state"], job["error_code"]) == ("failed", "drill_failed"), job
        assert res.get("verdict") == "failed" and res.get("error"), res
        # The reason is the boot's, not a check's nor the cleanup's.
        assert "check" not in {s for s, _ in steps}, steps
        assert "BootError" in job["error"] and tag in job["error"], job["error"]
        # Bounded by the boot's own deadlines (the booter's QEMU start, 60 s), not the
        # drill's 240 s wait for the guests.
        assert took < 150, took
        # Cleaned up by the worker (its own path to the DR Ceph is intact).
        left = {"clones": _dr_images(lab, f"{tag}-"), "qemu": _qemus(tag)}
        print(f"left at DR with the DROP still on: {left}")
        assert res["cleanup"]["ok"], res["cleanup"]
        assert left == {"clones": [], "qemu": []}, left
    _point_unprotected_production_running(lab, plane, point)
    # The DROP lifted: replication of the group goes on.
    t1 = time.monotonic()
    nxt = snapshot_and_replicate(c, plane)
    print(f"next recovery point {nxt['txn']} {time.monotonic() - t1:.1f} s after the lift: "
          f"{nxt['state']}")
    assert nxt["state"] == "verified" and nxt["txn"] != point["txn"], nxt


def test_blackhole_during_failover(lab: dict[str, Any], agents: list[dict[str, Any]],
                                   plane: Plane, client: TestClient) -> None:
    """iptables DROP of the DR agent's port, in the DR host's namespace, once
    the unplanned failover job has passed its preconditions (it then stops
    the primary VMs, takes the epoch, rolls back and asks the DR agent to
    start the VMs): the job fails with its stage (`fenced`), the error
    naming `vm.start` on the DR agent, and a next step; no DR VM started,
    not even once the DROP is lifted; one fencing epoch.  The failover asked
    again with the path back reuses that epoch and starts each DR VM once."""
    from cutpoint.lab.drillboot import stop_guests, stop_standbys
    from faultkit import blackhole

    c = client
    plane.start("worker")
    register(c, lab, plane)
    point = snapshot_and_replicate(c, plane)
    primaries = sorted(v["name"] for v in lab["vms"] if v["site"] == "primary")
    dr_host = next(h["name"] for h in lab["hosts"] if h["site"] == "dr")
    dr_log = _dr_agent_log(agents, lab)
    off = len(dr_log.read_text(errors="replace"))
    guests: list[dict[str, Any]] = []
    try:
        with blackhole(lab, dr_host, now=False) as bh:
            r = c.post("/v1/groups/app/failover", json={"mode": "unplanned"})
            assert r.status_code == 202, r.text
            job_id = r.json()["id"]

            def checked() -> list[str] | None:
                steps = [e["step"] for e in _events(c, job_id)]
                return steps if "preconditions" in steps else None
            at_drop = wait_for(checked, 120, "the failover's preconditions", plane, every=0.05)
            bh.drop()
            t0 = time.monotonic()
            assert "vm_start" not in at_drop, at_drop
            job = finish(c, job_id, "the failover with the DR agent cut off", plane, 300)
            took = time.monotonic() - t0
            res = job["result"] or {}
            steps = [e["step"] for e in _events(c, job_id)]
            print(f"\nDROP after {at_drop}; failover {job['state']} {took:.1f} s after: "
                  f"{job['error_code']}: {job['error']}\nstage {res.get('stage')}, "
                  f"production_touched {res.get('production_touched')}; steps {steps}")
            assert job["state"] == "failed" and job["error_code"], job
            assert res.get("stage") == "fenced" and res.get("next_step"), res
            assert res.get("production_touched"), res
            assert "vm.start" in job["error"], job["error"]
            assert "vm_start" not in steps, steps
            # The boot's connect deadline (10 s) plus the job's own steps.
            assert took < 60, took
        # Lifted: nothing the failed job asked for starts late.
        time.sleep(5)
        assert _started(dr_log, off) == {}, _started(dr_log, off)
        assert set(inventory_states(lab, plane, "dr").values()) <= {"shutoff", "absent"}, \
            inventory_states(lab, plane, "dr")
        with plane.sf() as s:
            epochs = [(f.epoch, f.active_site) for f in s.scalars(select(FencingEpoch))]
        print(f"after the failed failover: epochs {epochs}; primary "
              f"{inventory_states(lab, plane)}")
        assert epochs == [(1, "dr")], epochs
        assert "running" not in inventory_states(lab, plane).values()
        # The failover asked again: the epoch reused, each DR VM started once.
        r = c.post("/v1/groups/app/failover", json={"mode": "unplanned"})
        assert r.status_code == 202, r.text
        job2 = finish(c, r.json()["id"], "the failover asked again", plane, 420)
        guests = list((job2["result"] or {}).get("guests") or [])
        starts = _started(dr_log, off)
        print(f"asked again: {job2['state']} {job2['error_code']}: {job2['error']}; "
              f"DR starts {starts}")
        assert job2["state"] == "succeeded", job2
        assert job2["result"]["recovery_point"] == point["txn"], job2["result"]
        assert starts == dict.fromkeys(primaries, 1), starts
        assert inventory_states(lab, plane, "dr") == dict.fromkeys(primaries, "running")
        with plane.sf() as s:
            epochs = [(f.epoch, f.active_site) for f in s.scalars(select(FencingEpoch))]
        assert epochs == [(1, "dr")], epochs
    finally:
        stop_guests(guests)
        stop_standbys(lab)
