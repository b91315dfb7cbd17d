#!/usr/bin/python
"""Send the agent protocol's `hello` over mutual TLS and return its result.

Frame: 4-byte big-endian length, then UTF-8 JSON (docs/agent-protocol.md
section 2).  TLS 1.3 only, client certificate required (section 1).  Read-only:
never reports a change.
"""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: cutpoint_agent_hello
short_description: Health check of a cutpointd agent through its hello command
description:
  - Connects with mutual TLS 1.3, sends C(hello), checks the reply. Never changes anything.
options:
  host: {description: Agent address., type: str, required: true}
  port: {description: Agent port., type: int, default: 7443}
  ca: {description: CA certificate file that the agent's certificate must chain to., type: path, required: true}
  cert: {description: Client certificate file., type: path, required: true}
  key: {description: Client key file., type: path, required: true}
  expect_host: {description: Fail unless hello reports this host name., type: str}
  timeout: {description: Seconds for connect and reply., type: float, default: 10}
author: cutpoint
"""

RETURN = r"""
hello: {description: The result object of the hello reply., type: dict, returned: success}
peer_fingerprint: {description: SHA-256 of the agent's certificate (DER)., type: str, returned: success}
"""

import hashlib
import json
import socket
import ssl
import struct

from ansible.module_utils.basic import AnsibleModule


def _recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


def hello(host, port, ca, cert, key, timeout):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_verify_locations(ca)
    ctx.load_cert_chain(cert, key)
    ctx.check_hostname = False  # the agent is named by its IP SAN or by CN; CA trust is the check
    req = {"id": 1, "cmd": "hello", "args": {}}
    with socket.create_connection((host, port), timeout=timeout) as raw, \
            ctx.wrap_socket(raw) as tls:
        body = json.dumps(req).encode()
        tls.sendall(struct.pack(">I", len(body)) + body)
        (n,) = struct.unpack(">I", _recv_exact(tls, 4))
        if n > 1048576:
            raise ValueError(f"reply frame of {n} bytes exceeds 1 MiB")
        reply = json.loads(_recv_exact(tls, n))
        der = tls.getpeercert(binary_form=True)
    return req, reply, hashlib.sha256(der).hexdigest()


def main():
    module = AnsibleModule(
        argument_spec={
            "host": {"type": "str", "required": True},
            "port": {"type": "int", "default": 7443},
            "ca": {"type": "path", "required": True},
            "cert": {"type": "path", "required": True},
            "key": {"type": "path", "required": True},
            "expect_host": {"type": "str"},
            "timeout": {"type": "float", "default": 10.0},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        sent, reply, fp = hello(p["host"], p["port"], p["ca"], p["cert"], p["key"], p["timeout"])
    except (OSError, ssl.SSLError, ValueError, ConnectionError) as exc:
        module.fail_json(msg=f"hello to {p['host']}:{p['port']} failed: {exc}")
    if not reply.get("ok"):
        module.fail_json(msg=f"hello refused: sent {sent}, received {reply}")
    result = reply.get("result") or {}
    if p["expect_host"] and result.get("host") != p["expect_host"]:
        module.fail_json(msg=f"agent at {p['host']} reports host {result.get('host')!r}, "
                             f"expected {p['expect_host']!r}", hello=result)
    module.exit_json(changed=False, hello=result, peer_fingerprint=fp)


if __name__ == "__main__":
    main()
