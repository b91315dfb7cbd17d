"""`cutpoint host revoke NAME`: add a host's certificate serial to the
deployment's deny-list.

The deny-list is the file `revoked` in the CA directory (the one Ansible's
cutpoint_ca role keeps, default ~/.cutpoint/ca): one line per certificate,
`serial=HEX name=NAME at=TIME`, the form cutpointd reads from `[tls]
revoked` (agent-protocol §1.6).  This command only writes that file; the
cutpoint_host role copies it to every host and reloads the agents (SIGHUP),
and until then the agents still accept the certificate.
"""

from __future__ import annotations

import datetime
import os
import re
import subprocess
from pathlib import Path

DEFAULT_CA_DIR = Path.home() / ".cutpoint" / "ca"
NAME = re.compile(r"^[A-Za-z0-9._-]+$")


class RevokeError(Exception):
    """The certificate cannot be found or read; nothing was written."""


def cert_serial(pem: Path) -> str:
    """The serial of a PEM certificate, upper-case hex without leading zeros."""
    r = subprocess.run(["openssl", "x509", "-in", str(pem), "-noout", "-serial"],
                       capture_output=True, text=True, check=False)
    if r.returncode != 0 or not r.stdout.startswith("serial="):
        raise RevokeError(f"{pem}: not a PEM certificate: {r.stderr.strip()}")
    return r.stdout.strip().split("=", 1)[1].upper().lstrip("0") or "0"


def listed(deny_list: Path) -> set[str]:
    if not deny_list.exists():
        return set()
    out = set()
    for line in deny_list.read_text().splitlines():
        tok = line.strip().split()[0] if line.strip() else ""
        if tok and not tok.startswith("#"):
            out.add(tok.removeprefix("serial=").upper().lstrip("0") or "0")
    return out


def revoke(ca_dir: Path, name: str, cert: Path | None = None) -> tuple[str, bool]:
    """Lists the serial of ca_dir/NAME.pem (or of cert); returns (serial,
    added), added False when it was listed already."""
    if not NAME.match(name):
        raise RevokeError(f"bad host name {name!r}")
    pem = cert or ca_dir / f"{name}.pem"
    if not pem.is_file():
        raise RevokeError(f"{pem}: no such certificate (pass --cert)")
    serial = cert_serial(pem)
    deny_list = ca_dir / "revoked"
    if serial in listed(deny_list):
        return serial, False
    at = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    line = f"serial={serial} name={name} at={at}\n"
    # Append and fsync: the list only grows, and a crash mid-write leaves at
    # worst a torn last line, which the agent refuses to load (it keeps its
    # previous list) rather than silently dropping a revocation.
    fd = os.open(deny_list, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return serial, True
