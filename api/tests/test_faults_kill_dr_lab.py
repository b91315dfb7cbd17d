"""The fault matrix, kill -9 during a failover or a drill (docs/reliability.md,
"Fault matrix"): of Redis (the broker and the group locks), of an agent,
of a Ceph daemon; one fault per test.

The control plane of test_faults_dr_lab.py (a Celery worker on a Redis of
the test's own, the lab's booter; group lock TTL 6 s here, so that a lost
Redis is noticed within 2 s of a heartbeat), on the fault lab with the
writer workload in the guests (faultkit `WRITER_MARKS`): a drill's writer
check then has records to pass on, so that a drill can succeed.
Each cell replicates a recovery point, starts the failover or the drill,
kills the part once the job has reached the step named, brings it back
(Redis and a worker that exited with it; the agent; the daemon), and
asserts the matrix's outcomes:

- the job ends once: `succeeded`, or `failed` with a code, a reason, and
  (a failover) its stage, `production_touched` and a next step; asked
  again, it succeeds (retryable);
- a failover: each DR VM started once per run that booted it, and never
  while it runs (a failed run stops what it started on its way out; the
  run asked again starts only what does not run, and rolls back no image
  under a VM that runs); the primary VMs stopped; one fencing epoch;
- a drill: nothing of it left at DR (no clone, no QEMU of its tag, the
  recovery point unprotected); production running throughout.

The Ceph daemon is the DR site's mon: its store is on disk, so kill -9 and
a restart lose nothing.  The lab's OSDs keep their objects in memory
(memstore): a kill -9 of one loses the site's data, which no product step
could survive; the hung-OSD cells (SIGSTOP) cover the OSD.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cutpoint.api.models import FencingEpoch
from fastapi.testclient import TestClient
from faultkit import (  # api/tests/faultkit.py
    WRITER_MARKS,
    fault_plane,
    kill9_redis,
    redis_box_fixture,  # noqa: F401  (the fixture `redis_box`)
    restart_redis,
)
from labflow import finish, inventory_states, register, snapshot_and_replicate
from plane import Plane, wait_for  # api/tests/plane.py
from sqlalchemy import select
from test_faults_dr_lab import (  # api/tests/test_faults_dr_lab.py
    _dr_agent_log,
    _dr_images,
    _events,
    _point_unprotected_production_running,
    _qemus,
    _started,
)

pytestmark = [*WRITER_MARKS, pytest.mark.slow]

HOLD_S = 5.0    # at most this long the killed part stays gone, unless the job ends
DONE = ("succeeded", "failed")


@pytest.fixture
def plane(lab: dict[str, Any], agents: list[dict[str, Any]], tmp_path: Path,
          redis_box: dict[str, Any]) -> Iterator[Plane]:
    with fault_plane(lab, tmp_path, redis_box["port"], CUTPOINT_GROUP_LOCK_TTL_S="6",
                     CP_DRILL_DIR=str(tmp_path / "drills")) as p:
        yield p


# -- the faults: each returns what brings the part back ------------------------------
def _redis(redis_box: dict[str, Any], plane: Plane) -> Callable[[], Callable[[], None]]:
    def inject() -> Callable[[], None]:
        at = len(plane.log.read_text(errors="replace"))
        kill9_redis(redis_box)

        def heal() -> None:
            restart_redis(redis_box)
            # Celery's worker exits when its broker goes (kombu's reconnect:
            # "Unrecoverable error: AttributeError(... 'hostname')"), after
            # its running task ends; the control plane's unit restarts it
            # (Restart=always), and so does the cell.
            w = plane.procs["worker"]
            t0 = time.monotonic()
            while w.poll() is None and time.monotonic() - t0 < 60:
                if "Unrecoverable error" not in plane.log.read_text(errors="replace")[at:] \
                        and time.monotonic() - t0 > 3:
                    return      # it kept running
                time.sleep(0.2)
            assert w.poll() is not None, "the worker neither exited nor kept going"
            print(f"the worker exited (rc {w.returncode}) with Redis gone: started again")
            plane.start("worker")
        return heal
    return inject


def _dr_agent(lab: dict[str, Any], agents: list[dict[str, Any]]) -> Callable[[], Callable[[], None]]:
    from cutpoint.lab.agents import start_agent
    from cutpoint.lab.proc import pid_alive

    dr = next(h for h in lab["hosts"] if h["site"] == "dr")
    pidfile = Path(next(a["log"] for a in agents if a["host"] == dr["name"])).with_name(
        "agent.pid")

    def inject() -> Callable[[], None]:
        pid = int(pidfile.read_text().strip())
        os.kill(pid, signal.SIGKILL)
        while pid_alive(pid):
            time.sleep(0.01)

        def heal() -> None:
            start_agent(lab, dr, Path(lab["state_dir"]) / "certs").pop("popen", None)
        return heal
    return inject


def _dr_mon(lab: dict[str, Any]) -> Callable[[], Callable[[], None]]:
    from faultkit import kill9_ceph, restart_ceph

    def inject() -> Callable[[], None]:
        kill9_ceph(lab, "dr", "mon.a")
        return lambda: restart_ceph(lab, "dr", "mon.a")
    return inject


# -- the steps -------------------------------------------------------------------------
def _epochs(plane: Plane) -> list[tuple[int, str]]:
    with plane.sf() as s:
        return [(f.epoch, f.active_site) for f in s.scalars(select(FencingEpoch))]


def _failover_cell(c: TestClient, lab: dict[str, Any], agents: list[dict[str, Any]],
                   plane: Plane, at: str, inject: Callable[[], Callable[[], None]],
                   what: str) -> None:
    """An unplanned failover; `inject()` once the job has logged step `at`."""
    from cutpoint.lab.drillboot import stop_guests, stop_standbys

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
        def reached() -> list[str] | None:
            steps = [e["step"] for e in _events(c, job_id)]
            assert c.get(f"/v1/jobs/{job_id}").json()["state"] not in DONE, steps
            return steps if at in steps else None
        steps = wait_for(reached, 300, f"the failover at {at}", plane, every=0.05)
        t0 = time.monotonic()
        heal = inject()
        print(f"\n{what} killed at {steps}")
        try:
            wait_for(lambda: c.get(f"/v1/jobs/{job_id}").json()["state"] in DONE, HOLD_S,
                     "the job with the part gone", plane)
        except AssertionError:
            pass
        heal()
        job = finish(c, job_id, f"the failover after {what} came back", plane, 420)
        res = job["result"] or {}
        print(f"failover {job['state']} {time.monotonic() - t0:.1f} s after the kill, attempts "
              f"{job['attempts']}: {job['error_code']}: {job['error']}\nstage "
              f"{res.get('stage')}, production_touched {res.get('production_touched')}, next "
              f"{res.get('next_step')}; steps {[e['step'] for e in _events(c, job_id)]}")
        if job["state"] == "failed":
            assert job["error_code"] and job["error"] and res.get("stage"), job
            assert res.get("next_step"), res
            if "running" not in inventory_states(lab, plane).values():
                assert res.get("production_touched"), res
            # What the failed job started at DR runs on: the failover asked
            # again must not roll an image back under it.
            running = {vm for vm, st in inventory_states(lab, plane, "dr").items()
                       if st == "running"}
            first = _started(dr_log, off)
            r = c.post("/v1/groups/app/failover", json={"mode": "unplanned"})
            assert r.status_code == 202, r.text
            job = finish(c, r.json()["id"], "the failover asked again", plane, 420)
            rolled = [img for e in _events(c, job["id"]) if e["step"] == "rollback"
                      for img in e["detail"].get("rolled_back") or []]
            print(f"asked again: {job['state']} {job['error_code']}: {job['error']}; DR VMs "
                  f"running before it {sorted(running)}; it rolled back {rolled}")
            assert not [img for img in rolled for vm in running if img.startswith(f"{vm}-")], \
                (rolled, running)
            # It starts what does not run (a failed job stops what it
            # started on its way out), and nothing that runs.
            expect = {vm: first.get(vm, 0) + (vm not in running) for vm in primaries}
        else:
            expect = dict.fromkeys(primaries, 1)
        assert job["state"] == "succeeded", job
        assert job["result"]["recovery_point"] == point["txn"], job["result"]
        guests = list(job["result"].get("guests") or [])
        starts = _started(dr_log, off)
        print(f"DR starts {starts}; DR {inventory_states(lab, plane, 'dr')}; primary "
              f"{inventory_states(lab, plane)}; epochs {_epochs(plane)}")
        assert starts == expect, (starts, expect)
        assert inventory_states(lab, plane, "dr") == dict.fromkeys(primaries, "running")
        assert "running" not in inventory_states(lab, plane).values()
        assert _epochs(plane) == [(1, "dr")]
    finally:
        stop_guests(guests)
        stop_standbys(lab)


def _drill_cell(c: TestClient, lab: dict[str, Any], plane: Plane,
                inject: Callable[[], Callable[[], None]], what: str) -> None:
    """A drill; `inject()` while its clones boot at DR."""
    plane.start("worker")
    register(c, lab, plane)
    point = snapshot_and_replicate(c, plane)
    r = c.post("/v1/groups/app/drills", json={"recovery_point": point["txn"]})
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    tag = f"drill-{job_id.replace('-', '')[:8]}"

    def booting() -> list[str] | None:
        j = c.get(f"/v1/jobs/{job_id}").json()
        assert j["state"] not in DONE, j
        q = _qemus(tag)
        return q if q and j["message"].startswith("boot") else None
    wait_for(booting, 300, "the drill's clones booting", plane, every=0.2)
    t0 = time.monotonic()
    heal = inject()
    print(f"\n{what} killed while the drill boots")
    try:
        wait_for(lambda: c.get(f"/v1/jobs/{job_id}").json()["state"] in DONE, HOLD_S,
                 "the job with the part gone", plane)
    except AssertionError:
        pass
    heal()
    job = finish(c, job_id, f"the drill after {what} came back", plane, 420)
    res = job["result"] or {}
    left = {"clones": _dr_images(lab, f"{tag}-"), "qemu": _qemus(tag)}
    print(f"drill {job['state']} {time.monotonic() - t0:.1f} s after the kill, attempts "
          f"{job['attempts']}: {job['error_code']}: {job['error']}; verdict "
          f"{res.get('verdict')}; cleanup {res.get('cleanup')}; left {left}")
    assert left == {"clones": [], "qemu": []}, left
    _point_unprotected_production_running(lab, plane, point)
    if job["state"] == "failed":
        assert job["error_code"] and job["error"], job
        r = c.post("/v1/groups/app/drills", json={"recovery_point": point["txn"]})
        assert r.status_code == 202, r.text
        job = finish(c, r.json()["id"], "the drill asked again", plane, 420)
        print(f"asked again: {job['state']} {job['error_code']}: {job['error']}")
    assert job["state"] == "succeeded", job
    assert (job["result"] or {}).get("verdict") == "passed", job["result"]
    _point_unprotected_production_running(lab, plane, point)


# -- the cells: the drills first (they leave the lab as it was), then the
# failovers (each leaves the primary VMs stopped: the next test gets a fresh lab)
def test_redis_kill9_mid_drill(lab: dict[str, Any], agents: list[dict[str, Any]],
                               plane: Plane, client: TestClient,
                               redis_box: dict[str, Any]) -> None:
    """kill -9 of Redis while the drill's clones boot."""
    _drill_cell(client, lab, plane, _redis(redis_box, plane), "Redis")


