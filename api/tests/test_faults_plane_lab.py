"""The fault matrix, control-plane cells (docs/reliability.md, "Fault
matrix"): the whole plane on the lab, one fault per test.

Same lab as test_faults_lab.py (2 primary hosts x 1 VM x 2 RBD disks, the
DR host); a Celery worker on a Redis of the test's own (faultkit
`private_redis`), so that killing it touches no other test; the API in
process.  Each test asserts, where they apply: no VM paused beyond lease +
100 ms (the agents' `paused_ms`), every VM running, no partial recovery
point offered, a clear error recorded.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cutpoint.api.models import Job
from cutpoint.coordinator.dr.replicate import stall_bound_s
from fastapi.testclient import TestClient
from faultkit import (  # api/tests/faultkit.py
    MARKS,
    agent_txns,
    assert_pause_bound,
    fault_plane,
    kill9_redis,
    pauses,
    redis_box_fixture,  # noqa: F401  (the fixture `redis_box`)
    restart_redis,
    site_snaps,
)
from plane import Plane, agent_vm_states, wait_for  # api/tests/plane.py
from sqlalchemy import select

pytestmark = MARKS

LEASE_MS = 3000  # the policy of test_api_lab.register and labflow.register
RATE_MBPS = 8    # per cutpoint-sync run: a copy slow enough to be caught mid-way
OP_TIMEOUT_S = 5  # the DR site's Ceph op timeout in the hung-OSD cell


@pytest.fixture
def plane(lab: dict[str, Any], agents: list[dict[str, Any]], tmp_path: Path,
          redis_box: dict[str, Any]) -> Iterator[Plane]:
    with fault_plane(lab, tmp_path, redis_box["port"],
                     CUTPOINT_REPLICATION_RATE_MBPS=str(RATE_MBPS)) as p:
        yield p


def _job(c: TestClient, plane: Plane, job_id: str, timeout: float = 120) -> dict[str, Any]:
    wait_for(lambda: c.get(f"/v1/jobs/{job_id}").json()["state"] in ("succeeded", "failed"),
             timeout, f"job {job_id}", plane)
    return dict(c.get(f"/v1/jobs/{job_id}").json())


def _running(lab: dict[str, Any], plane: Plane) -> bool:
    return set(agent_vm_states(lab, plane).values()) == {"running"}


# -- Redis ---------------------------------------------------------------------
def test_redis_killed_then_a_snapshot_is_asked(lab: dict[str, Any], plane: Plane,
                                               client: TestClient,
                                               redis_box: dict[str, Any]) -> None:
    """kill -9 of the broker: a snapshot request fails at once with 503
    `broker_unavailable`, its job and snapshot are closed as failed, no
    agent saw a PREPARE; with Redis back, the next snapshot commits."""
    from test_api_lab import register  # api/tests/test_api_lab.py

    c = client
    plane.start("worker")
    register(c, lab, plane, rpo=None)
    before = agent_txns(lab, plane.settings)
    kill9_redis(redis_box)
    t0 = time.monotonic()
    r = c.post("/v1/groups/app/snapshots")
    took = time.monotonic() - t0
    print(f"\nredis killed: {r.status_code} in {took:.2f} s: {r.text}")
    assert r.status_code == 503, r.text
    problem = r.json()
    assert problem["code"] == "broker_unavailable" and "broker" in problem["detail"], problem
    job = c.get(f"/v1/jobs/{problem['job_id']}").json()
    assert (job["state"], job["error_code"]) == ("failed", "broker_unavailable"), job
    snaps = c.get("/v1/groups/app/snapshots").json()["items"]
    assert [(s["state"], s["error_code"]) for s in snaps] == [("failed", "broker_unavailable")]
    assert agent_txns(lab, plane.settings) == before, "an agent saw a transaction"
    assert _running(lab, plane)
    # Redis back (empty: it kept nothing): the worker reconnects and the
    # group, not left in flight, snapshots again.
    restart_redis(redis_box)
    t1 = time.monotonic()

    def accepted() -> Any:
        r = c.post("/v1/groups/app/snapshots")
        return r.json() if r.status_code == 202 else None
    job2 = wait_for(accepted, 60, "a snapshot accepted with Redis back", plane, every=1)
    done = _job(c, plane, job2["id"])
    print(f"redis back: snapshot job {done['state']} {time.monotonic() - t1:.1f} s after")
    assert done["state"] == "succeeded", done
    assert c.get(f"/v1/snapshots/{job2['snapshot_id']}").json()["state"] == "committed"


def test_redis_killed_mid_snapshot(lab: dict[str, Any], plane: Plane, client: TestClient,
                                   redis_box: dict[str, Any],
                                   agents: list[dict[str, Any]]) -> None:
    """kill -9 of the broker while a group snapshot is between PREPARE and
    COMMITTED: Redis is not on the snapshot's path, so the txn ends
    (committed with every member snapshot, or aborted with none), within
    the lease; every VM runs; the job's outcome is recorded."""
    from test_api_lab import register  # api/tests/test_api_lab.py

    c = client
    plane.start("worker")
    register(c, lab, plane, rpo=None)
    db = plane.db.removeprefix("sqlite:///")
    killed_in, job = None, None
    for _attempt in range(10):
        job = c.post("/v1/groups/app/snapshots").json()
        ro = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        t_end = time.monotonic() + 30
        while time.monotonic() < t_end:
            row = ro.execute("SELECT state FROM coord_txn WHERE txn = (SELECT txn FROM "
                             "group_snapshots WHERE id = ?)", (job["snapshot_id"],)).fetchone()
            if row and row[0] in ("preparing", "committing"):
                kill9_redis(redis_box)
                killed_in = row[0]
                break
            if row and row[0] in ("committed", "aborted"):
                break
            time.sleep(0.002)
        ro.close()
        if killed_in:
            break
        _job(c, plane, job["id"])
    assert killed_in and job, "never caught a snapshot in flight"
    sid = job["snapshot_id"]

    def final() -> Any:
        s = c.get(f"/v1/snapshots/{sid}").json()
        return s if s["state"] in ("committed", "aborted", "aborting") else None
    snap = wait_for(final, 60, "the txn's outcome with Redis dead", plane)
    print(f"\nredis killed in {killed_in}: snapshot {snap['state']} "
          f"{snap['error_code']}: {snap['error']}")
    txn = snap["txn"]
    got = pauses(agents, txn)
    print(f"pauses {got}")
    assert got, "no resume logged for the txn"
    assert_pause_bound(got, LEASE_MS)
    assert _running(lab, plane)
    have = site_snaps(lab)
    present = [f"cp.app.{txn}" in names for names in have.values()]
    if snap["state"] == "committed":
        assert all(present) and all(m["state"] == "present" for m in snap["members"]), snap
    else:
        assert snap["state"] == "aborted" and not any(present), (snap, have)
        assert snap["error"], snap
    restart_redis(redis_box)
    wait_for(lambda: c.get(f"/v1/jobs/{job['id']}").json()["state"]
             in ("succeeded", "failed"), 60, "the job's state", plane)


