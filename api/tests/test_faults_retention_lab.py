"""The fault matrix, retention cells (docs/reliability.md, "Fault matrix"):
kill -9 of the worker, and of Redis, while retention deletes a group's
snapshots.

Same lab and plane as test_faults_plane_lab.py (faultkit `MARKS`,
`fault_plane` on a Redis of the test's own); the group at the primary only
(retention does not need DR).  Retention marks every snapshot it will
delete `deleting` (committed), then deletes them one group snapshot at a
time through the agents: each cell kills its part once at least one is
`deleted` and another still `deleting`, so a run is cut in the middle.
Each asserts: no snapshot that is half deleted is offered (only
`committed` ones are, and each of those has every member snapshot at the
primary; a restore of a `deleting` one is refused); the next retention
run finishes; then the group's committed snapshots and the member
snapshots in Ceph are the same set.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from faultkit import (  # api/tests/faultkit.py
    MARKS,
    fault_plane,
    kill9_redis,
    redis_box_fixture,  # noqa: F401  (the fixture `redis_box`)
    restart_redis,
    site_snaps,
)
from plane import Plane, agent_vm_states, wait_for  # api/tests/plane.py

pytestmark = MARKS

SNAPSHOTS = 6  # taken before retention runs with keep_last 1: five to delete


@pytest.fixture
def plane(lab: dict[str, Any], agents: list[dict[str, Any]], tmp_path: Path,
          redis_box: dict[str, Any]) -> Iterator[Plane]:
    # A short group lock, so that the lock of the killed run expires soon
    # and the next run does not wait the default 30 s for it.
    with fault_plane(lab, tmp_path, redis_box["port"], CUTPOINT_GROUP_LOCK_TTL_S="6") as p:
        yield p


def _job(c: TestClient, plane: Plane, job_id: str, timeout: float = 120) -> dict[str, Any]:
    wait_for(lambda: c.get(f"/v1/jobs/{job_id}").json()["state"] in ("succeeded", "failed"),
             timeout, f"job {job_id}", plane)
    return dict(c.get(f"/v1/jobs/{job_id}").json())


def _snapshots(c: TestClient) -> list[dict[str, Any]]:
    """The group's snapshots as the API lists them, each with its members."""
    items = c.get("/v1/groups/app/snapshots", params={"limit": 200}).json()["items"]
    return [dict(c.get(f"/v1/snapshots/{s['id']}").json()) for s in items]


def _ours(lab: dict[str, Any]) -> dict[str, set[str]]:
    """image spec -> the group's member snapshots (`cp.app.*`) at the primary."""
    return {img: {n for n in names if n.startswith("cp.app.")}
            for img, names in site_snaps(lab).items()}


def _offered_are_whole(c: TestClient, lab: dict[str, Any]) -> list[dict[str, Any]]:
    """Every snapshot the API offers (committed) has each member snapshot at
    the primary; a snapshot being deleted is not offered: a restore of it
    is refused.  The list of snapshots."""
    have = _ours(lab)
    snaps = _snapshots(c)
    for s in snaps:
        if s["state"] == "committed":
            missing = [f"{m['vm']}/{m['disk']}" for m in s["members"]
                       if not any(m["name"] in names for names in have.values())]
            assert not missing, f"committed {s['txn']} offered without {missing}: {have}"
    for s in snaps:
        if s["state"] == "deleting":
            r = c.post("/v1/groups/app/restore/clone", json={"snapshot": s["txn"]})
            assert r.status_code == 409 and r.json()["code"] == "snapshot_not_committed", r.text
    return snaps


def _cut_mid_retention(c: TestClient, lab: dict[str, Any], plane: Plane,
                       kill: Callable[[], None]) -> tuple[str, dict[str, int]]:
    """SNAPSHOTS group snapshots, keep_last 1, a retention run; `kill()` once
    one snapshot is deleted and another still deleting: (job id, states
    counted when killed)."""
    from test_api_lab import register  # api/tests/test_api_lab.py

    plane.start("worker")
    register(c, lab, plane, rpo=None)
    for _ in range(SNAPSHOTS):
        job = c.post("/v1/groups/app/snapshots").json()
        assert _job(c, plane, job["id"])["state"] == "succeeded"
    r = c.patch("/v1/groups/app/policy", json={"keep_last": 1, "keep_within": 0})
    assert r.status_code == 200, r.text
    db = plane.db.removeprefix("sqlite:///")
    ro = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    job = c.post("/v1/groups/app/retention").json()
    counts: dict[str, int] = {}
    t_end = time.monotonic() + 60
    try:
        while time.monotonic() < t_end:
            counts = dict(ro.execute("SELECT state, count(*) FROM group_snapshots "
                                     "GROUP BY state").fetchall())
            if counts.get("deleted", 0) >= 1 and counts.get("deleting", 0) >= 1:
                kill()
                return str(job["id"]), counts
            assert counts.get("deleted", 0) < SNAPSHOTS - 1, \
                f"retention ended before it could be cut: {counts}"
            time.sleep(0.002)
    finally:
        ro.close()
    raise AssertionError(f"retention never under way: {counts}")