def test_dr_agent_kill9_mid_drill(lab: dict[str, Any], agents: list[dict[str, Any]],
                                  plane: Plane, client: TestClient) -> None:
    """kill -9 of the DR host's agent while the drill's clones boot there."""
    _drill_cell(client, lab, plane, _dr_agent(lab, agents), "the DR agent")


def test_dr_mon_kill9_mid_drill(lab: dict[str, Any], agents: list[dict[str, Any]],
                                plane: Plane, client: TestClient) -> None:
    """kill -9 of the DR site's Ceph mon while the drill's clones boot."""
    _drill_cell(client, lab, plane, _dr_mon(lab), "the DR mon")


def test_redis_kill9_mid_failover(lab: dict[str, Any], agents: list[dict[str, Any]],
                                  plane: Plane, client: TestClient,
                                  redis_box: dict[str, Any]) -> None:
    """kill -9 of Redis once the failover has started booting at DR."""
    _failover_cell(client, lab, agents, plane, "vm_start", _redis(redis_box, plane), "Redis")


def test_dr_agent_kill9_mid_failover(lab: dict[str, Any], agents: list[dict[str, Any]],
                                     plane: Plane, client: TestClient) -> None:
    """kill -9 of the DR host's agent once the failover has passed its
    preconditions (it then fences, rolls back and asks that agent to start
    the VMs)."""
    _failover_cell(client, lab, agents, plane, "preconditions", _dr_agent(lab, agents),
                   "the DR agent")


def test_dr_mon_kill9_mid_failover(lab: dict[str, Any], agents: list[dict[str, Any]],
                                   plane: Plane, client: TestClient) -> None:
    """kill -9 of the DR site's Ceph mon once the failover has passed its
    preconditions (its rollback and boot at DR need the DR cluster)."""
    _failover_cell(client, lab, agents, plane, "preconditions", _dr_mon(lab), "the DR mon")