# -- replication copy ---------------------------------------------------------------
def _copying(c: TestClient, lab: dict[str, Any], plane: Plane,
             dr_op_timeout_s: int | None = None) -> tuple[int, list[str]]:
    """The group on the plane (labflow.register: both sites, DR host), fresh
    data on every primary disk so the copy has bytes to move whatever an
    earlier test of the session replicated, a committed group snapshot, and
    its replication under way: (snapshot id, member image names).
    `dr_op_timeout_s`: the DR site's Ceph op timeout, set before the copy."""
    from cutpoint.bench.replication import MiB, pattern, write_extents
    from labflow import finish, register  # api/tests/labflow.py

    plane.start("worker")
    register(c, lab, plane)
    if dr_op_timeout_s is not None:
        dr = next(x for x in c.get("/v1/sites").json()["items"] if x["name"] == "dr")
        r = c.patch(f"/v1/sites/{dr['id']}", json={"ceph": {"op_timeout_s": dr_op_timeout_s},
                                                   "check": False})
        assert r.status_code == 200, r.text
    primary = lab["sites"]["primary"]
    images = []
    for vm in lab["vms"]:
        for d in vm["disks"] if vm["site"] == "primary" else []:
            images.append(d["image"])
            write_extents(primary, d["image"], d["size_mb"] * MiB,
                          [(0, pattern(7000 + len(images), 16 * MiB))])
    job = c.post("/v1/groups/app/snapshots").json()
    done = finish(c, job["id"], "group snapshot", plane, 90)
    assert done["state"] == "succeeded", done
    sid = int(done["snapshot_id"])

    def copying() -> bool:
        r = c.get(f"/v1/snapshots/{sid}/replication").json()
        assert not r["recovery_point"], f"copied before it could be interrupted: {r}"
        return bool(r["state"] == "copying")
    wait_for(copying, 120, "the copy under way", plane, every=0.2)
    # Into the data (the first copy of a group is full: 64 MiB per disk at
    # RATE_MBPS), and still copying.
    time.sleep(1.5)
    r = c.get(f"/v1/snapshots/{sid}/replication").json()
    assert r["state"] == "copying" and not r["recovery_point"], r
    return sid, images


def _not_offered(c: TestClient, sid: int) -> dict[str, Any]:
    """The snapshot's replication, asserting it is not a recovery point,
    neither on the snapshot nor as the group's newest."""
    r = dict(c.get(f"/v1/snapshots/{sid}/replication").json())
    assert not r["recovery_point"], r
    newest = c.get("/v1/groups/app/replication").json()["newest_recovery_point"]
    assert newest != r["txn"], newest
    return r


def _identical(lab: dict[str, Any], images: list[str], txn: str) -> None:
    """Every DR member snapshot equals the primary's (`rbd export` SHA-256,
    independent of cutpoint-sync's own verification)."""
    from cutpoint.bench.replication import snap_sha256

    for image in images:
        assert snap_sha256(lab["sites"]["dr"], image, f"cp.app.{txn}") == \
            snap_sha256(lab["sites"]["primary"], image, f"cp.app.{txn}"), image


