"""cutpoint.agentclient: frames, reply parsing and the connection, against
frames written byte for byte as docs/agent-protocol.md §2-§4 specifies, and
a scripted TLS 1.3 peer that replays them."""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from cutpoint.agentclient import (
    MAX_FRAME,
    AgentClient,
    AgentClosed,
    AgentConnectError,
    AgentReplyError,
    AgentTimeout,
    FrameDecoder,
    FrameError,
    client_context,
    decode_body,
    encode_frame,
)
from cutpoint.agentclient.framing import read_frame
from cutpoint.agentclient.testing import PKI_ROLES, make_pki
from cutpoint.agentclient.tls import server_context

# Replies as the agent sends them (agent-protocol §4), framed.
PREPARED = (b'\x00\x00\x00\x6f{"id":1,"ok":true,"result":{"txn":"t1","state":"prepared",'
            b'"vms":[{"vm":"vm1","stop_ms":0.41}],"lease_ms":2000}}')
FAILED_COMMIT = (b'{"id":2,"ok":false,"error":{"code":"SNAPSHOT_FAILED","message":'
                 b'"rbd_snap_create primary-h1-vm1-disk1: Disk quota exceeded"},'
                 b'"result":{"txn":"t1","state":"failed","vms":[{"vm":"vm1",'
                 b'"paused_ms":21.5,"disks":[{"disk":"vm1/disk1","ok":false}]}]}}')
BAD_FRAME = b'{"id":null,"ok":false,"error":{"code":"BAD_FRAME","message":"frame too large"}}'


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def test_encode_request_exact_bytes() -> None:
    f = encode_frame({"id": 7, "cmd": "prepare",
                      "args": {"txn": "t1", "vms": ["vm1"], "lease_ms": 2000}})
    body = b'{"id":7,"cmd":"prepare","args":{"txn":"t1","vms":["vm1"],"lease_ms":2000}}'
    assert f == frame(body)
    assert f[:4] == b"\x00\x00\x00\x4a"


def test_recorded_reply_decodes() -> None:
    assert len(PREPARED) == 4 + 0x6F
    (obj,) = FrameDecoder().feed(PREPARED)
    assert obj["result"]["vms"][0]["stop_ms"] == 0.41


@pytest.mark.parametrize("chunk", [1, 3, 4, 5, 50, 1000])
def test_decoder_any_split(chunk: int) -> None:
    stream = PREPARED + frame(FAILED_COMMIT) + frame("{\"é\":\"ü\"}".encode())
    dec, out = FrameDecoder(), []
    for i in range(0, len(stream), chunk):
        out += dec.feed(stream[i:i + chunk])
    assert [o.get("id") for o in out] == [1, 2, None]
    assert out[2] == {"é": "ü"} and dec.pending == 0


@pytest.mark.parametrize(("data", "needle"), [
    (b"\x00\x00\x00\x00", "outside 1..1048576"),
    (struct.pack(">I", MAX_FRAME + 1), "outside 1..1048576"),
    (frame(b'{"a":"\xc0\xaf"}'), "invalid UTF-8"),         # overlong '/'
    (frame(b'{"a":"\xed\xa0\x80"}'), "invalid UTF-8"),     # surrogate
    (frame(b'{"a":"\xf4\x90\x80\x80"}'), "invalid UTF-8"), # above U+10FFFF
    (frame(b'{"a":"\x00"}'), "NUL"),
    (frame(b'[1,2]'), "not an object"),
    (frame(b'{"a":'), "invalid JSON"),
])
def test_bad_frames_rejected(data: bytes, needle: str) -> None:
    with pytest.raises(FrameError, match=needle):
        FrameDecoder().feed(data)


def test_encode_refuses_oversized_and_non_objects() -> None:
    with pytest.raises(FrameError, match="exceeds"):
        encode_frame({"x": "a" * MAX_FRAME})
    with pytest.raises(FrameError):
        encode_frame([1])  # type: ignore[arg-type]
    assert decode_body(b'{"a":1}') == {"a": 1}


