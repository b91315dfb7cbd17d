"""Record reply frames from the real cutpointd into frames/agent-replies.json.

    .venv/bin/python agent/client/tests/record_frames.py

The file holds each request and the raw reply frame (hex) exactly as the
agent sent it; test_agentclient_real.py replays them through the decoder.
"""

from __future__ import annotations

import json
import socket
import ssl
import struct
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import realagent
from cutpoint.agentclient.testing import PKI_ROLES, make_pki
from cutpoint.agentclient.tls import client_context

REQUESTS = [
    {"id": 1, "cmd": "hello", "args": {}},
    {"id": 2, "cmd": "inventory", "args": {}},
    {"id": 3, "cmd": "no.such", "args": {}},
    {"id": 4, "cmd": "prepare", "args": {"txn": "t1", "vms": ["nope"], "lease_ms": 1000}},
    {"id": 5, "cmd": "prepare", "args": {"txn": "t1", "vms": "nope", "lease_ms": 1000}},
    {"id": 6, "cmd": "commit", "args": {"txn": "t9", "snapshots": {}, "budget_ms": 1000}},
    {"id": "s7", "cmd": "abort", "args": {"txn": "t9"}},
    {"id": 8, "cmd": "stats"},
]


def read_raw(tls: ssl.SSLSocket) -> bytes:
    def exact(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = tls.recv(n - len(buf))
            if not chunk:
                raise EOFError
            buf += chunk
        return buf
    head = exact(4)
    return head + exact(struct.unpack(">I", head)[0])


def main() -> None:
    with tempfile.TemporaryDirectory() as td:
        d = Path(td)
        pki = make_pki(d / "pki", {"agent": ["127.0.0.1"], "coordinator": []}, roles=PKI_ROLES)
        agent = realagent.start(d, pki)
        try:
            ctx = client_context(pki["ca"]["cert"], pki["coordinator"]["cert"],
                                 pki["coordinator"]["key"])
            out = []
            with socket.create_connection(("127.0.0.1", agent.port)) as raw, \
                    ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                for req in REQUESTS:
                    body = json.dumps(req, separators=(",", ":")).encode()
                    tls.sendall(struct.pack(">I", len(body)) + body)
                    out.append({"request": req, "reply_hex": read_raw(tls).hex()})
                # §2.2: an oversized length gets BAD_FRAME (id null), then close.
                tls.sendall(struct.pack(">I", 1048577))
                out.append({"request_hex": struct.pack(">I", 1048577).hex(),
                            "reply_hex": read_raw(tls).hex()})
            version = json.loads(bytes.fromhex(out[0]["reply_hex"])[4:])["result"]["version"]
        finally:
            agent.stop()
    dest = Path(__file__).parent / "frames" / "agent-replies.json"
    dest.write_text(json.dumps({"agent_version": version, "frames": out}, indent=1) + "\n")
    print(f"recorded {len(out)} frames from cutpointd {version} into {dest}")


if __name__ == "__main__":
    main()
