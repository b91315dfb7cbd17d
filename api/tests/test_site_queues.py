"""DR jobs on per-site queues (settings.dr_site_queues), with real workers
on real Redis: a replicate job of a group protected to site `far` goes to
`cutpoint.site.far`; a worker without that queue never starts it, a worker
started for that site runs it."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from cutpoint.api import services_local
from cutpoint.api.models import Group, GroupSnapshot, Policy, Site, SnapState, utcnow
from plane import QUEUES, Plane, admin_client, wait_for  # api/tests/plane.py
from test_worker import make_certs


@pytest.fixture
def plane(tmp_path: Path, local_services: services_local.Endpoints) -> Iterator[Plane]:
    with Plane(tmp_path, int(local_services.redis_port or 0), make_certs(tmp_path / "certs"),
               CUTPOINT_DR_SITE_QUEUES="true", CUTPOINT_RETENTION_INTERVAL_S="3600",
               CUTPOINT_INVENTORY_INTERVAL_S="3600") as p:
        # The in-process API (admin_client) routes the jobs: it needs the setting too.
        p.settings = p.settings.model_copy(update={"dr_site_queues": True})
        yield p


def test_a_dr_job_waits_for_a_worker_of_its_site(plane: Plane) -> None:
    with plane.sf() as s:
        far = Site(name="far")
        s.add(far)
        s.flush()
        g = Group(name="q")
        g.policy = Policy(keep_last=5, replication_target_id=far.id)
        s.add(g)
        s.flush()
        snap = GroupSnapshot(group_id=g.id, txn="t1", state=SnapState.committed,
                             cut_at=utcnow() - dt.timedelta(seconds=5))
        s.add(snap)
        s.commit()
        sid = snap.id
    r = redis.Redis.from_url(plane.settings.redis_url)
    plane.start("worker-default")
    with admin_client(plane) as c:
        resp = c.post(f"/v1/snapshots/{sid}/replicate", json={})
        assert resp.status_code == 202, resp.text
        job_id = resp.json()["id"]
        wait_for(lambda: r.llen("cutpoint.site.far") == 1, 30,
                 "the job on the site's queue", plane)
        time.sleep(5)
        doc = c.get(f"/v1/jobs/{job_id}").json()
        assert doc["state"] == "queued" and doc["started_at"] is None, doc
        assert r.llen("cutpoint.site.far") == 1

        plane.start("worker-far", queues=QUEUES + ",cutpoint.site.far")
        wait_for(lambda: c.get(f"/v1/jobs/{job_id}").json()["state"]
                 in ("succeeded", "failed"), 60, "the site's worker to run the job", plane)
        doc = c.get(f"/v1/jobs/{job_id}").json()
    print(f"\nrun by the site's worker: {doc['state']} {doc['error_code']}: {doc['error']}")
    assert doc["started_at"] is not None and r.llen("cutpoint.site.far") == 0
    # This seeded snapshot has no members: a clear refusal, not an internal error.
    assert doc["state"] == "failed" and doc["error_code"] == "no_members", doc
