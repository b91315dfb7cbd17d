"""The async client of the agent protocol (docs/agent-protocol.md).

One `AgentClient` keeps one TLS connection to one agent open and reuses it
(§1.3: the pause window must not contain a handshake).  Requests are
pipelined; a reader task matches replies to requests by `id`, since replies
may come back in any order.  A lost connection is re-opened on the next call.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import logging
import socket
import ssl
import time
from typing import Any, Self

from cutpoint.agentclient import errors
from cutpoint.agentclient.errors import (
    AgentClosed,
    AgentConnectError,
    AgentError,
    AgentProtocolError,
    AgentReplyError,
    AgentTimeout,
    FrameError,
)
from cutpoint.agentclient.framing import check_reply, encode_frame, read_frame

log = logging.getLogger(__name__)

DEFAULT_PORT = 7443


def normalize_fingerprint(fp: str | None) -> str | None:
    """`AB:CD:...` or `abcd...` -> 64 lowercase hex digits; None stays None."""
    if fp is None:
        return None
    hexfp = fp.replace(":", "").lower()
    if len(hexfp) != 64 or any(c not in "0123456789abcdef" for c in hexfp):
        raise ValueError(f"not a SHA-256 fingerprint: {fp!r}")
    return hexfp


def peer_not_after(writer: asyncio.StreamWriter) -> float | None:
    """When the TLS peer's certificate expires (Unix seconds), as verified."""
    sslobj = writer.get_extra_info("ssl_object")
    try:
        cert = sslobj.getpeercert() if sslobj is not None else None
    except ValueError:  # TLS 1.3: the peer may still refuse our certificate
        return None
    if not cert or "notAfter" not in cert:
        return None
    return float(ssl.cert_time_to_seconds(str(cert["notAfter"])))


def peer_fingerprint(writer: asyncio.StreamWriter) -> str | None:
    """SHA-256 (hex) of the DER certificate the TLS peer presented."""
    sslobj = writer.get_extra_info("ssl_object")
    der = sslobj.getpeercert(binary_form=True) if sslobj is not None else None
    return hashlib.sha256(der).hexdigest() if der else None



def _keepalive(writer: asyncio.StreamWriter) -> None:
    """TCP keepalive on the agent connection: an agent whose host died, or
    whose packets are dropped, is seen dead within 10 s (idle 2 s, then 3
    probes 2 s apart; unacknowledged data gives up after 8 s), not after the
    kernel's default of about 15 minutes.  The agent does the same."""
    sock = writer.get_extra_info("socket")
    if sock is None or not hasattr(socket, "TCP_KEEPIDLE"):
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 2)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 2)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, 8000)

