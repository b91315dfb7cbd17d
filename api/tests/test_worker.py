"""A real Celery worker and beat on real Redis, against an agent that is down.

The scheduler must keep ticking, every attempt must end aborted with the
agent's connect error recorded, the host must show as unreachable, and RPO
misses must be recorded with their reason and exported in /metrics.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cutpoint.api import services_local
from cutpoint.api.app import create_app
from cutpoint.api.models import GroupSnapshot, Host, Job, RpoMiss, Site, SnapState
from cutpoint.api.schemas.groups import GroupCreate, MemberAdd
from cutpoint.api.schemas.policy import PolicyUpdate
from cutpoint.api.services import groups, inventory
from fastapi.testclient import TestClient
from plane import Plane, wait_for  # api/tests/plane.py
from sqlalchemy import func, select

ROOT = Path(__file__).resolve().parents[2]


def make_certs(d: Path) -> dict[str, str]:
    script = ROOT / "scripts" / "make-lab-ca.sh"
    subprocess.run([str(script), str(d)], check=True, capture_output=True)
    subprocess.run([str(script), str(d), "issue", "coordinator", "coordinator", "127.0.0.1"], check=True,
                   capture_output=True)
    return {"CUTPOINT_AGENT_CA": str(d / "ca.pem"),
            "CUTPOINT_AGENT_CERT": str(d / "coordinator.pem"),
            "CUTPOINT_AGENT_KEY": str(d / "coordinator.key")}


@pytest.fixture
def plane(tmp_path: Path, local_services: services_local.Endpoints) -> Iterator[Plane]:
    with Plane(tmp_path, int(local_services.redis_port or 0), make_certs(tmp_path / "certs"),
               CUTPOINT_SCHEDULER_MARGIN_S="0.5", CUTPOINT_GROUP_LOCK_TTL_S="6",
               CUTPOINT_AGENT_TIMEOUT_S="2") as p:
        p.start("worker")
        p.start("beat")
        yield p


def test_stopped_agent_gives_recorded_misses(plane: Plane) -> None:
    sf = plane.sf
    with sf() as s:
        site = Site(name="primary")
        s.add(site)
        s.flush()
        # Nothing listens on this port: the agent is stopped.
        host = Host(name="h1", site_id=site.id, address="127.0.0.1",
                    port=services_local.free_port())
        s.add(host)
        s.flush()
        inventory.apply(s, host, {"vms": [{"name": "vm1", "state": "running", "disks": [
            {"id": "vm1/disk0", "node": "disk0", "backend": "rbd", "pool": "rbd",
             "image": "vm1-disk0"}]}]})
        g = groups.create(s, GroupCreate(name="g1", policy=PolicyUpdate(rpo_seconds=3,
                                                                        lease_ms=1000)))
        groups.add_member(s, g, MemberAdd(vm="vm1"))
        gid = g.id

    def count(stmt: Any) -> int:
        with sf() as s:
            return int(s.scalar(stmt) or 0)

    n_failed = select(func.count()).select_from(GroupSnapshot).where(
        GroupSnapshot.group_id == gid, GroupSnapshot.state == SnapState.aborted)
    n_miss = select(func.count()).select_from(RpoMiss).where(RpoMiss.group_id == gid)
    wait_for(lambda: count(n_failed) >= 2 and count(n_miss) >= 2, 60,
             "two aborted snapshots and two RPO misses", plane)
    for p in plane.procs.values():
        assert p.poll() is None, "worker or beat died"
    with sf() as s:
        snaps = s.scalars(select(GroupSnapshot).where(GroupSnapshot.group_id == gid)).all()
        assert all(sn.state in (SnapState.aborted, SnapState.preparing, SnapState.pending)
                   for sn in snaps)
        assert {sn.error_code for sn in snaps if sn.state == SnapState.aborted} == {"CONNECT"}
        # No half-committed snapshot is offered: nothing committed, no members present.
        assert all(m.state != "present" for sn in snaps for m in sn.members)
        misses = s.scalars(select(RpoMiss).where(RpoMiss.group_id == gid)).all()
        assert {m.reason for m in misses} <= {"snapshot_aborted:connect", "scheduler_late",
                                              "snapshot_in_flight"}
        assert any(m.reason == "snapshot_aborted:connect" for m in misses)
        h = s.scalar(select(Host).where(Host.name == "h1"))
        assert h is not None and h.reachable is False
        failed_jobs = s.scalar(select(func.count()).select_from(Job).where(
            Job.kind == "group_snapshot", Job.error_code == "CONNECT"))
        assert failed_jobs and failed_jobs >= 2
    app = create_app(plane.settings)
    with TestClient(app) as c:
        text = c.get("/metrics").text
    assert 'cutpoint_rpo_misses_total{group="g1",reason="snapshot_aborted:connect"}' in text
    assert 'cutpoint_agent_reachable{host="h1",site="primary"} 0.0' in text
    assert 'cutpoint_group_snapshots{group="g1",state="aborted"}' in text
    assert 'cutpoint_job_failures_total{code="CONNECT",kind="group_snapshot"}' in text
