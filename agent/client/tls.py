"""TLS contexts for the agent protocol: TLS 1.3 only, mutual auth (§1)."""

from __future__ import annotations

import ssl
from pathlib import Path


def client_context(ca: str | Path, cert: str | Path, key: str | Path) -> ssl.SSLContext:
    """A client context that presents `cert` and trusts only `ca`.

    Hostname checking stays on: agents carry their host addresses as IP SANs
    (agent-protocol §1.2), so connecting by address verifies the address.
    """
    for label, path in (("CA", ca), ("certificate", cert), ("key", key)):
        if not Path(path).is_file():
            raise FileNotFoundError(f"TLS {label} file not found: {path}")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_verify_locations(cafile=str(ca))
    ctx.load_cert_chain(certfile=str(cert), keyfile=str(key))
    return ctx


def server_context(ca: str | Path, cert: str | Path, key: str | Path) -> ssl.SSLContext:
    """The agent side of §1 (used by in-process test peers)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(cafile=str(ca))
    ctx.load_cert_chain(certfile=str(cert), keyfile=str(key))
    return ctx