def _finished_and_matches_ceph(c: TestClient, lab: dict[str, Any], plane: Plane) -> None:
    """A retention run now ends succeeded; the group keeps exactly its
    newest snapshot, and Ceph holds exactly the committed snapshots' members."""
    t0 = time.monotonic()

    def accepted() -> Any:
        r = c.post("/v1/groups/app/retention")
        return r.json() if r.status_code == 202 else None
    job = wait_for(accepted, 60, "a retention run accepted", plane, every=1)
    done = _job(c, plane, job["id"], 120)
    print(f"next retention run: {done['state']} {time.monotonic() - t0:.1f} s after, "
          f"result {done['result']}")
    assert done["state"] == "succeeded" and not (done["result"] or {}).get("failed"), done
    snaps = _offered_are_whole(c, lab)
    states = sorted(s["state"] for s in snaps)
    assert states == ["committed"] + ["deleted"] * (SNAPSHOTS - 1), states
    committed = {m["name"] for s in snaps if s["state"] == "committed" for m in s["members"]}
    # This plane's snapshots only: earlier tests of the session, on the
    # same lab and group name, left theirs.
    mine = {m["name"] for s in snaps for m in s["members"]}
    in_ceph = set().union(*_ours(lab).values()) & mine
    print(f"committed members {sorted(committed)}; at the primary {sorted(in_ceph)}")
    assert in_ceph == committed, (in_ceph, committed)
    assert set(agent_vm_states(lab, plane).values()) == {"running"}


def test_worker_kill9_mid_retention(lab: dict[str, Any], plane: Plane,
                                    client: TestClient) -> None:
    """kill -9 of the worker (its process group) in the middle of a
    retention run: nothing half deleted is offered; a new worker's run
    finishes the deletes; the committed snapshots match Ceph."""
    c = client
    job_id, counts = _cut_mid_retention(c, lab, plane, lambda: plane.kill9("worker"))
    print(f"\nworker killed mid-retention: snapshots {counts}")
    snaps = _offered_are_whole(c, lab)
    assert any(s["state"] == "deleting" for s in snaps), [s["state"] for s in snaps]
    plane.start("worker")
    _finished_and_matches_ceph(c, lab, plane)
    # The killed run's job is not left `running`: the broker redelivers it
    # (visibility timeout 15 s) and the new worker ends it.
    first = _job(c, plane, job_id, 120)
    print(f"the killed run's job: {first['state']} attempts {first['attempts']}, "
          f"result {first['result']}")
    assert first["state"] == "succeeded" and first["attempts"] >= 2, first


def test_redis_killed_mid_retention(lab: dict[str, Any], plane: Plane, client: TestClient,
                                    redis_box: dict[str, Any]) -> None:
    """kill -9 of Redis (the broker and the group lock) in the middle of a
    retention run: nothing half deleted is offered; with Redis back, the
    next run finishes the deletes; the committed snapshots match Ceph."""
    c = client
    job_id, counts = _cut_mid_retention(c, lab, plane, lambda: kill9_redis(redis_box))
    print(f"\nredis killed mid-retention: snapshots {counts}")
    time.sleep(2)  # the run notices its lock is gone, or finishes
    _offered_are_whole(c, lab)
    first = c.get(f"/v1/jobs/{job_id}").json()
    print(f"the run Redis died under: job {first['state']} {first['error_code']}: "
          f"{first['error']} {first['result']}")
    restart_redis(redis_box)
    # Celery's worker may exit when the broker goes away under a running
    # task (kombu's reconnect: "Unrecoverable error: AttributeError(... 'hostname')");
    # a deployment's unit restarts it (Restart=always), the lab's plane here.
    worker = plane.procs["worker"]
    time.sleep(1)
    if worker.poll() is not None:
        print(f"the worker exited (rc {worker.returncode}) with Redis gone: started again")
        plane.start("worker")
    _finished_and_matches_ceph(c, lab, plane)
    first = _job(c, plane, job_id, 60)
    print(f"the run Redis died under, in the end: {first['state']} {first['error_code']}")
