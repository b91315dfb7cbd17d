"""Calls to one agent from the control plane (inventory, snapshot.delete).

Each call opens one mutually authenticated TLS connection
(docs/agent-protocol.md §1) and, when the host has a pinned certificate
fingerprint, checks it before sending anything.
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


async def _calls(host: Host, settings: Settings,
                 calls: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    from cutpoint.agentclient import AgentClient, AgentError
    from cutpoint.agentclient.errors import CERT_MISMATCH

    client = AgentClient(host.address, host.port, ssl_context=_context(settings),
                         name=host.name, connect_timeout=settings.agent_timeout_s,
                         call_timeout=settings.agent_timeout_s,
                         cert_sha256=host.cert_fingerprint)
    out = []
    try:
        await client.connect()
        for cmd, args in calls:
            out.append(await client.call(cmd, args))
    except AgentError as exc:
        code = "fingerprint_mismatch" if exc.code == CERT_MISMATCH else exc.code
        raise AgentCallError(host.name, code, exc.message, exc.sent, exc.received) from exc
    finally:
        await client.close()
    return out


def call(host: Host, settings: Settings, *calls: tuple[str, dict[str, Any]]) \
        -> list[dict[str, Any]]:
    return asyncio.run(_calls(host, settings, list(calls)))
