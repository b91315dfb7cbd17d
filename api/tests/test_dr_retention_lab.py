"""Invariant 6 on the lab's two Ceph clusters, through the real control plane.

The API, a Celery worker, the agents, QEMU guests on RBD and both Ceph
clusters.  The test tries to make retention delete a replication base:

1. S1 (full copy) and S2 (increment from S1) become DR recovery points;
   S2 is the replication base.
2. S3 is copied from S2 (rate-limited, so it is still copying), S4 is taken
   meanwhile: its replication must wait for S3's (one per group at a time,
   shown as a queued job whose message names S3's job).
3. Both retention policies are as aggressive as they go (keep_last=1, no
   keep_within) and retention runs at both sites while S3 copies: by the
   policies alone S2 and S3 would go at the primary and S2 at DR.
4. `rbd snap ls` at each site: the base S2 is still at both sites, S3 (the
   copy in flight) at the primary, S1 deleted at both sites; S3's copy
   then finishes from S2 shipping only its delta, and S4's from S3.
5. Retention again: only the newest DR recovery point S4 is left at both
   sites, and the next increment (S5) from it ships only its delta and is
   byte-identical at DR.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cutpoint.api import services_local
from cutpoint.api.models import Job
from cutpoint.bench.replication import MiB, pattern, snap_sha256, snaps, write_extents
from fastapi.testclient import TestClient
from plane import Plane, lab_plane, register_lab_site, wait_for  # api/tests/plane.py
from sqlalchemy import select
from test_api_lab import register

pytestmark = [pytest.mark.lab,
              pytest.mark.lab_config(hosts=2, vms_per_host=1, disks=2, backend="rbd")]

RATE_MBPS = 1  # per cutpoint-sync run: S3's copy (8 MiB per disk, 2 at once) takes ~17 s
OURS: set[str] = set()  # member snapshot names this test took
DELTA = {2: MiB, 3: 8 * MiB, 4: 256 * 1024, 5: 128 * 1024}  # bytes written per disk


@pytest.fixture
def plane(lab: dict[str, Any], agents: list[dict[str, Any]], tmp_path: Path,
          local_services: services_local.Endpoints) -> Iterator[Plane]:
    with lab_plane(lab, tmp_path, int(local_services.redis_port or 0),
                   CUTPOINT_GROUP_LOCK_TTL_S="6", CUTPOINT_BROKER_VISIBILITY_TIMEOUT_S="60",
                   CUTPOINT_RETENTION_INTERVAL_S="3600", CUTPOINT_INVENTORY_INTERVAL_S="3600",
                   CUTPOINT_REPLICATION_RATE_MBPS=str(RATE_MBPS)) as p:
        yield p


def disks(lab: dict[str, Any]) -> list[tuple[str, int]]:
    return [(d["image"], d["size_mb"] * MiB) for vm in lab["vms"] if vm["site"] == "primary"
            for d in vm["disks"]]


def job_done(c: TestClient, plane: Plane, job_id: str, timeout: float = 180) -> dict[str, Any]:
    wait_for(lambda: c.get(f"/v1/jobs/{job_id}").json()["state"] in ("succeeded", "failed"),
             timeout, f"job {job_id}", plane)
    return dict(c.get(f"/v1/jobs/{job_id}").json())


def replicate_job_of(plane: Plane, snap_id: int) -> str | None:
    with plane.sf() as s:
        return s.scalar(select(Job.id).where(Job.kind == "replicate",
                                             Job.snapshot_id == snap_id).limit(1))


def snapshot(c: TestClient, plane: Plane, lab: dict[str, Any], k: int) -> dict[str, Any]:
    """Write DELTA[k] bytes of pattern k on every primary disk, then take S<k>."""
    for image, size in disks(lab):
        write_extents(lab["sites"]["primary"], image, size,
                      [(k * 8 * MiB, pattern(100 * k + len(image), DELTA.get(k, MiB)))])
    job = c.post("/v1/groups/app/snapshots").json()
    done = job_done(c, plane, job["id"])
    assert done["state"] == "succeeded", done
    snap = c.get(f"/v1/snapshots/{job['snapshot_id']}").json()
    assert snap["state"] == "committed", snap
    OURS.add(f"cp.app.{snap['txn']}")
    return {"id": snap["id"], "txn": snap["txn"], "name": f"cp.app.{snap['txn']}"}


def ceph_snaps(lab: dict[str, Any], site: str) -> dict[str, set[str]]:
    """The group's snapshot names on every member image at one site (`rbd snap ls`);
    other tests of the session may have left theirs, only ours are in OURS."""
    return {image: {n for n in snaps(lab["sites"][site], image) if n in OURS}
            for image, _ in disks(lab)}


def on_all(lab: dict[str, Any], site: str, name: str) -> bool:
    have = ceph_snaps(lab, site)
    return all(name in names for names in have.values())


def on_none(lab: dict[str, Any], site: str, name: str) -> bool:
    have = ceph_snaps(lab, site)
    return not any(name in names for names in have.values())


def members(c: TestClient, snap: dict[str, Any]) -> list[dict[str, Any]]:
    doc = c.get(f"/v1/snapshots/{snap['id']}/replication").json()
    assert doc["state"] == "verified" and doc["recovery_point"], doc
    return list(doc["members"])


def test_retention_never_deletes_a_replication_base_on_ceph(
        lab: dict[str, Any], plane: Plane, client: TestClient) -> None:
    c = client
    plane.start("worker")
    register(c, lab, plane, rpo=None)
    register_lab_site(c, lab, "dr")
    etag = c.get("/v1/groups/app/policy").headers["ETag"]
    r = c.patch("/v1/groups/app/policy", json={"replication_target": "dr"},
                headers={"If-Match": etag})
    assert r.status_code == 200, r.text

    # 1. Two DR recovery points: S1 (full copy), S2 (increment); S2 is the base.
    s1 = snapshot(c, plane, lab, 1)
    j1 = wait_for(lambda: replicate_job_of(plane, s1["id"]), 30, "S1's replicate job", plane)
    assert job_done(c, plane, j1)["state"] == "succeeded", c.get(f"/v1/jobs/{j1}").json()
    s2 = snapshot(c, plane, lab, 2)
    j2 = wait_for(lambda: replicate_job_of(plane, s2["id"]), 30, "S2's replicate job", plane)
    assert job_done(c, plane, j2)["state"] == "succeeded", c.get(f"/v1/jobs/{j2}").json()
    assert all(m["base"] == s1["name"] and m["full"] is False for m in members(c, s2))
    assert on_all(lab, "dr", s1["name"]) and on_all(lab, "dr", s2["name"])

    # 2. S3 copies from S2 (slowly); S4's replication waits for it.
    s3 = snapshot(c, plane, lab, 3)
    j3 = wait_for(lambda: replicate_job_of(plane, s3["id"]), 30, "S3's replicate job", plane)
    wait_for(lambda: c.get(f"/v1/snapshots/{s3['id']}/replication").json()["state"]
             == "copying", 60, "S3 copying", plane, every=0.2)
    s4 = snapshot(c, plane, lab, 4)
    j4 = wait_for(lambda: replicate_job_of(plane, s4["id"]), 30, "S4's replicate job", plane)
    wait_for(lambda: c.get(f"/v1/jobs/{j4}").json()["message"].startswith("waiting"), 30,
             "S4's replication to wait", plane, every=0.2)
    waiting = c.get(f"/v1/jobs/{j4}").json()
    print(f"\nS4's replicate job while S3's copies: state={waiting['state']} "
          f"message={waiting['message']!r}")
    assert waiting["state"] == "queued" and j3 in waiting["message"], waiting

    # 3. Retention at both sites, as aggressive as the policies go.
    etag = c.get("/v1/groups/app/policy").headers["ETag"]
    assert c.patch("/v1/groups/app/policy", json={"keep_last": 1, "keep_within": 0},
                   headers={"If-Match": etag}).status_code == 200
    assert c.request("PUT", "/v1/groups/app/dr-policy",
                     json={"keep_last": 1, "keep_within": 0}).status_code == 200
    ret = job_done(c, plane, c.post("/v1/groups/app/retention").json()["id"])
    print("retention while S3 copies:", ret["result"])
    assert ret["state"] == "succeeded", ret
    assert c.get(f"/v1/jobs/{j3}").json()["state"] == "running", \
        "S3's copy finished before retention ran: the test did not race it (lower RATE_MBPS)"
    assert ret["result"]["deleted"] == 1 and ret["result"]["dr_deleted"] == [s1["txn"]], ret

    # 4. On the clusters: the base S2 at both sites, S3 at the primary, S1 gone.
    assert on_all(lab, "primary", s2["name"]) and on_all(lab, "dr", s2["name"])
    assert on_all(lab, "primary", s3["name"]) and on_all(lab, "primary", s4["name"])
    assert on_none(lab, "primary", s1["name"]) and on_none(lab, "dr", s1["name"])
    assert c.get(f"/v1/snapshots/{s1['id']}/replication").json()["state"] == "dr_deleted"
    done3 = job_done(c, plane, j3)
    assert done3["state"] == "succeeded", done3
    for m in members(c, s3):
        print(f"S3 {m['disk']}: base={m['base']} full={m['full']} "
              f"shipped={m['bytes_shipped']} changed={m['bytes_changed']}")
        assert m["base"] == s2["name"] and m["full"] is False
        assert DELTA[3] <= m["bytes_shipped"] <= DELTA[3] * 1.05
    done4 = job_done(c, plane, j4)
    assert done4["state"] == "succeeded", done4
    assert all(m["base"] == s3["name"] and m["full"] is False
               and m["bytes_shipped"] <= DELTA[4] * 1.05 for m in members(c, s4))

    # 5. Retention again: only the newest DR recovery point (the base) is left.
    ret = job_done(c, plane, c.post("/v1/groups/app/retention").json()["id"])
    print("retention after the copies:", ret["result"])
    assert ret["state"] == "succeeded", ret
    assert ret["result"]["deleted"] == 2, ret
    assert sorted(ret["result"]["dr_deleted"]) == sorted([s2["txn"], s3["txn"]]), ret
    for site in ("primary", "dr"):
        have = ceph_snaps(lab, site)
        print(f"{site}: {sorted(set().union(*have.values()))}")
        assert all(names == {s4["name"]} for names in have.values()), (site, have)
    doc = c.get("/v1/groups/app/replication").json()
    assert doc["newest_recovery_point"] == s4["txn"]
    assert [s["replication_base"] for s in doc["snapshots"] if s["txn"] == s4["txn"]] == [True]

    # The next increment still runs from that base, ships only its delta.
    s5 = snapshot(c, plane, lab, 5)
    j5 = wait_for(lambda: replicate_job_of(plane, s5["id"]), 30, "S5's replicate job", plane)
    assert job_done(c, plane, j5)["state"] == "succeeded", c.get(f"/v1/jobs/{j5}").json()
    for m in members(c, s5):
        print(f"S5 {m['disk']}: base={m['base']} full={m['full']} "
              f"shipped={m['bytes_shipped']}")
        assert m["base"] == s4["name"] and m["full"] is False
        assert 0 < m["bytes_shipped"] <= DELTA[5] * 1.05
    for image, _ in disks(lab):
        assert (snap_sha256(lab["sites"]["primary"], image, s5["name"])
                == snap_sha256(lab["sites"]["dr"], image, s5["name"])), image
