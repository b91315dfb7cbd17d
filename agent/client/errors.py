"""Typed errors of the agent client.

Every error carries what was sent and what was received, so a failure in a group snapshot can be reported with the exact
request and reply that caused it.
"""

from __future__ import annotations

from typing import Any

# Error codes of agent-protocol §3.5, as sent by the agent.
PROTOCOL_CODES = frozenset({
    "BAD_FRAME", "BAD_REQUEST", "UNKNOWN_COMMAND", "UNKNOWN_VM",
    "UNKNOWN_DISK", "UNKNOWN_TXN", "BUSY", "QMP_ERROR", "QMP_TIMEOUT",
    "SNAPSHOT_FAILED", "EXPIRED", "BUDGET_EXCEEDED", "ABORTED", "INTERNAL",
    "FORBIDDEN", "NOT_OWNED", "GUEST_ERROR", "GUEST_TIMEOUT",
})

# Codes made up on the client side; they never come from an agent.
CONNECT = "CONNECT"        # TCP connect or TLS handshake failed
CERT_MISMATCH = "CERT_MISMATCH"  # agent certificate is not the pinned one
TIMEOUT = "TIMEOUT"        # no reply within the call deadline
CLOSED = "CLOSED"          # connection closed with the request in flight
PROTOCOL = "PROTOCOL"      # the agent sent something §2/§3 does not allow


class AgentError(Exception):
    """A failed agent call.

    code: an agent-protocol §3.5 code, or one of the client codes above.
    sent: the request object (or None when nothing was sent yet).
    received: the reply object, the raw bytes of an invalid frame, or None.
    """

    def __init__(self, code: str, message: str, sent: Any = None,
                 received: Any = None, *, agent: str = "") -> None:
        self.code = code
        self.message = message
        self.sent = sent
        self.received = received
        self.agent = agent
        where = f" [{agent}]" if agent else ""
        super().__init__(f"{code}{where}: {message}")

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message,
                "agent": self.agent, "sent": self.sent,
                "received": _jsonable(self.received)}


class AgentReplyError(AgentError):
    """The agent answered `ok: false` (agent-protocol §3.4).

    `result` holds the partial facts an error reply may carry (§3.4), e.g.
    the timings of a failed commit.
    """

    @property
    def result(self) -> dict[str, Any]:
        if isinstance(self.received, dict):
            res = self.received.get("result")
            if isinstance(res, dict):
                return res
        return {}


class AgentConnectError(AgentError):
    """TCP connect or the TLS 1.3 handshake failed (agent-protocol §1)."""


class AgentTimeout(AgentError):
    """No reply within the deadline; the request may still run remotely."""


class AgentClosed(AgentError):
    """The connection closed while the request was in flight."""


class AgentProtocolError(AgentError):
    """The agent sent a frame or reply that the protocol forbids."""


class FrameError(ValueError):
    """A frame violates agent-protocol §2; `data` holds the offending bytes."""

    def __init__(self, message: str, data: bytes = b"") -> None:
        self.data = data
        super().__init__(message)


def _jsonable(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value[:256]).hex()
    return value
