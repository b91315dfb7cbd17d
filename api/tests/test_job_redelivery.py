"""A job that outlives the broker's visibility timeout runs once
(api/jobclaim.py), with a real Celery worker on real Redis.

The inventory sync of a host whose agent (an in-process agent-protocol
peer) answers `inventory` only after 25 s runs longer than the 10 s
visibility timeout, so Redis hands the message out again while the first
worker process still runs it.  The second delivery must find the job
claimed and wait instead of running it: one `inventory` call reaches the
agent, the job has one attempt and succeeds.  Without the claim there are
two of each.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cutpoint.agentclient.testing import PKI_ROLES, AgentPeer, make_pki
from cutpoint.api import services_local
from peergroup import fingerprint  # api/tests/peergroup.py
from plane import Plane, admin_client, wait_for  # api/tests/plane.py

SLOW_S = 25.0
VISIBILITY_S = 10


@pytest.fixture(params=["sqlite", "postgresql"])
def slow_peer_and_plane(request: pytest.FixtureRequest, tmp_path: Path,
                        local_services: services_local.Endpoints,
                        empty_db: Any) -> Iterator[tuple[AgentPeer, Plane, str]]:
    pki = make_pki(tmp_path / "pki", {"agent": ["127.0.0.1"], "coordinator": []}, roles=PKI_ROLES)
    loop = asyncio.new_event_loop()
    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    peer = AgentPeer("h-slow", {"vm1": ["disk0"]}, ca=pki["ca"]["cert"],
                     cert=pki["agent"]["cert"], key=pki["agent"]["key"])
    peer.delay["inventory"] = SLOW_S
    asyncio.run_coroutine_threadsafe(peer.start(), loop).result(10)
    certs = {"CUTPOINT_AGENT_CA": pki["ca"]["cert"],
             "CUTPOINT_AGENT_CERT": pki["coordinator"]["cert"],
             "CUTPOINT_AGENT_KEY": pki["coordinator"]["key"]}
    try:
        # On SQLite this also shows that the first run holds no write
        # transaction across the slow agent call: if it did, the second
        # delivery would fail "database is locked" before the claim.
        with Plane(tmp_path, int(local_services.redis_port or 0), certs,
                   db=empty_db(request.param), CUTPOINT_INVENTORY_INTERVAL_S="3600",
                   CUTPOINT_BROKER_VISIBILITY_TIMEOUT_S=str(VISIBILITY_S),
                   CUTPOINT_AGENT_TIMEOUT_S="60", CUTPOINT_JOB_CLAIM_TTL_S="6") as p:
            p.start("worker")
            yield peer, p, fingerprint(pki["agent"]["cert"])
    finally:
        asyncio.run_coroutine_threadsafe(peer.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        t.join(10)


def test_a_job_longer_than_the_visibility_timeout_runs_once(
        slow_peer_and_plane: tuple[AgentPeer, Plane, str]) -> None:
    peer, plane, pin = slow_peer_and_plane
    with admin_client(plane) as c:
        assert c.post("/v1/sites", json={"name": "p"}).status_code == 201
        h = c.post("/v1/hosts", json={"name": "h-slow", "site": "p", "address": "127.0.0.1",
                                      "port": peer.port, "cert_fingerprint": pin}).json()
        job = c.post(f"/v1/hosts/{h['id']}/sync").json()
        wait_for(lambda: c.get(f"/v1/jobs/{job['id']}").json()["state"]
                 in ("succeeded", "failed"), SLOW_S + 90, "the slow inventory sync", plane)
        done = c.get(f"/v1/jobs/{job['id']}").json()
    log = plane.tail(200_000)
    inventory_calls = peer.cmds().count("inventory")
    print(f"job {done['state']} after {SLOW_S:.0f} s agent delay, visibility "
          f"{VISIBILITY_S} s: attempts {done['attempts']}, inventory calls {inventory_calls}, "
          f"redeliveries held back {log.count('event=running_elsewhere')}")
    # The redelivery happened (else this test shows nothing) and was held back.
    assert "event=running_elsewhere" in log, log[-4000:]
    assert "database is locked" not in log, log[-4000:]
    assert done["state"] == "succeeded", (done, log[-4000:])
    assert done["attempts"] == 1, done
    assert inventory_calls == 1, peer.cmds()
