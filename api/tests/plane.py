"""A real control plane for tests: Celery worker + beat subprocesses on the
project's Redis, a fresh SQLite database, and an in-process API client."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import redis
from cutpoint.api.config import Settings
from cutpoint.api.db import get_sessionmaker
from cutpoint.api.migrate import upgrade

SECRET = "plane-test-secret-0123456789"
CELERY = [sys.executable, "-m", "celery", "-A", "cutpoint.api.worker:celery_app"]
QUEUES = "cutpoint.snapshots,cutpoint.default,cutpoint.scheduler,cutpoint.inventory"


class Plane:
    def __init__(self, tmp: Path, redis_port: int, certs: dict[str, str], *,
                 db: str | None = None, **env: str) -> None:
        self.tmp = tmp
        self.db = db or f"sqlite:///{tmp}/cp.db"
        upgrade(self.db)
        redis_db = 1 + (os.getpid() % 14)
        self.env = {**os.environ, "CUTPOINT_DATABASE_URL": self.db,
                    "CUTPOINT_REDIS_URL": f"redis://127.0.0.1:{redis_port}/{redis_db}",
                    "CUTPOINT_TOKEN_SECRET": SECRET, "CUTPOINT_SCHEDULER_TICK_S": "1",
                    "CUTPOINT_AGENT_TIMEOUT_S": "3", **certs, **env}
        redis.Redis.from_url(self.env["CUTPOINT_REDIS_URL"]).flushdb()
        self.settings = Settings(
            database_url=self.db, redis_url=self.env["CUTPOINT_REDIS_URL"],
            token_secret=SECRET,  # type: ignore[arg-type]
            agent_ca=certs["CUTPOINT_AGENT_CA"], agent_cert=certs["CUTPOINT_AGENT_CERT"],
            agent_key=certs["CUTPOINT_AGENT_KEY"],
            booter=self.env.get("CUTPOINT_BOOTER", "agent"))
        self.sf = get_sessionmaker(self.db)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.log = tmp / "plane.log"
        self._n = 0

    def start(self, name: str, queues: str = QUEUES) -> subprocess.Popen[bytes]:
        self._n += 1
        if name.startswith("worker"):
            argv = [*CELERY, "worker", "-Q", queues, "-c", "2", "--loglevel", "INFO",
                    "-n", f"w{self._n}-{os.getpid()}@%h"]
        else:
            argv = [*CELERY, "beat", "-s", str(self.tmp / "beat-schedule"), "--loglevel", "INFO"]
        out = open(self.log, "ab")  # noqa: SIM115
        p = subprocess.Popen(argv, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                             start_new_session=True)
        self.procs[name] = p
        return p

    def kill9(self, name: str) -> None:
        p = self.procs.pop(name)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.procs.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def tail(self, n: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""


def wait_for(cond: Any, timeout: float, what: str, plane: Plane | None = None,
             every: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n"
                         + (plane.tail() if plane else ""))


def lab_plane(lab: dict[str, Any], tmp: Path, redis_port: int, **env: str) -> Plane:
    """A Plane on the lab: its agents reached with the lab's coordinator
    certificate (`cutpoint.lab.agents` issues it under the lab's state dir)
    and the lab's booter.  Its sites are registered through the API, with
    their Ceph access (`register_lab_site`)."""
    certs = Path(lab["state_dir"]) / "certs"
    return Plane(tmp, redis_port, {"CUTPOINT_AGENT_CA": str(certs / "ca.pem"),
                                   "CUTPOINT_AGENT_CERT": str(certs / "coordinator.pem"),
                                   "CUTPOINT_AGENT_KEY": str(certs / "coordinator.key")},
                 **{"CUTPOINT_BOOTER": "lab", **env})


def register_lab_site(c: Any, lab: dict[str, Any], name: str) -> dict[str, Any]:
    """`POST /v1/sites` of lab site `name` with its Ceph access as the control
    plane's client (client.cutpoint); the API checks it before it stores it."""
    from cutpoint.lab.sites import registration

    r = c.post("/v1/sites", json=registration(lab, name))
    assert r.status_code == 201, r.text
    assert r.json()["last_check"]["ok"], r.json()
    return dict(r.json())


def lab_pin(lab: dict[str, Any], host: str) -> str:
    """The pin of a lab host's agent: SHA-256 of its certificate (DER)."""
    import hashlib
    import ssl

    pem = (Path(lab["state_dir"]) / "certs" / f"{host}.pem").read_text()
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem)).hexdigest()


def agent_vm_states(lab: dict[str, Any], plane: Plane, site: str = "primary") \
        -> dict[str, str]:
    """VM name -> run state, as the agents of the lab's `site` hosts list
    them (inventory), asked with the plane's coordinator certificate."""
    from cutpoint.agentclient import AgentClient, client_context

    st = plane.settings
    ctx = client_context(st.agent_ca, st.agent_cert, st.agent_key)

    async def one(h: dict[str, Any]) -> dict[str, str]:
        async with AgentClient(h["address"], 7443, ssl_context=ctx) as ac:
            inv = await ac.call("inventory", {}, timeout=10)
        return {v["name"]: v["state"] for v in inv["vms"]}

    out: dict[str, str] = {}
    for h in lab["hosts"]:
        if h["site"] == site:
            out.update(asyncio.run(one(h)))
    return out


@contextlib.contextmanager
def admin_client(plane: Plane) -> Iterator[Any]:
    """An in-process API client holding a fresh admin token of the plane's database."""
    from cutpoint.api.app import create_app
    from cutpoint.api.models import Role
    from cutpoint.api.services import tokens
    from fastapi.testclient import TestClient

    with plane.sf() as s:
        _, tok = tokens.create(s, "lab-admin", Role.admin, SECRET)
    with TestClient(create_app(plane.settings),
                    headers={"Authorization": f"Bearer {tok}"}) as c:
        yield c
