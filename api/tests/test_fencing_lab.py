"""Fencing reaches replication, on the lab (suite `api-lab`): the real API, a
Celery worker, the agents, QEMU and both Ceph clusters.

The group (the writer ring across 2 VMs on 2 primary hosts, 2 RBD disks
each) gets two DR recovery points through the API, then fails over
(unplanned, from the newest).  The failover records fencing epoch 1 and
marks every DR image with it.  The DR guests are stopped, so that the DR
images hold still, and their checksums are taken: SHA-256 of every image's
head and of every snapshot, through site.py.

Then the old primary comes back: its QEMUs start again on the primary
disks (the writer writes), and a group snapshot of it is taken through the
API.  Its replication is refused three ways, with a clear error each time:

- the replicate job queued after its commit (the worker: the group is
  active at DR since epoch 1) fails with `fenced`;
- `POST /v1/snapshots/{id}/replicate` is a 409 `fenced` problem;
- cutpoint-sync itself, run as the old primary's copy would be (`--epoch
  0`, from the previous DR point as its base), exits 6 with an `error`
  event naming the DR image and its epoch.

The DR images' checksums, head and snapshots, are unchanged, and the old
primary's snapshot is not at DR.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cutpoint.api import services_local
from fastapi.testclient import TestClient
from labflow import (  # api/tests/labflow.py
    failover_plane,
    finish,
    inventory_states,
    lab_site,
    register,
    snapshot_and_replicate,
)
from plane import Plane, wait_for

pytestmark = [pytest.mark.lab,
              pytest.mark.lab_config(hosts=2, vms_per_host=1, disks=2, backend="rbd",
                                     workload="writer",
                                     driver="qemu")]  # it starts a fenced primary's raw QEMU again itself


@pytest.fixture
def plane(lab: dict[str, Any], agents: list[dict[str, Any]], tmp_path: Path,
          local_services: services_local.Endpoints) -> Iterator[Plane]:
    with failover_plane(lab, tmp_path, local_services) as p:
        yield p


def dr_state(lab: dict[str, Any], images: list[str]) -> dict[str, Any]:
    """Per DR image: its fencing epoch, its snapshots, and the SHA-256 of its
    head and of each snapshot (site.py, librbd)."""
    from cutpoint.coordinator.dr.site import CephConnection

    out: dict[str, Any] = {}
    with CephConnection(lab_site(lab, "dr")) as ceph:
        for image in images:
            snaps = [s.name for s in ceph.snapshots("rbd", image)]
            out[image] = {"epoch": ceph.metadata_get("rbd", image, "cutpoint.fencing_epoch"),
                          "snapshots": snaps, "head": ceph.sha256("rbd", image),
                          **{s: ceph.sha256("rbd", image, s) for s in snaps}}
    return out


def restart_primary(lab: dict[str, Any], vm: dict[str, Any]) -> int:
    """Start the primary VM's QEMU again, as the lab started it; its pid."""
    from cutpoint.lab.proc import read_pidfile, run

    argv = Path(vm["dir"], "qemu.argv").read_text().split("\0")
    for f in (vm["console"], vm["qmp"], vm["pidfile"]):
        Path(f).unlink(missing_ok=True)
    run(["ip", "netns", "exec", vm["host"], *argv], mark=str(lab["state_dir"]), timeout=60)
    return read_pidfile(Path(vm["pidfile"]))


