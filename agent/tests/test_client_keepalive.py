"""The coordinator side of dead-peer detection (issue 16 item 7, the fault
matrix's "a peer gone without FIN" row): the agent client's TCP keepalive
(`agent/client/client.py` `_keepalive`) sees an agent whose packets stopped
coming within 10 s, on an idle connection, with no call in flight to time
out.

A real cutpointd on 127.0.0.1 (test_agent_authz's `Agent`); iptables drops
every packet from the agent's port to this connection's client port, so
the client's probes go unanswered and nothing the agent sends (its own
keepalive's close included) arrives.  The negative control runs the same
with `_keepalive` switched off: the client still counts the connection
open after 12 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cutpoint.agentclient import AgentClient, client_context
from cutpoint.agentclient import client as client_mod
from test_agent_authz import Agent, agent, certs  # noqa: F401  (fixtures)

pytestmark = pytest.mark.lab


@contextlib.contextmanager
def _drop_from_agent(agent_port: int, client_port: int) -> Iterator[None]:
    rule = ["INPUT", "-i", "lo", "-p", "tcp", "-s", "127.0.0.1", "--sport", str(agent_port),
            "--dport", str(client_port), "-j", "DROP"]
    subprocess.run(["iptables", "-I", *rule], check=True)
    try:
        yield
    finally:
        subprocess.run(["iptables", "-D", *rule], check=True)


async def _seen_dead_after(agent: Agent, certs: Path, wait_s: float) -> float | None:
    """Seconds until the client counts its idle connection closed, once the
    agent's packets stop; None if still open after `wait_s`."""
    if not shutil.which("iptables"):
        pytest.fail("iptables is needed to drop the agent's packets")
    ctx = client_context(certs / "ca.pem", certs / "coordinator.pem", certs / "coordinator.key")
    c = AgentClient("127.0.0.1", agent.port, ssl_context=ctx, call_timeout=5)
    try:
        await c.connect()
        await c.call("hello", {}, timeout=5)
        assert c._writer is not None
        cport = int(c._writer.get_extra_info("sockname")[1])
        with _drop_from_agent(agent.port, cport):
            t0 = time.monotonic()
            while c.connected and time.monotonic() - t0 < wait_s:
                await asyncio.sleep(0.1)
            return None if c.connected else time.monotonic() - t0
    finally:
        await c.close()


async def test_client_sees_a_silent_agent_within_10s(agent: Agent, certs: Path) -> None:  # noqa: F811
    took = await _seen_dead_after(agent, certs, 15)
    print(f"\nidle connection to a silent agent seen closed after "
          f"{'never' if took is None else f'{took:.1f} s'}")
    assert took is not None and took < 10, took


async def test_without_keepalive_the_silent_agent_goes_unseen(
        agent: Agent, certs: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """Negative control: the same with `_keepalive` a no-op."""
    monkeypatch.setattr(client_mod, "_keepalive", lambda _w: None)
    took = await _seen_dead_after(agent, certs, 12)
    print(f"\nwithout keepalive: seen closed after "
          f"{'never (12 s)' if took is None else f'{took:.1f} s'}")
    assert took is None, took
