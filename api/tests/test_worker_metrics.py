"""The worker's metrics port (api/worker_metrics.py), with a real worker
(prefork, 2 children) on real Redis: after inventory syncs run in the
children, the main process serves their counts, summed, in the Prometheus
text format, and the exposition parses."""

from __future__ import annotations

import shutil
import socket
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

from cutpoint.api.worker_metrics import multiproc_dir
from plane import Plane, admin_client, wait_for  # api/tests/plane.py
from prometheus_client.parser import text_string_to_metric_families


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _samples(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    out = {}
    for fam in text_string_to_metric_families(text.decode()):
        for smp in fam.samples:
            out[(smp.name, tuple(sorted(smp.labels.items())))] = smp.value
    return out


def test_the_worker_serves_its_childrens_task_counts(tmp_path: Path,
                                                     local_services: Any) -> None:
    import asyncio
    import threading

    from cutpoint.agentclient.testing import PKI_ROLES, AgentPeer, make_pki
    from peergroup import fingerprint  # api/tests/peergroup.py

    pki = make_pki(tmp_path / "pki", {"agent": ["127.0.0.1"], "coordinator": []},
                   roles=PKI_ROLES)
    loop = asyncio.new_event_loop()
    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    peer = AgentPeer("h-m", {"vm1": ["disk0"]}, ca=pki["ca"]["cert"],
                     cert=pki["agent"]["cert"], key=pki["agent"]["key"])
    asyncio.run_coroutine_threadsafe(peer.start(), loop).result(10)
    port = _free_port()
    certs = {"CUTPOINT_AGENT_CA": pki["ca"]["cert"],
             "CUTPOINT_AGENT_CERT": pki["coordinator"]["cert"],
             "CUTPOINT_AGENT_KEY": pki["coordinator"]["key"]}
    try:
        with Plane(tmp_path, int(local_services.redis_port or 0), certs,
                   CUTPOINT_INVENTORY_INTERVAL_S="3600", CUTPOINT_WORKER_METRICS_PORT=str(port),
                   **multiproc_dir(port)) as plane:
            plane.start("worker")
            wait_for(lambda: "event=worker_metrics_serving" in plane.tail(), 60,
                     "the worker's metrics port", plane)
            with admin_client(plane) as c:
                assert c.post("/v1/sites", json={"name": "p"}).status_code == 201
                h = c.post("/v1/hosts", json={
                    "name": "h-m", "site": "p", "address": "127.0.0.1", "port": peer.port,
                    "cert_fingerprint": fingerprint(pki["agent"]["cert"])}).json()
                n = 4
                for _ in range(n):
                    job = c.post(f"/v1/hosts/{h['id']}/sync").json()
                    wait_for(lambda j=job: c.get(f"/v1/jobs/{j['id']}").json()["state"]
                             == "succeeded", 60, "an inventory sync", plane)
            key = ("cutpoint_task_runs_total", (("outcome", "ok"), ("task", "inventory_sync")))
            got = wait_for(lambda: _samples(port).get(key) == n and _samples(port), 30,
                           f"{n} inventory syncs counted", plane)
            print({k: v for k, v in got.items() if "inventory_sync" in str(k)})
            count = ("cutpoint_task_seconds_count", (("task", "inventory_sync"),))
            assert got[count] == n, got
            if shutil.which("promtool"):  # make setup installs it
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                              timeout=10).read().decode()
                r = subprocess.run(["promtool", "check", "metrics"], input=text,
                                   capture_output=True, text=True, timeout=60, check=False)
                assert r.returncode == 0, r.stdout + r.stderr
    finally:
        asyncio.run_coroutine_threadsafe(peer.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        t.join(10)
