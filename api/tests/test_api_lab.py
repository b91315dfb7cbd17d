"""The control plane on the lab: real agents, QEMU guests on RBD, Ceph.

- the scheduler keeps a group with rpo_seconds=10 compliant for 60 s, then a
  stopped agent produces recorded, visible RPO misses and the scheduler
  keeps running; retention then deletes old snapshots through the agents;
- a worker killed with kill -9 during a group snapshot leaves no VM paused
  and no half-committed snapshot, and the job is not duplicated.
"""

from __future__ import annotations

import json
import socket
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cutpoint.api import services_local
from cutpoint.api.models import GroupSnapshot, Job, SnapState
from fastapi.testclient import TestClient
from plane import (  # api/tests/plane.py
    Plane,
    agent_vm_states,
    lab_pin,
    lab_plane,
    register_lab_site,
    wait_for,
)
from sqlalchemy import func, select, text

pytestmark = [pytest.mark.lab,
              pytest.mark.lab_config(hosts=2, vms_per_host=1, disks=2, backend="rbd")]


@pytest.fixture
def plane(lab: dict[str, Any], agents: list[dict[str, Any]], tmp_path: Path,
          local_services: services_local.Endpoints) -> Iterator[Plane]:
    with lab_plane(lab, tmp_path, int(local_services.redis_port or 0),
                   CUTPOINT_GROUP_LOCK_TTL_S="6", CUTPOINT_BROKER_VISIBILITY_TIMEOUT_S="15",
                   CUTPOINT_RETENTION_INTERVAL_S="3600", CUTPOINT_INVENTORY_INTERVAL_S="3600") as p:
        yield p


def register(c: TestClient, lab: dict[str, Any], plane: Plane, rpo: int | None) -> str:
    register_lab_site(c, lab, "primary")
    for h in lab["hosts"]:
        if h["site"] != "primary":
            continue
        r = c.post("/v1/hosts", json={"name": h["name"], "site": "primary",
                                      "address": h["address"], "port": 7443,
                                      "cert_fingerprint": lab_pin(lab, h["name"])})
        assert r.status_code == 201, r.text
        job = c.post(f"/v1/hosts/{r.json()['id']}/sync").json()
        wait_for(lambda j=job: c.get(f"/v1/jobs/{j['id']}").json()["state"]
                 in ("succeeded", "failed"), 60, "inventory sync", plane)
        done = c.get(f"/v1/jobs/{job['id']}").json()
        assert done["state"] == "succeeded", done
    policy: dict[str, Any] = {"lease_ms": 3000, "pause_budget_ms": 2000, "keep_last": 100}
    if rpo:
        policy["rpo_seconds"] = rpo
    assert c.post("/v1/groups", json={"name": "app", "policy": policy}).status_code == 201
    for vm in lab["vms"]:
        if vm["site"] == "primary":
            r = c.post("/v1/groups/app/members", json={"vm": vm["name"]})
            assert r.status_code == 201, r.text
    return "app"


def rbd_snaps(lab: dict[str, Any]) -> dict[str, set[str]]:
    from cutpoint.lab.ceph import rbd_cmd

    site = lab["sites"]["primary"]
    out = {}
    for vm in lab["vms"]:
        if vm["site"] != "primary":
            continue
        for d in vm["disks"]:
            spec = f"{d['pool']}/{d['image']}"
            r = subprocess.run(rbd_cmd(site, "snap", "ls", "--format", "json", spec),
                               capture_output=True, text=True, check=True)
            out[spec] = {s["name"] for s in json.loads(r.stdout or "[]")}
    return out


def qmp_status(vm: dict[str, Any]) -> str:
    """QMP query-status straight on the VM's socket (when its agent is down);
    a libvirt domain: its state from its host's libvirtd (`running`,
    `paused`), which raw QMP would taint."""
    if vm.get("driver") == "libvirt":
        return subprocess.run(["virsh", "-c", vm["uri"], "domstate", vm["name"]],
                              capture_output=True, text=True, check=True).stdout.strip()
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(5)
        s.connect(vm["qmp"])
        f = s.makefile("rw")
        f.readline()
        for cmd in ({"execute": "qmp_capabilities"}, {"execute": "query-status"}):
            f.write(json.dumps(cmd) + "\n")
            f.flush()
            while True:
                msg = json.loads(f.readline())
                if "return" in msg or "error" in msg:
                    break
        return str(msg["return"]["status"])