class AgentClient:
    def __init__(self, address: str, port: int = DEFAULT_PORT, *,
                 ssl_context: ssl.SSLContext, server_name: str | None = None,
                 connect_timeout: float = 5.0, call_timeout: float = 30.0,
                 name: str | None = None, cert_sha256: str | None = None) -> None:
        self.address = address
        self.port = port
        self.name = name or f"{address}:{port}"
        self._ssl = ssl_context
        self._server_name = server_name or address
        self.connect_timeout = connect_timeout
        self.call_timeout = call_timeout
        # The agent certificate pinned for this host (SHA-256 of its DER, hex):
        # a certificate that chains to the CA but is not this host's own is
        # refused before anything is sent (a stolen or reissued agent key).
        self.cert_sha256 = normalize_fingerprint(cert_sha256)
        # The agent certificate's expiry (Unix seconds), once connected.
        self.peer_not_after: float | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._pending: dict[int | str, tuple[dict[str, Any], asyncio.Future[dict[str, Any]]]] = {}
        self._ids = itertools.count(1)
        self._connect_lock = asyncio.Lock()
        self._write_lock = asyncio.Lock()
        self.connects = 0  # how many TLS connections were opened (reuse check)

    # -- connection -----------------------------------------------------
    @property
    def connected(self) -> bool:
        return self._writer is not None and not self._writer.is_closing()

    async def connect(self) -> None:
        async with self._connect_lock:
            if self.connected:
                return
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(
                        self.address, self.port, ssl=self._ssl,
                        server_hostname=self._server_name,
                        ssl_handshake_timeout=self.connect_timeout),
                    self.connect_timeout)
            except (TimeoutError, OSError, ssl.SSLError) as exc:
                what = "timed out" if isinstance(exc, asyncio.TimeoutError) else str(exc)
                raise AgentConnectError(
                    errors.CONNECT,
                    f"cannot connect to {self.address}:{self.port}: {what}",
                    agent=self.name) from exc
            if self.cert_sha256 is not None:
                got = peer_fingerprint(writer)
                if got != self.cert_sha256:
                    writer.close()
                    raise AgentConnectError(
                        errors.CERT_MISMATCH,
                        f"agent certificate sha256 {got} is not the pinned "
                        f"{self.cert_sha256}", agent=self.name)
            _keepalive(writer)
            self.peer_not_after = peer_not_after(writer)
            self._reader, self._writer = reader, writer
            self.connects += 1
            self._reader_task = asyncio.create_task(
                self._read_loop(reader), name=f"agent-reader-{self.name}")

    async def close(self) -> None:
        writer, task = self._writer, self._reader_task
        self._writer = self._reader = None
        self._reader_task = None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if writer is not None:
            writer.close()
            with contextlib.suppress(TimeoutError, OSError, ssl.SSLError):
                await asyncio.wait_for(writer.wait_closed(), 1.0)
        self._fail_all(AgentClosed(errors.CLOSED, "client closed", agent=self.name))

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _fail_all(self, exc: AgentError) -> None:
        pending, self._pending = self._pending, {}
        for sent, fut in pending.values():
            if not fut.done():
                exc_i = type(exc)(exc.code, exc.message, sent, exc.received,
                                  agent=self.name)
                fut.set_exception(exc_i)

    async def _read_loop(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                try:
                    reply = await read_frame(reader)
                    if reply is None:
                        raise AgentClosed(errors.CLOSED,
                                          "agent closed the connection",
                                          agent=self.name)
                    check_reply(reply)
                except FrameError as exc:
                    raise AgentProtocolError(errors.PROTOCOL, str(exc),
                                             received=exc.data,
                                             agent=self.name) from exc
                rid = reply["id"]
                if rid is None:
                    # §2.2/§3.2: a reply with id null answers a request the
                    # agent could not parse; it closes after BAD_FRAME.
                    err = reply.get("error", {})
                    raise AgentReplyError(err.get("code", errors.PROTOCOL),
                                          err.get("message", ""),
                                          received=reply, agent=self.name)
                entry = self._pending.pop(rid, None)
                if entry is None:
                    # The reply to a request whose caller gave up (timeout).
                    log.debug("agent=%s late reply id=%r dropped", self.name, rid)
                    continue
                if not entry[1].done():
                    entry[1].set_result(reply)
        except asyncio.CancelledError:
            raise
        except AgentError as exc:
            self._drop(exc)
        except (OSError, ssl.SSLError, asyncio.IncompleteReadError) as exc:
            self._drop(AgentClosed(errors.CLOSED, f"connection lost: {exc}",
                                   agent=self.name))

    def _drop(self, exc: AgentError) -> None:
        if self._writer is not None:
            self._writer.close()
        self._writer = self._reader = None
        self._reader_task = None
        self._fail_all(exc)

    # -- calls ------------------------------------------------------------
    async def call(self, cmd: str, args: dict[str, Any] | None = None, *,
                   timeout: float | None = None,
                   retry_closed: bool = False) -> dict[str, Any]:
        """Send one request and return its `result`; raise AgentError else.

        `timeout` bounds connect + send + reply (all attempts).  On timeout
        the request may still be executed by the agent; callers that care
        (the coordinator) follow up with an idempotent abort.

        `retry_closed`: if the connection is lost with the request in flight,
        send it once more on a new connection within the same deadline.  Only
        for commands that are safe to repeat (agent-protocol §4: prepare,
        commit and abort are idempotent by txn; reads are).
        """
        deadline = self.call_timeout if timeout is None else timeout
        t0 = time.monotonic()
        attempts = 2 if retry_closed else 1
        try:
            for attempt in range(attempts):
                request: dict[str, Any] = {"id": next(self._ids), "cmd": cmd,
                                           "args": args or {}}
                remaining = deadline - (time.monotonic() - t0)
                try:
                    if remaining <= 0:
                        raise TimeoutError
                    return await asyncio.wait_for(self._call(request), remaining)
                except TimeoutError:
                    self._pending.pop(request["id"], None)
                    raise AgentTimeout(
                        errors.TIMEOUT,
                        f"{cmd}: no reply within {deadline * 1000:.0f} ms",
                        request, None, agent=self.name) from None
                except AgentClosed:
                    if attempt + 1 >= attempts:
                        raise
                    log.info("event=agent_retry agent=%s cmd=%s why=connection_lost",
                             self.name, cmd)
            raise AssertionError("unreachable")
        finally:
            log.debug("agent=%s cmd=%s ms=%.2f", self.name, cmd,
                      (time.monotonic() - t0) * 1000)

    async def _call(self, request: dict[str, Any]) -> dict[str, Any]:
        frame = encode_frame(request)
        await self.connect()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[dict[str, Any]] = loop.create_future()
        self._pending[request["id"]] = (request, fut)
        writer = self._writer
        if writer is None:
            self._pending.pop(request["id"], None)
            raise AgentClosed(errors.CLOSED, "connection lost before send",
                              request, agent=self.name)
        try:
            async with self._write_lock:
                writer.write(frame)
                await writer.drain()
        except (OSError, ssl.SSLError) as exc:
            self._pending.pop(request["id"], None)
            raise AgentClosed(errors.CLOSED, f"send failed: {exc}", request,
                              agent=self.name) from exc
        try:
            reply = await fut
        except asyncio.CancelledError:
            self._pending.pop(request["id"], None)
            raise
        if reply["ok"]:
            result: dict[str, Any] = reply["result"]
            return result
        err = reply["error"]
        raise AgentReplyError(err["code"], err.get("message", ""), request,
                              reply, agent=self.name)

    # -- commands of agent-protocol §4 -----------------------------------
    async def hello(self) -> dict[str, Any]:
        return await self.call("hello", retry_closed=True)

    async def inventory(self, *, timeout: float | None = None) -> dict[str, Any]:
        return await self.call("inventory", timeout=timeout, retry_closed=True)

    async def prepare(self, txn: str, vms: list[str], lease_ms: int, *,
                      quiesce: str | None = None,
                      freeze_timeout_ms: int | None = None,
                      timeout: float | None = None) -> dict[str, Any]:
        """agent-protocol §4.3.  `quiesce` "crash" or "fs-freeze"; None sends
        nothing (the agent's default, crash), so older agents still accept
        crash-consistent requests.  With "fs-freeze" the reply may take the
        freeze deadlines (sync 1 s + the freeze timeout): size `timeout` for
        it.  `freeze_timeout_ms` (sent with fs-freeze only) caps the agent's
        `[agent] freeze_timeout_ms`: the agent uses the smaller of the two,
        so a `timeout` sized on it is always long enough."""
        args: dict[str, Any] = {"txn": txn, "vms": list(vms), "lease_ms": int(lease_ms)}
        if quiesce is not None and quiesce != "crash":
            args["quiesce"] = quiesce
            if freeze_timeout_ms is not None:
                args["freeze_timeout_ms"] = int(freeze_timeout_ms)
        return await self.call("prepare", args, timeout=timeout, retry_closed=True)

    async def commit(self, txn: str, snapshots: dict[str, str], budget_ms: int, *,
                     timeout: float | None = None) -> dict[str, Any]:
        return await self.call("commit", {"txn": txn, "snapshots": dict(snapshots),
                                          "budget_ms": int(budget_ms)},
                               timeout=timeout, retry_closed=True)

    async def abort(self, txn: str, snapshots: dict[str, str] | None = None, *,
                    timeout: float | None = None) -> dict[str, Any]:
        args: dict[str, Any] = {"txn": txn}
        if snapshots:
            args["snapshots"] = dict(snapshots)
        return await self.call("abort", args, timeout=timeout, retry_closed=True)

    async def resume(self, vms: list[str]) -> dict[str, Any]:
        return await self.call("resume", {"vms": list(vms)})

    async def snapshot_list(self, disk: str) -> list[str]:
        res = await self.call("snapshot.list", {"disk": disk}, retry_closed=True)
        return [s["name"] for s in res.get("snapshots", [])]

    async def snapshot_delete(self, disk: str, name: str) -> bool:
        res = await self.call("snapshot.delete", {"disk": disk, "name": name},
                              retry_closed=True)
        return bool(res.get("deleted"))

    async def stats(self) -> dict[str, Any]:
        return await self.call("stats", retry_closed=True)

    async def guest_ping(self, vm: str, *, timeout_ms: int = 5000) -> dict[str, Any]:
        """qemu-guest-agent guest-ping in the VM (agent-protocol §4.12)."""
        return await self.call("vm.guest_ping", {"vm": vm, "timeout_ms": timeout_ms},
                               timeout=timeout_ms / 1000 + 10)

    async def guest_exec(self, vm: str, path: str, args: list[str] | None = None, *,
                         input: str | None = None, timeout_ms: int = 30000) -> dict[str, Any]:
        """A program run in the VM through its guest agent, waited for:
        {exitcode, signal, stdout, stderr, *_truncated, pid, exec_ms}
        (agent-protocol §4.12); GUEST_TIMEOUT when it runs past timeout_ms."""
        a: dict[str, Any] = {"vm": vm, "path": path, "timeout_ms": timeout_ms}
        if args is not None:
            a["args"] = list(args)
        if input is not None:
            a["input"] = input
        return await self.call("vm.guest_exec", a, timeout=timeout_ms / 1000 + 10)


class AgentPool:
    """Open connections to agents, keyed by (address, port), reused across
    group snapshots (DESIGN.md: keep connections to agents open)."""

    def __init__(self, ssl_context: ssl.SSLContext, *,
                 connect_timeout: float = 5.0, call_timeout: float = 30.0) -> None:
        self.ssl_context = ssl_context
        self.connect_timeout = connect_timeout
        self.call_timeout = call_timeout
        self._clients: dict[tuple[str, int], AgentClient] = {}

    def get(self, address: str, port: int = DEFAULT_PORT, *,
            name: str | None = None, server_name: str | None = None,
            cert_sha256: str | None = None) -> AgentClient:
        key = (address, port)
        client = self._clients.get(key)
        if client is None:
            client = AgentClient(address, port, ssl_context=self.ssl_context,
                                 server_name=server_name,
                                 connect_timeout=self.connect_timeout,
                                 call_timeout=self.call_timeout, name=name,
                                 cert_sha256=cert_sha256)
            self._clients[key] = client
        return client

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            await c.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
