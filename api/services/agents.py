"""Calls to one agent from the control plane: inventory, retention's
snapshot.delete, the orphan sweeper's snapshot.list and snapshot.delete,
failover's fence (vm.stop) and boot (vm.start).

Every connection is mutually authenticated TLS (docs/agent-protocol.md §1)
*and* pinned: `pinned_client` checks the host's registered certificate
fingerprint before anything is sent, so a certificate of another host,
signed by the same CA, is refused.  A host without a pin (a row registered
before pins were required) is not called at all: set its pin first
(PATCH /v1/hosts/{id} cert_fingerprint).
"""

from __future__ import annotations

import asyncio
from typing import Any

from cutpoint.api.config import Settings
from cutpoint.api.models import Host


class AgentCallError(RuntimeError):
    def __init__(self, host: str, code: str, message: str, sent: Any = None,
                 received: Any = None) -> None:
        self.host, self.code, self.sent, self.received = host, code, sent, received
        super().__init__(f"{host}: {code}: {message}")


def _context(settings: Settings) -> Any:
    from cutpoint.agentclient import client_context

    if not (settings.agent_ca and settings.agent_cert and settings.agent_key):
        raise AgentCallError("-", "agent_tls_unset",
                             "CUTPOINT_AGENT_CA/CERT/KEY are not configured")
    return client_context(settings.agent_ca, settings.agent_cert, settings.agent_key)


def pinned_client(host: Host, settings: Settings, *, timeout_s: float | None = None,
                  connect_timeout_s: float | None = None) -> Any:
    """An (unconnected) AgentClient of `host`'s agent, pinned to its
    registered certificate; AgentCallError `unpinned` when it has none.
    `connect_timeout_s` (at most the agent timeout) bounds the connect alone,
    for callers that must not wait long on a host that is gone."""
    from cutpoint.agentclient import AgentClient

    if not host.cert_fingerprint:
        raise AgentCallError(host.name, "unpinned",
                             "the host has no certificate pin, so its agent is not called; "
                             "set cert_fingerprint (PATCH /v1/hosts/{id})")
    connect = settings.agent_timeout_s if connect_timeout_s is None \
        else min(connect_timeout_s, settings.agent_timeout_s)
    return AgentClient(host.address, host.port, ssl_context=_context(settings),
                       name=host.name, connect_timeout=connect,
                       call_timeout=timeout_s or settings.agent_timeout_s,
                       cert_sha256=host.cert_fingerprint)


def _error(host: Host, exc: Exception) -> AgentCallError:
    from cutpoint.agentclient import AgentError
    from cutpoint.agentclient.errors import CERT_MISMATCH

    if isinstance(exc, AgentCallError):
        return exc
    if isinstance(exc, AgentError):
        code = "fingerprint_mismatch" if exc.code == CERT_MISMATCH else exc.code
        return AgentCallError(host.name, code, exc.message, exc.sent, exc.received)
    return AgentCallError(host.name, "INTERNAL", f"{type(exc).__name__}: {exc}")


async def _calls(host: Host, settings: Settings, calls: list[tuple[str, dict[str, Any]]],
                 *, parallel: bool = False, timeout_s: float | None = None,
                 connect_timeout_s: float | None = None,
                 peer: dict[str, Any] | None = None) \
        -> list[dict[str, Any] | AgentCallError]:
    """One connection; `parallel`: all calls at once, each with its own
    outcome; otherwise in order, stopping at the first error (raised).
    `peer` gets `not_after`, the agent certificate's expiry (Unix seconds)."""
    from cutpoint.agentclient import AgentError

    client = pinned_client(host, settings, timeout_s=timeout_s,
                           connect_timeout_s=connect_timeout_s)
    out: list[dict[str, Any] | AgentCallError] = []
    try:
        await client.connect()
        if peer is not None:
            peer["not_after"] = client.peer_not_after
        if parallel:
            res = await asyncio.gather(*(client.call(c, a) for c, a in calls),
                                       return_exceptions=True)
            for r in res:
                if isinstance(r, BaseException) and not isinstance(r, Exception):
                    raise r
                out.append(_error(host, r) if isinstance(r, Exception) else r)
        else:
            for cmd, args in calls:
                out.append(await client.call(cmd, args))
    except AgentError as exc:
        raise _error(host, exc) from exc
    finally:
        await client.close()
    return out


def call(host: Host, settings: Settings, *calls: tuple[str, dict[str, Any]],
         peer: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The replies of `calls`, sent in order over one pinned connection;
    AgentCallError at the first failure.  `peer`: see `_calls`."""
    return [r for r in asyncio.run(_calls(host, settings, list(calls), peer=peer))
            if isinstance(r, dict)]


async def call_async(host: Host, settings: Settings, calls: list[tuple[str, dict[str, Any]]],
                     *, connect_timeout_s: float | None = None,
                     timeout_s: float | None = None) -> list[dict[str, Any]]:
    """`call` for an event loop of the caller's (several hosts at once), with
    its own connect (and, if given, per-call) deadline."""
    return [r for r in await _calls(host, settings, calls, connect_timeout_s=connect_timeout_s,
                                    timeout_s=timeout_s)
            if isinstance(r, dict)]


def call_each(host: Host, settings: Settings, calls: list[tuple[str, dict[str, Any]]]) \
        -> list[dict[str, Any] | AgentCallError]:
    """Each call's own outcome, sent at once over one pinned connection (a
    failed call does not stop the others); AgentCallError raised only when
    the agent cannot be reached at all."""
    return asyncio.run(_calls(host, settings, calls, parallel=True))


def start_vms(host: Host, settings: Settings, names: list[str], timeout_s: float) \
        -> tuple[dict[str, dict[str, Any]], list[str]]:
    """`vm.start` of each VM on `host`'s agent, in parallel over one pinned
    connection: ({vm: reply}, [error]).  The shape of the coordinator's
    failover boot step (coordinator/failover.py `_start_via_agent`)."""
    try:
        replies = asyncio.run(_calls(host, settings,
                                     [("vm.start", {"spec": {"vm": n}}) for n in names],
                                     parallel=True, timeout_s=timeout_s))
    except AgentCallError as exc:
        return {}, [f"{n}: vm.start {exc}" for n in names]
    started: dict[str, dict[str, Any]] = {}
    errors = []
    for name, r in zip(names, replies, strict=True):
        if isinstance(r, AgentCallError):
            errors.append(f"{name}: vm.start {r}")
        else:
            started[name] = r
    return started, errors