def test_worker_kill9_mid_replication(lab: dict[str, Any], plane: Plane,
                                      client: TestClient) -> None:
    """kill -9 of the worker (its whole process group: the copy too) while
    a committed snapshot is copied to DR: the snapshot is not offered as a
    recovery point while its copy is partial; a new worker (the job
    redelivered, or re-sent by beat) finishes it, and then it is one, equal
    to the primary's."""
    c = client
    sid, images = _copying(c, lab, plane)
    plane.kill9("worker")
    mid = _not_offered(c, sid)
    print(f"\nworker killed mid-copy: replication {mid['state']}, attempts {mid['attempts']}")
    time.sleep(3)
    _not_offered(c, sid)
    plane.start("worker")
    plane.start("beat")
    t0 = time.monotonic()

    def verified() -> dict[str, Any] | None:
        r = c.get(f"/v1/snapshots/{sid}/replication").json()
        return r if r["recovery_point"] else None
    after = wait_for(verified, 300, "the copy finished by a new worker", plane, every=1)
    print(f"recovery point {time.monotonic() - t0:.1f} s after the restart: "
          f"attempts {after['attempts']}, {after['bytes_shipped']} bytes")
    assert after["state"] == "verified", after
    with plane.sf() as s:
        jobs = list(s.scalars(select(Job).where(Job.kind == "replicate",
                                                Job.snapshot_id == sid)))
    assert len(jobs) == 1, [(j.id, j.state) for j in jobs]
    _identical(lab, images, after["txn"])


# Slow (`make faults-slow`, run by .ci/run after `make faults`): a full
# copy, a 60 s stall bound, then the copy again.  In the fresh-clone CI run
# of 2026-11-26, before the stall bound, the failure half held (failed
# after 181 s, not offered) but with the OSD back the copy was not
# completed within 300 s.
@pytest.mark.slow
def test_dr_osd_hung_mid_replication(lab: dict[str, Any], plane: Plane,
                                     client: TestClient) -> None:
    """The DR site's OSD stops answering (SIGSTOP) mid-copy: the replication
    fails (the engine stopped once its progress stalls, a bound set by the
    site's op timeout) with an error that
    says so, the snapshot is not offered as a recovery point; with the OSD
    back, a replicate request completes it, equal to the primary's."""
    from faultkit import hung_osd

    c = client
    sid, images = _copying(c, lab, plane, dr_op_timeout_s=OP_TIMEOUT_S)
    t0 = time.monotonic()
    with hung_osd(lab, "dr"):
        def ended() -> dict[str, Any] | None:
            r = c.get(f"/v1/snapshots/{sid}/replication").json()
            return r if r["state"] in ("failed", "verified") else None
        rep = wait_for(ended, 240, "the copy to fail with the DR OSD hung", plane, every=1)
        took = time.monotonic() - t0
    with plane.sf() as s:
        job = s.scalar(select(Job).where(Job.kind == "replicate", Job.snapshot_id == sid))
        assert job is not None
        err = (job.state.value, job.error_code, job.error)
    # The engine's op timeout is the larger of the sites' (the primary's
    # is its default), as is the worker's stall bound.
    sites = c.get("/v1/sites").json()["items"]
    bound = stall_bound_s(max((x["ceph"] or {}).get("op_timeout_s", 0) for x in sites), RATE_MBPS)
    print(f"\nDR OSD hung mid-copy: {rep['state']} after {took:.1f} s "
          f"(stall bound {bound:.0f} s); job {err}")
    assert rep["state"] == "failed", rep
    # Stopped by the stall bound, not after each member's requests timed
    # out in turn (150 s in the lab without it); room for the job's own
    # bookkeeping and the poll.
    assert took < bound + 30, took
    _not_offered(c, sid)
    assert err[0] == "failed" and err[2] and "timed out" in err[2], err

    def settled() -> dict[str, Any] | None:
        x = c.get(f"/v1/snapshots/{sid}/replication").json()
        return x if x["state"] != "copying" else None
    # A redelivered copy of the job (the visibility timeout is shorter than
    # the hung copy) may run another attempt once the first released the
    # group: let it end, then ask again if it is not a recovery point.
    x = wait_for(settled, 300, "no copy running", plane, every=1)
    again = None
    if not x["recovery_point"]:
        r = c.post(f"/v1/snapshots/{sid}/replicate")
        assert r.status_code == 202, r.text
        again = r.json()["id"]

    def verified() -> dict[str, Any] | None:
        x = c.get(f"/v1/snapshots/{sid}/replication").json()
        if again and not x["recovery_point"]:
            # A copy that fails again with the OSD back fails the cell
            # here, with its error, rather than at the timeout.
            j = c.get(f"/v1/jobs/{again}").json()
            assert j["state"] != "failed", j
        return x if x["recovery_point"] else None
    after = wait_for(verified, 300, "the copy completed with the OSD back", plane, every=1)
    print(f"with the OSD back: {after['state']} after {after['attempts']} attempts")
    _identical(lab, images, after["txn"])