async def test_truncated_stream_is_an_error() -> None:
    r = asyncio.StreamReader()
    r.feed_data(PREPARED[:20])
    r.feed_eof()
    with pytest.raises(FrameError, match="stream ended after"):
        await read_frame(r)
    r2 = asyncio.StreamReader()
    r2.feed_eof()
    assert await read_frame(r2) is None


# -- a scripted TLS peer --------------------------------------------------------
Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    d = tmp_path_factory.mktemp("pki")
    out = make_pki(d, {"agent": ["127.0.0.1"], "coordinator": []}, roles=PKI_ROLES)
    other = make_pki(d / "other", {"intruder": []})
    out["intruder"] = other["intruder"]
    return out


@pytest.fixture
async def serve(pki: dict[str, dict[str, str]]) -> AsyncIterator[Callable[[Script], Awaitable[int]]]:
    servers = []

    async def start(script: Script) -> int:
        ctx = server_context(pki["ca"]["cert"], pki["agent"]["cert"], pki["agent"]["key"])
        srv = await asyncio.start_server(script, "127.0.0.1", 0, ssl=ctx)
        servers.append(srv)
        return int(srv.sockets[0].getsockname()[1])

    yield start
    for s in servers:
        s.close()


def client(pki: dict[str, dict[str, str]], port: int, who: str = "coordinator",
           **kw: Any) -> AgentClient:
    ctx = client_context(pki["ca"]["cert"], pki[who]["cert"], pki[who]["key"])
    return AgentClient("127.0.0.1", port, ssl_context=ctx, **kw)


async def test_pipelined_replies_out_of_order(serve: Any, pki: Any) -> None:
    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        a = await read_frame(r)
        b = await read_frame(r)
        assert a is not None and b is not None
        for req in (b, a):  # §1.3: replies may come back in any order
            w.write(encode_frame({"id": req["id"], "ok": True,
                                  "result": {"echo": req["cmd"]}}))
        await w.drain()
        await r.read()

    port = await serve(script)
    async with client(pki, port) as c:
        x, y = await asyncio.gather(c.call("hello"), c.call("stats"))
    assert x == {"echo": "hello"} and y == {"echo": "stats"}


async def test_error_reply_carries_sent_and_received(serve: Any, pki: Any) -> None:
    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        req = await read_frame(r)
        assert req is not None and req["cmd"] == "commit"
        body = json.loads(FAILED_COMMIT)
        body["id"] = req["id"]
        w.write(encode_frame(body))
        await w.drain()
        await r.read()

    port = await serve(script)
    async with client(pki, port) as c:
        with pytest.raises(AgentReplyError) as ei:
            await c.commit("t1", {"vm1/disk1": "cp.g.t1"}, 1000)
    e = ei.value
    assert e.code == "SNAPSHOT_FAILED" and "Disk quota" in e.message
    assert e.sent["args"] == {"txn": "t1", "snapshots": {"vm1/disk1": "cp.g.t1"},
                              "budget_ms": 1000}
    assert e.received["error"]["code"] == "SNAPSHOT_FAILED"
    assert e.result["vms"][0]["paused_ms"] == 21.5


async def test_timeout_then_late_reply_is_dropped(serve: Any, pki: Any) -> None:
    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        first = await read_frame(r)
        second = await read_frame(r)
        assert first is not None and second is not None
        for req in (first, second):
            w.write(encode_frame({"id": req["id"], "ok": True, "result": {"n": req["id"]}}))
        await w.drain()
        await r.read()

    port = await serve(script)
    async with client(pki, port) as c:
        with pytest.raises(AgentTimeout) as ei:
            await c.call("prepare", {"txn": "t"}, timeout=0.05)
        assert ei.value.sent["cmd"] == "prepare" and ei.value.received is None
        assert await c.call("hello") == {"n": 2}  # not the late reply to id 1
        assert c.connects == 1


