"""cutpoint.agentclient: the async Python client of the agent protocol.

The protocol is specified in docs/agent-protocol.md; section numbers cited
in this package refer to it.
"""

from cutpoint.agentclient.client import DEFAULT_PORT, AgentClient, AgentPool
from cutpoint.agentclient.errors import (
    AgentClosed,
    AgentConnectError,
    AgentError,
    AgentProtocolError,
    AgentReplyError,
    AgentTimeout,
    FrameError,
)
from cutpoint.agentclient.framing import (
    MAX_FRAME,
    FrameDecoder,
    decode_body,
    encode_frame,
)
from cutpoint.agentclient.tls import client_context

__all__ = [
    "DEFAULT_PORT", "MAX_FRAME", "AgentClient", "AgentClosed", "AgentConnectError",
    "AgentError", "AgentPool", "AgentProtocolError", "AgentReplyError",
    "AgentTimeout", "FrameDecoder", "FrameError", "client_context",
    "decode_body", "encode_frame",
]