WINDOW_S = 30  # seconds watched at a 10 s RPO


def test_scheduler_keeps_rpo_then_records_misses(lab: dict[str, Any], plane: Plane,
                                                 client: TestClient) -> None:
    c = client
    plane.start("worker")  # inventory sync runs as a job
    register(c, lab, plane, rpo=10)
    plane.start("beat")
    # The first capture is due at once; wait for it, then watch WINDOW_S
    # (three RPO periods: every one must be kept).
    wait_for(lambda: c.get("/v1/groups/app/rpo").json()["compliant"], 60,
             "the first recovery point", plane)
    samples = []
    t_end = time.monotonic() + WINDOW_S
    while time.monotonic() < t_end:
        r = c.get("/v1/groups/app/rpo").json()
        samples.append((r["achieved_rpo_s"], r["compliant"]))
        time.sleep(1)
    worst = max(s[0] for s in samples)
    snaps = c.get("/v1/groups/app/snapshots", params={"limit": 500}).json()["items"]
    committed = [s for s in snaps if s["state"] == "committed"]
    print(f"\n{WINDOW_S} s window: {len(samples)} samples, worst achieved RPO {worst:.2f} s, "
          f"{len(committed)} committed snapshots, "
          f"max pause {max(s['max_pause_ms'] for s in committed):.1f} ms")
    assert all(ok for _, ok in samples), samples
    assert worst <= 10
    assert len(committed) >= WINDOW_S // 10
    assert c.get("/v1/groups/app/rpo").json()["misses"] == 0
    # Every committed snapshot has every member snapshot in Ceph.
    have = rbd_snaps(lab)
    for s in committed:
        name = f"cp.app.{s['txn']}"
        assert all(name in names for names in have.values()), name

    # Stop one agent: captures fail, misses are recorded, the scheduler lives.
    from cutpoint.lab.agents import _pids, stop_agent_pid

    victim = min(_pids(lab))
    stop_agent_pid(victim)
    wait_for(lambda: c.get("/v1/groups/app/rpo").json()["misses"] >= 2, 60,
             "two RPO misses after the agent stopped", plane)
    for name, p in plane.procs.items():
        assert p.poll() is None, f"{name} died"
    misses = c.get("/v1/groups/app/rpo/misses").json()["items"]
    print("misses:", [(m["reason"], round(m["achieved_rpo_s"], 1)) for m in misses])
    assert any(m["reason"].startswith("snapshot_aborted:") for m in misses)
    metrics = c.get("/metrics").text
    assert 'cutpoint_rpo_misses_total{group="app"' in metrics
    assert "cutpoint_agent_reachable" in metrics and "} 0.0" in metrics
    # No VM is left paused, on either host.
    for vm in lab["vms"]:
        if vm["site"] == "primary":
            try:
                st = qmp_status(vm)
            except OSError:
                continue  # its agent holds the QMP socket: it is checked below
            assert st == "running", (vm["name"], st)
    # Aborted attempts left no member snapshot behind.
    have = rbd_snaps(lab)
    for s in c.get("/v1/groups/app/snapshots", params={"limit": 500}).json()["items"]:
        if s["state"] == "aborted":
            name = f"cp.app.{s['txn']}"
            assert not any(name in names for names in have.values()), name


def test_retention_deletes_through_agents(lab: dict[str, Any], plane: Plane,
                                          client: TestClient) -> None:
    c = client
    plane.start("worker")
    register(c, lab, plane, rpo=None)
    for _ in range(5):
        job = c.post("/v1/groups/app/snapshots").json()
        wait_for(lambda j=job: c.get(f"/v1/jobs/{j['id']}").json()["state"]
                 in ("succeeded", "failed"), 60, "snapshot job", plane)
        assert c.get(f"/v1/jobs/{job['id']}").json()["state"] == "succeeded"
    snaps = c.get("/v1/groups/app/snapshots").json()["items"]
    assert len(snaps) == 5
    etag = c.get("/v1/groups/app/policy").headers["ETag"]
    assert c.patch("/v1/groups/app/policy", json={"keep_last": 2},
                   headers={"If-Match": etag}).status_code == 200
    job = c.post("/v1/groups/app/retention").json()
    wait_for(lambda: c.get(f"/v1/jobs/{job['id']}").json()["state"]
             in ("succeeded", "failed"), 60, "retention job", plane)
    done = c.get(f"/v1/jobs/{job['id']}").json()
    assert done["state"] == "succeeded" and done["result"]["deleted"] == 3, done
    after = {s["txn"]: s["state"] for s in c.get("/v1/groups/app/snapshots").json()["items"]}
    newest_two = [s["txn"] for s in snaps[:2]]
    assert [after[t] for t in newest_two] == ["committed", "committed"]
    assert sorted(v for t, v in after.items() if t not in newest_two) == ["deleted"] * 3
    have = rbd_snaps(lab)
    for txn, state in after.items():
        present = [f"cp.app.{txn}" in names for names in have.values()]
        assert all(present) if state == "committed" else not any(present), (txn, state)


