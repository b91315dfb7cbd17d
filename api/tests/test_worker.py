"""A real Celery worker and beat on real Redis, against an agent that is down.

The scheduler must keep ticking, every attempt must end aborted with the
agent's connect error recorded, the host must show as unreachable, and RPO
misses must be recorded with their reason and exported in /metrics.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cutpoint.api import services_local
from cutpoint.api.app import create_app
from cutpoint.api.config import Settings
from cutpoint.api.db import get_sessionmaker
from cutpoint.api.migrate import upgrade
from cutpoint.api.models import GroupSnapshot, Host, Job, RpoMiss, Site, SnapState
from cutpoint.api.schemas.groups import GroupCreate, MemberAdd
from cutpoint.api.schemas.policy import PolicyUpdate
from cutpoint.api.services import groups, inventory
from fastapi.testclient import TestClient
from sqlalchemy import func, select

ROOT = Path(__file__).resolve().parents[2]
SECRET = "worker-test-secret-0123456789"


def make_certs(d: Path) -> dict[str, str]:
    script = ROOT / "scripts" / "make-lab-ca.sh"
    subprocess.run([str(script), str(d)], check=True, capture_output=True)
    subprocess.run([str(script), str(d), "issue", "coordinator", "127.0.0.1"], check=True,
                   capture_output=True)
    return {"CUTPOINT_AGENT_CA": str(d / "ca.pem"),
            "CUTPOINT_AGENT_CERT": str(d / "coordinator.pem"),
            "CUTPOINT_AGENT_KEY": str(d / "coordinator.key")}


@pytest.fixture
def plane(tmp_path: Path, local_services: services_local.Endpoints) \
        -> Iterator[dict[str, Any]]:
    db = f"sqlite:///{tmp_path}/cp.db"
    upgrade(db)
    redis_db = 1 + (os.getpid() % 14)
    env = {**os.environ, "CUTPOINT_DATABASE_URL": db,
           "CUTPOINT_REDIS_URL": f"redis://127.0.0.1:{local_services.redis_port}/{redis_db}",
           "CUTPOINT_TOKEN_SECRET": SECRET, "CUTPOINT_SCHEDULER_TICK_S": "1",
           "CUTPOINT_SCHEDULER_MARGIN_S": "0.5", "CUTPOINT_GROUP_LOCK_TTL_S": "6",
           "CUTPOINT_AGENT_TIMEOUT_S": "2", **make_certs(tmp_path / "certs")}
    import redis

    redis.Redis.from_url(env["CUTPOINT_REDIS_URL"]).flushdb()
    celery = [sys.executable, "-m", "celery", "-A", "cutpoint.api.worker:celery_app"]
    log = open(tmp_path / "worker.log", "w")  # noqa: SIM115
    procs = [
        subprocess.Popen([*celery, "worker", "-Q",
                          "cutpoint.snapshots,cutpoint.default,cutpoint.scheduler",
                          "-c", "2", "--loglevel", "INFO", "-n", f"t{os.getpid()}@%h"],
                         env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True),
        subprocess.Popen([*celery, "beat", "-s", str(tmp_path / "beat-schedule"),
                          "--loglevel", "INFO"], env=env, stdout=log,
                         stderr=subprocess.STDOUT, start_new_session=True),
    ]
    settings = Settings(database_url=db, redis_url=env["CUTPOINT_REDIS_URL"],
                        token_secret=SECRET,  # type: ignore[arg-type]
                        agent_ca=env["CUTPOINT_AGENT_CA"], agent_cert=env["CUTPOINT_AGENT_CERT"],
                        agent_key=env["CUTPOINT_AGENT_KEY"])
    try:
        yield {"db": db, "env": env, "sf": get_sessionmaker(db), "settings": settings,
               "procs": procs, "log": tmp_path / "worker.log"}
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        log.close()


def _wait(cond: Any, timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}\n" + log.read_text()[-4000:])


def test_stopped_agent_gives_recorded_misses(plane: dict[str, Any]) -> None:
    sf = plane["sf"]
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
    _wait(lambda: count(n_failed) >= 2 and count(n_miss) >= 2, 60,
          "two aborted snapshots and two RPO misses", plane["log"])
    for p in plane["procs"]:
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
    app = create_app(plane["settings"])
    with TestClient(app) as c:
        text = c.get("/metrics").text
    assert 'cutpoint_rpo_misses_total{group="g1",reason="snapshot_aborted:connect"}' in text
    assert 'cutpoint_agent_reachable{host="h1",site="primary"} 0.0' in text
    assert 'cutpoint_group_snapshots{group="g1",state="aborted"}' in text
    assert 'cutpoint_job_failures_total{code="CONNECT",kind="group_snapshot"}' in text
