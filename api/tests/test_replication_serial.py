"""One replication per group at a time, with a real Celery worker on real Redis.

The replicate lock of a group is held (as the worker running another
replication of the group holds it); a replicate job sent meanwhile must stay
`queued`, say which job it waits for, and run only once the lock is free.
A lock left by a killed worker (no heartbeat any more) must not wedge the
group: the job runs once the lease has run out.

No Ceph here: the group has no replication target, so a job that gets past
the lock ends `failed` with `no_target` at once, which shows it ran.  The
lab run of the same path (two real copies) is test_dr_retention_lab.py.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from cutpoint.api import services_local
from cutpoint.api.app import create_app
from cutpoint.api.models import (
    Group,
    GroupSnapshot,
    Job,
    JobState,
    Policy,
    Role,
    SnapState,
    utcnow,
)
from cutpoint.api.services import tokens
from cutpoint.api.tasks import GroupLock
from fastapi.testclient import TestClient
from plane import SECRET, Plane, wait_for  # api/tests/plane.py
from test_worker import make_certs

TTL = 3.0


@pytest.fixture(name="plane")
def lock_ttl_plane_fixture(tmp_path: Path,
                           local_services: services_local.Endpoints) -> Iterator[Plane]:
    """The control plane with a TTL-second group lock (test_replicate_redelivery
    uses it too)."""
    with Plane(tmp_path, int(local_services.redis_port or 0), make_certs(tmp_path / "certs"),
               CUTPOINT_GROUP_LOCK_TTL_S=str(TTL), CUTPOINT_RETENTION_INTERVAL_S="3600",
               CUTPOINT_INVENTORY_INTERVAL_S="3600") as p:
        yield p


def _seed(plane: Plane) -> tuple[int, int, str]:
    """A group (no replication target), one committed snapshot, and a running
    replicate job of the group (the one holding the lock)."""
    with plane.sf() as s:
        g = Group(name="serial")
        g.policy = Policy(keep_last=5)
        s.add(g)
        s.flush()
        snap = GroupSnapshot(group_id=g.id, txn="t1", state=SnapState.committed,
                             cut_at=utcnow() - dt.timedelta(seconds=5))
        s.add(snap)
        s.flush()
        holder = Job(id="00000000-0000-4000-8000-000000000001", kind="replicate",
                     state=JobState.running, group_id=g.id, snapshot_id=snap.id,
                     message="running", started_at=utcnow())
        s.add(holder)
        s.commit()
        return g.id, snap.id, holder.id


def _job(c: TestClient, job_id: str) -> dict[str, Any]:
    return dict(c.get(f"/v1/jobs/{job_id}").json())


def test_a_second_replication_of_a_group_waits_for_the_first(plane: Plane) -> None:
    gid, sid, holder_id = _seed(plane)
    r = redis.Redis.from_url(plane.settings.redis_url)
    with plane.sf() as s:
        _, tok = tokens.create(s, "serial-admin", Role.admin, SECRET)
    lock = GroupLock(r, gid, TTL, kind="replicate")
    assert lock.acquire()
    plane.start("worker")
    with TestClient(create_app(plane.settings),
                    headers={"Authorization": f"Bearer {tok}"}) as c:
        resp = c.post(f"/v1/snapshots/{sid}/replicate", json={})
        assert resp.status_code == 202, resp.text
        j1 = resp.json()["id"]
        # It waits: queued, never started, its message names the running job.
        wait_for(lambda: _job(c, j1)["message"].startswith("waiting"), 60,
                 "the job to wait", plane)
        wait_for(lambda: plane.tail(100_000).count(f"job={j1} outcome=retry") >= 3, 60,
                 "three deliveries of the waiting job", plane)
        doc = _job(c, j1)
        print(f"\nwhile the lock is held: state={doc['state']} message={doc['message']!r}")
        assert doc["state"] == "queued" and doc["started_at"] is None, doc
        assert doc["message"] == (f"waiting: replication job {holder_id} (snapshot t1) "
                                  "of this group is running"), doc
        # The holder finishes: the waiting job runs (and fails: no target).
        with plane.sf() as s:
            s.get(Job, holder_id).state = JobState.succeeded
            s.commit()
        lock.release()
        wait_for(lambda: _job(c, j1)["state"] in ("succeeded", "failed"), 60,
                 "the job to run after the lock is released", plane)
        doc = _job(c, j1)
        assert doc["state"] == "failed" and doc["error_code"] == "no_target", doc
        assert doc["started_at"] is not None

        # A killed worker's lock: no heartbeat, it ends with its lease.
        assert r.set(f"cutpoint:lock:replicate:{gid}", "killed-worker", px=8000)
        j2 = c.post(f"/v1/snapshots/{sid}/replicate", json={}).json()["id"]
        wait_for(lambda: _job(c, j2)["message"].startswith("waiting"), 60,
                 "the job to wait for the dead worker's lock", plane)
        doc = _job(c, j2)
        print(f"behind a dead worker's lock: state={doc['state']} message={doc['message']!r}")
        assert doc["state"] == "queued" and "lock is held" in doc["message"], doc
        wait_for(lambda: _job(c, j2)["state"] in ("succeeded", "failed"), 60,
                 "the job to run once the dead worker's lease ran out", plane)
        doc = _job(c, j2)
        assert doc["state"] == "failed" and doc["error_code"] == "no_target", doc


def test_in_flight_query_on_both_databases(session_factory: Any) -> None:
    """`replication.in_flight` (what retention keeps for a running copy) on
    SQLite and PostgreSQL: the latest attempt counts, a verified snapshot's
    rows do not, and the base is found by its member snapshot name."""
    from cutpoint.api.models import MemberReplication, MemberSnapshot
    from cutpoint.api.services import replication

    with session_factory() as s:
        g = Group(name="fly")
        s.add(g)
        s.flush()
        snaps = []
        for i in range(4):
            sn = GroupSnapshot(group_id=g.id, txn=f"f{i}", state=SnapState.committed,
                               cut_at=utcnow() - dt.timedelta(seconds=100 - i))
            s.add(sn)
            s.flush()
            s.add(MemberSnapshot(group_snapshot_id=sn.id, host="h", vm="v", disk="v/d0",
                                 name=f"cp.fly.f{i}", state="present"))
            snaps.append(sn)
        snaps[0].dr_verified_at = utcnow()
        for sn, attempt, base, state in ((snaps[1], 1, "cp.fly.f0", "verified"),
                                         (snaps[1], 1, "cp.fly.f0", "copying"),
                                         (snaps[2], 1, "cp.fly.f0", "copying"),
                                         (snaps[2], 2, None, "failed"),
                                         (snaps[3], 1, "cp.fly.f0", "copying")):
            s.add(MemberReplication(group_snapshot_id=sn.id, attempt=attempt, disk="v/d0",
                                    pool="rbd", image="v-d0", snap=f"cp.fly.{sn.txn}",
                                    base=base, target_site="dr", state=state))
        snaps[3].dr_verified_at = utcnow()  # its copy is done: its rows no longer count
        s.commit()
        sources, bases = replication.in_flight(s, g.id)
        assert (sources, bases) == ({snaps[1].id}, {snaps[0].id})


def test_a_job_waiting_for_a_group_lock_looks_again_soon_then_less_often() -> None:
    from cutpoint.api.grouplock import retry_wait_s

    waits = [retry_wait_s(n, 30.0) for n in range(8)]
    assert waits[:4] == [0.5, 1.0, 2.0, 4.0]
    assert max(waits) == 10.0 and waits[-1] == 10.0   # a third of the TTL
    assert retry_wait_s(10**6, 30.0) == 10.0  # no overflow
    assert retry_wait_s(0, 1.0) == 0.5       # short TTLs: min 1 s cap