def test_worker_kill9_during_snapshot(lab: dict[str, Any], plane: Plane,
                                      client: TestClient) -> None:
    c = client
    plane.start("worker")
    register(c, lab, plane, rpo=None)
    eng_sf = plane.sf
    killed_in = None
    for _attempt in range(10):
        if "worker" not in plane.procs:
            plane.start("worker")
            time.sleep(3)  # let it connect to the broker
        job = c.post("/v1/groups/app/snapshots").json()
        sid = job["snapshot_id"]
        t_end = time.monotonic() + 30
        state = None
        # A plain read-only connection: WAL readers take no lock, so polling
        # does not slow the worker down.
        ro = sqlite3.connect(f"file:{plane.db.removeprefix('sqlite:///')}?mode=ro", uri=True)
        while time.monotonic() < t_end:
            row = ro.execute("SELECT state FROM coord_txn WHERE txn = "
                             "(SELECT txn FROM group_snapshots WHERE id = ?)", (sid,)).fetchone()
            state = row[0] if row else None
            if state in ("preparing", "committing"):
                plane.kill9("worker")
                killed_in = state
                break
            if state in ("committed", "aborted"):
                break
            time.sleep(0.002)
        ro.close()
        if killed_in:
            break
        wait_for(lambda j=job: c.get(f"/v1/jobs/{j['id']}").json()["state"]
                 in ("succeeded", "failed"), 60, "job", plane)
    assert killed_in, "never caught a snapshot in flight"
    print(f"\nworker killed with the txn in state {killed_in}")
    # Within lease + budget the agents resume every VM on their own.
    wait_for(lambda: set(agent_vm_states(lab, plane).values()) == {"running"}, 15,
             "every VM running after the worker was killed", plane)
    # A new worker (and beat, which resends orphaned jobs) finishes the txn.
    plane.start("worker")
    plane.start("beat")
    wait_for(lambda: c.get(f"/v1/jobs/{job['id']}").json()["state"]
             in ("succeeded", "failed"), 90, "the killed job to be finished", plane)
    snap = c.get(f"/v1/snapshots/{sid}").json()
    print("after restart:", snap["state"], snap["error_code"])
    assert snap["state"] in ("committed", "aborted")
    have = rbd_snaps(lab)
    present = [f"cp.app.{snap['txn']}" in names for names in have.values()]
    if snap["state"] == "committed":
        assert all(present) and all(m["state"] == "present" for m in snap["members"])
    else:
        assert not any(present)
    with eng_sf() as s:
        n_snap = s.scalar(select(func.count()).select_from(GroupSnapshot).where(
            GroupSnapshot.job_id == job["id"]))
        n_txn = s.scalar(text("SELECT count(*) FROM coord_txn WHERE txn = :t"),
                         {"t": snap["txn"]})
        inflight = s.scalar(select(func.count()).select_from(GroupSnapshot).where(
            GroupSnapshot.inflight_group_id.is_not(None)))
        jobs_for = s.scalar(select(func.count()).select_from(Job).where(
            Job.snapshot_id == sid))
        assert s.get(GroupSnapshot, sid).state in (SnapState.committed, SnapState.aborted)
    assert (n_snap, n_txn, inflight, jobs_for) == (1, 1, 0, 1)
    assert set(agent_vm_states(lab, plane).values()) == {"running"}
    # The group is usable again.
    job2 = c.post("/v1/groups/app/snapshots")
    assert job2.status_code == 202, job2.text
