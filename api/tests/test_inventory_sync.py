"""POST /v1/hosts/{id}/sync through a real Celery worker: against an
in-process agent-protocol peer (mutual TLS) the job succeeds and the host's
VMs, disks and agent version are recorded; against a closed port the job
fails with the connect error and the host is recorded unreachable."""

from __future__ import annotations

import asyncio
import datetime as dt
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cutpoint.agentclient.testing import PKI_ROLES, AgentPeer, make_pki
from cutpoint.api import services_local
from peergroup import fingerprint  # api/tests/peergroup.py
from plane import Plane, admin_client, wait_for  # api/tests/plane.py

PINS: dict[str, str] = {}  # the peer's certificate pin, by name
PEMS: dict[str, str] = {}  # the peer's certificate file, by name


@pytest.fixture
def peer_and_plane(tmp_path: Path, local_services: services_local.Endpoints) \
        -> Iterator[tuple[AgentPeer, Plane]]:
    pki = make_pki(tmp_path / "pki", {"agent": ["127.0.0.1"], "coordinator": []}, roles=PKI_ROLES)
    loop = asyncio.new_event_loop()
    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    PINS["agent"] = fingerprint(pki["agent"]["cert"])
    PEMS["agent"] = pki["agent"]["cert"]
    peer = AgentPeer("h-up", {"vm1": ["disk0", "disk1"]}, ca=pki["ca"]["cert"],
                     cert=pki["agent"]["cert"], key=pki["agent"]["key"])
    asyncio.run_coroutine_threadsafe(peer.start(), loop).result(10)
    certs = {"CUTPOINT_AGENT_CA": pki["ca"]["cert"],
             "CUTPOINT_AGENT_CERT": pki["coordinator"]["cert"],
             "CUTPOINT_AGENT_KEY": pki["coordinator"]["key"]}
    try:
        with Plane(tmp_path, int(local_services.redis_port or 0), certs,
                   CUTPOINT_INVENTORY_INTERVAL_S="3600") as p:
            p.start("worker")
            yield peer, p
    finally:
        asyncio.run_coroutine_threadsafe(peer.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        t.join(10)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _sync(c: Any, plane: Plane, host_id: int) -> dict[str, Any]:
    job = c.post(f"/v1/hosts/{host_id}/sync").json()
    wait_for(lambda: c.get(f"/v1/jobs/{job['id']}").json()["state"] in ("succeeded", "failed"),
             60, "inventory sync", plane)
    return dict(c.get(f"/v1/jobs/{job['id']}").json())


def test_sync_records_inventory_or_unreachable(
        peer_and_plane: tuple[AgentPeer, Plane]) -> None:
    peer, plane = peer_and_plane
    with admin_client(plane) as c:
        assert c.post("/v1/sites", json={"name": "p"}).status_code == 201
        up = c.post("/v1/hosts", json={"name": "h-up", "site": "p", "address": "127.0.0.1",
                                       "port": peer.port,
                                       "cert_fingerprint": PINS["agent"]}).json()
        down = c.post("/v1/hosts", json={"name": "h-down", "site": "p",
                                         "address": "127.0.0.1", "port": _closed_port(),
                                         "cert_fingerprint": "0f" * 32}).json()
        job = _sync(c, plane, up["id"])
        assert job["state"] == "succeeded", (job, plane.tail())
        assert job["result"]["host"] == "h-up", job
        h = c.get(f"/v1/hosts/{up['id']}").json()
        assert h["reachable"] is True and h["agent_version"] == "peer", h
        vms = c.get("/v1/vms").json()["items"]
        assert [v["name"] for v in vms] == ["vm1"], vms
        assert "inventory" in peer.cmds() and "hello" in peer.cmds(), peer.cmds()
        # The agent certificate's expiry, as presented, on the host and as a metric.
        want = x509.load_pem_x509_certificate(Path(PEMS["agent"]).read_bytes()) \
            .not_valid_after_utc
        got = dt.datetime.fromisoformat(h["cert_not_after"])
        assert got == want, (got, want)
        line = next(ln for ln in c.get("/metrics").text.splitlines()
                    if ln.startswith('cutpoint_agent_cert_expiry_timestamp_seconds{host="h-up"'))
        assert float(line.split()[-1]) == want.timestamp(), line

        job = _sync(c, plane, down["id"])
        assert job["state"] == "failed", job
        assert job["error_code"] == "connect", job
        h = c.get(f"/v1/hosts/{down['id']}").json()
        assert h["reachable"] is False and h["last_error"], h