def test_the_old_primary_cannot_overwrite_the_live_dr_copy(
        lab: dict[str, Any], plane: Plane, client: TestClient, tmp_path: Path) -> None:
    from cutpoint.api.services.sites import ceph_site
    from cutpoint.coordinator.dr.replicate import MemberCopy, sync_argv
    from cutpoint.lab.drillboot import stop_guests, stop_standbys
    from cutpoint.lab.proc import kill_pids, pid_alive
    from cutpoint.lab.vms import READY

    c = client
    plane.start("worker")
    register(c, lab, plane)
    snapshot_and_replicate(c, plane)
    base = snapshot_and_replicate(c, plane)
    primaries = sorted((v for v in lab["vms"] if v["site"] == "primary"),
                       key=lambda v: v["index"])
    images = [d["image"] for v in primaries for d in v["disks"]]
    guests: list[dict[str, Any]] = []
    restarted: list[int] = []
    try:
        r = c.post("/v1/groups/app/failover", json={"mode": "unplanned"})
        assert r.status_code == 202, r.text
        job = finish(c, r.json()["id"], "the failover job", plane, 480)
        res = job["result"] or {}
        guests = list(res.get("guests") or [])
        assert job["state"] == "succeeded", (job["error_code"], job["error"], plane.tail())
        assert res["fence"]["epoch"] == 1 and res["recovery_point"] == base["txn"], res
        print(f"\nunplanned failover: RTO {res['rto_s']:.1f} s; breakdown {res['breakdown']}")
        stop_guests(guests)
        assert not any(pid_alive(int(g["pid"])) for g in guests)
        before = dr_state(lab, images)
        assert {s["epoch"] for s in before.values()} == {"1"}, before
        assert all(f"cp.app.{base['txn']}" in s["snapshots"] for s in before.values())

        # The old primary comes back and writes.
        assert "running" not in inventory_states(lab, plane).values()
        restarted = [restart_primary(lab, v) for v in primaries]

        def booted() -> bool:
            return all(READY in Path(v["console"]).read_text(errors="replace")
                       for v in primaries if Path(v["console"]).exists())

        wait_for(booted, 180, "the old primary's guests to boot", plane)
        wait_for(lambda: set(inventory_states(lab, plane).values()) == {"running"}, 60,
                 "the primary agents to list their VMs running", plane)
        time.sleep(2)  # the writer ring writes
        snap_job = c.post("/v1/groups/app/snapshots").json()
        done = finish(c, snap_job["id"], "the old primary's group snapshot", plane, 120)
        assert done["state"] == "succeeded", done
        old = c.get(f"/v1/snapshots/{done['snapshot_id']}/replication").json()
        print(f"old primary snapshot {old['txn']} committed")

        # 1. The replicate job its commit queued: refused by the worker.
        def refused() -> dict[str, Any] | None:
            items = c.get("/v1/jobs", params={"kind": "replicate"}).json()["items"]
            mine = [j for j in items if j["snapshot_id"] == done["snapshot_id"]]
            return mine[0] if mine and mine[0]["state"] in ("succeeded", "failed") else None

        rjob = wait_for(refused, 120, "the old primary's replicate job", plane)
        assert (rjob["state"], rjob["error_code"]) == ("failed", "fenced"), rjob
        assert "active at 'dr' since fencing epoch 1" in rjob["error"], rjob
        assert "would overwrite the live copy" in rjob["error"]
        print(f"worker: {rjob['error_code']}: {rjob['error']}")

        # 2. Asked for again: a 409 problem.
        r = c.post(f"/v1/snapshots/{done['snapshot_id']}/replicate")
        assert r.status_code == 409 and r.json()["code"] == "fenced", r.text

        # 3. cutpoint-sync run as the old primary's copy (its epoch, 0), with
        # the sites' Ceph access as the control plane has it registered.
        with plane.sf() as s:
            src, dst = ceph_site(s, "primary"), ceph_site(s, "dr")
        for image in images:
            argv = sync_argv(src, dst,
                             MemberCopy(image, f"cp.app.{old['txn']}", f"cp.app.{base['txn']}"),
                             state_dir=str(tmp_path / "sync"), epoch=0)
            (tmp_path / "sync").mkdir(exist_ok=True)
            cp = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
            events = [json.loads(line) for line in cp.stdout.splitlines() if line.strip()]
            assert cp.returncode == 6, (image, cp.returncode, cp.stdout, cp.stderr[-2000:])
            assert events[-1]["event"] == "error" and events[-1]["exit"] == 6, events
            msg = events[-1]["message"]
            assert msg.startswith(f"fenced: dr image {image} is the live copy since fencing "
                                  "epoch 1; this copy runs under epoch 0"), msg
        print(f"cutpoint-sync: exit 6: {msg}")

        after = dr_state(lab, images)
        assert after == before, "the DR images changed"
        assert not any(f"cp.app.{old['txn']}" in s["snapshots"] for s in after.values())
        print(f"DR images unchanged: {len(images)} heads and "
              f"{sum(len(s['snapshots']) for s in after.values())} snapshots, same SHA-256")
    finally:
        kill_pids([p for p in restarted if p])
        stop_guests(guests)
        stop_standbys(lab)