async def test_bad_frame_reply_and_close(serve: Any, pki: Any) -> None:
    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_frame(r)
        w.write(frame(BAD_FRAME))
        await w.drain()
        w.close()

    port = await serve(script)
    async with client(pki, port) as c:
        with pytest.raises(AgentReplyError) as ei:
            await c.hello()
        assert ei.value.code == "BAD_FRAME"


async def test_connection_drop_then_reconnect(serve: Any, pki: Any) -> None:
    conns = []

    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        conns.append(w)
        req = await read_frame(r)
        if len(conns) == 1:
            w.close()  # drop with the request in flight
            return
        assert req is not None
        w.write(encode_frame({"id": req["id"], "ok": True, "result": {}}))
        await w.drain()
        await r.read()

    port = await serve(script)
    async with client(pki, port) as c:
        with pytest.raises(AgentClosed) as ei:
            await c.call("hello")
        assert ei.value.sent["cmd"] == "hello"
        assert await c.call("hello") == {}
        assert c.connects == 2


async def test_idempotent_command_is_resent_once_after_a_drop(serve: Any, pki: Any) -> None:
    seen: list[dict[str, Any]] = []

    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        req = await read_frame(r)
        assert req is not None
        seen.append(req)
        if len(seen) == 1:
            w.close()  # drop with the prepare in flight
            return
        w.write(encode_frame({"id": req["id"], "ok": True, "result": {
            "txn": "t1", "state": "prepared", "vms": [{"vm": "vm1", "stop_ms": 0.3}],
            "lease_ms": 1000}}))
        await w.drain()
        await r.read()

    port = await serve(script)
    async with client(pki, port) as c:
        res = await c.prepare("t1", ["vm1"], 1000, timeout=5)
    assert res["state"] == "prepared" and c.connects == 2
    assert [q["args"]["txn"] for q in seen] == ["t1", "t1"]  # the same txn, resent


async def test_protocol_violation_from_agent(serve: Any, pki: Any) -> None:
    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_frame(r)
        w.write(frame(b'{"id":1,"ok":"yes"}'))
        await w.drain()
        await r.read()

    port = await serve(script)
    async with client(pki, port) as c:
        with pytest.raises(Exception) as ei:
            await c.hello()
    assert getattr(ei.value, "code", None) == "PROTOCOL"


async def test_wrong_ca_is_refused(serve: Any, pki: Any) -> None:
    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.read()

    port = await serve(script)
    c = client(pki, port, who="intruder")
    with pytest.raises((AgentConnectError, AgentClosed)):
        await c.hello()
    await c.close()


async def test_nothing_listening(pki: Any, tmp_path: Path) -> None:
    c = client(pki, 1, connect_timeout=1.0)
    with pytest.raises(AgentConnectError) as ei:
        await c.hello()
    assert ei.value.code == "CONNECT" and "127.0.0.1:1" in ei.value.message


async def test_connection_has_keepalive(serve: Any, pki: Any) -> None:
    """An agent that vanishes without a FIN (host down, packets dropped) is
    seen within 10 s: keepalive after 2 s idle, 3 probes 2 s apart, and 8 s
    for unacknowledged data (agent-protocol §1.7)."""
    import socket

    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.read()

    port = await serve(script)
    async with client(pki, port) as c:
        assert c._writer is not None
        sock = c._writer.get_extra_info("socket")
        opts = {name: sock.getsockopt(level, opt) for name, level, opt in (
            ("keepalive", socket.SOL_SOCKET, socket.SO_KEEPALIVE),
            ("idle", socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
            ("intvl", socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
            ("cnt", socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
            ("user_timeout", socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT))}
    assert opts == {"keepalive": 1, "idle": 2, "intvl": 2, "cnt": 3, "user_timeout": 8000}
    assert opts["idle"] + opts["cnt"] * opts["intvl"] < 10
