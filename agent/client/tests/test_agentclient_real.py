"""cutpoint.agentclient against the real cutpointd: replies recorded from it
(frames/agent-replies.json, made by record_frames.py) replayed through the
decoder, and live calls to a cutpointd with no VMs on loopback (no lab)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cutpoint.agentclient import (
    AgentClient,
    AgentClosed,
    AgentConnectError,
    AgentReplyError,
    FrameDecoder,
    client_context,
)
from cutpoint.agentclient.errors import PROTOCOL_CODES
from cutpoint.agentclient.framing import check_reply
from cutpoint.agentclient.testing import PKI_ROLES, make_pki

sys.path.insert(0, str(Path(__file__).parent))
import realagent

RECORDED = json.loads((Path(__file__).parent / "frames" / "agent-replies.json").read_text())


def test_recorded_replies_decode_and_match() -> None:
    dec = FrameDecoder()
    stream = b"".join(bytes.fromhex(f["reply_hex"]) for f in RECORDED["frames"])
    replies = dec.feed(stream)
    assert dec.pending == 0 and len(replies) == len(RECORDED["frames"])
    for f, reply in zip(RECORDED["frames"], replies, strict=True):
        check_reply(reply)
        want_id = f["request"]["id"] if "request" in f else None
        assert reply["id"] == want_id
        if not reply["ok"]:
            assert reply["error"]["code"] in PROTOCOL_CODES
    by_cmd = {f["request"]["cmd"]: r for f, r in zip(RECORDED["frames"], replies, strict=True)
              if "request" in f}
    assert by_cmd["hello"]["result"]["protocol"] == 1
    assert by_cmd["no.such"]["error"]["code"] == "UNKNOWN_COMMAND"
    assert by_cmd["prepare"]["error"]["code"] == "BAD_REQUEST"  # the last prepare
    assert replies[-1]["error"]["code"] == "BAD_FRAME"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    d = tmp_path_factory.mktemp("pki")
    out = make_pki(d, {"agent": ["127.0.0.1"], "coordinator": []}, roles=PKI_ROLES)
    out["intruder"] = make_pki(d / "other", {"intruder": []})["intruder"]
    return out


@pytest.fixture
def agent(tmp_path: Path, pki: dict[str, dict[str, str]]) -> Iterator[realagent.RealAgent]:
    if not realagent.binary().is_file():
        pytest.skip(f"cutpointd not built at {realagent.binary()}")
    a = realagent.start(tmp_path, pki)
    yield a
    a.stop()


def client(pki: dict[str, dict[str, str]], port: int, who: str = "coordinator") -> AgentClient:
    return AgentClient("127.0.0.1", port, ssl_context=client_context(
        pki["ca"]["cert"], pki[who]["cert"], pki[who]["key"]), call_timeout=5)


async def test_live_calls(agent: realagent.RealAgent, pki: Any) -> None:
    async with client(pki, agent.port) as c:
        hello = await c.hello()
        assert hello["protocol"] == 1 and hello["host"] == "realagent"
        assert (await c.inventory())["vms"] == []
        with pytest.raises(AgentReplyError) as ei:
            await c.call("no.such")
        assert ei.value.code == "UNKNOWN_COMMAND" and ei.value.sent["cmd"] == "no.such"
        with pytest.raises(AgentReplyError) as ei:
            await c.prepare("t1", ["nope"], 1000)
        assert ei.value.code == "UNKNOWN_VM"
        with pytest.raises(AgentReplyError) as ei:
            await c.commit("t2", {}, 1000)
        assert ei.value.code == "UNKNOWN_TXN"
        for _ in range(2):  # abort is idempotent; an unknown txn is fine
            assert (await c.abort("t2"))["state"] == "aborted"
        # Pipelined requests on one connection, replies matched by id.
        outs = await asyncio.gather(*(c.stats() for _ in range(20)))
        assert len(outs) == 20 and c.connects == 1


async def test_foreign_client_certificate_refused(agent: realagent.RealAgent,
                                                  pki: Any) -> None:
    c = client(pki, agent.port, who="intruder")
    with pytest.raises((AgentConnectError, AgentClosed)):
        await c.hello()
    await c.close()


async def test_other_client_killed_does_not_drop_our_connection(
        agent: realagent.RealAgent, pki: Any) -> None:
    child = (
        "import asyncio, sys, time\n"
        "from cutpoint.agentclient import AgentClient, client_context\n"
        "async def m():\n"
        f"    c = AgentClient('127.0.0.1', {agent.port}, ssl_context=client_context("
        f"{pki['ca']['cert']!r}, {pki['coordinator']['cert']!r}, "
        f"{pki['coordinator']['key']!r}))\n"
        "    await c.hello()\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(60)\n"
        "asyncio.run(m())\n")
    async with client(pki, agent.port) as c:
        await c.hello()
        p = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE,  # noqa: ASYNC220
                             text=True)
        try:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        finally:
            p.kill()
            p.wait()
        await asyncio.sleep(0.05)
        await c.hello()
        assert c.connects == 1


def _sha256_of_pem(path: str) -> str:
    import hashlib
    import ssl

    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(Path(path).read_text())).hexdigest()


async def test_pinned_agent_certificate(agent: realagent.RealAgent, pki: Any) -> None:
    """The pin is the agent's own certificate: calls go through.  Any other
    pin (here the fingerprint of another certificate the same CA could have
    signed) is refused at connect, before a request is sent."""
    own = _sha256_of_pem(pki["agent"]["cert"])
    ctx = client_context(pki["ca"]["cert"], pki["coordinator"]["cert"],
                         pki["coordinator"]["key"])
    colons = ":".join(own[i:i + 2] for i in range(0, 64, 2)).upper()
    async with AgentClient("127.0.0.1", agent.port, ssl_context=ctx,
                           cert_sha256=colons) as c:
        assert (await c.hello())["host"] == "realagent"
        before = (await c.stats())["requests"]
    other = _sha256_of_pem(pki["coordinator"]["cert"])
    bad = AgentClient("127.0.0.1", agent.port, ssl_context=ctx, cert_sha256=other)
    with pytest.raises(AgentConnectError) as ei:
        await bad.hello()
    await bad.close()
    assert ei.value.code == "CERT_MISMATCH" and own in ei.value.message
    async with client(pki, agent.port) as c:
        # The stats call counts itself; the refused client sent nothing.
        assert (await c.stats())["requests"] == before + 1


def test_malformed_pin_is_refused_up_front(pki: Any) -> None:
    ctx = client_context(pki["ca"]["cert"], pki["coordinator"]["cert"],
                         pki["coordinator"]["key"])
    with pytest.raises(ValueError, match="not a SHA-256 fingerprint"):
        AgentClient("127.0.0.1", 1, ssl_context=ctx, cert_sha256="abc")
