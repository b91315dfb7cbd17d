"""`cutpoint host revoke`: the serial of the host's certificate goes on the
CA directory's deny-list, once, in the form cutpointd reads (the agent side
is agent/tests/test_agent_authz.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from cutpoint.api.cli.main import app
from cutpoint.api.cli.revoke import RevokeError, cert_serial, listed, revoke
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def ca(tmp_path: Path) -> Path:
    script = str(ROOT / "scripts" / "make-lab-ca.sh")
    subprocess.run([script, str(tmp_path)], check=True)
    for name, role in (("hv1", "agent"), ("hv2", "agent")):
        subprocess.run([script, str(tmp_path), "issue", name, role, "10.0.0.1"], check=True)
    return tmp_path


def test_revoke_lists_the_serial_once(ca: Path) -> None:
    serial = cert_serial(ca / "hv1.pem")
    openssl = subprocess.run(["openssl", "x509", "-in", str(ca / "hv1.pem"), "-noout",
                              "-serial"], capture_output=True, text=True, check=True).stdout
    assert openssl.strip().split("=")[1].lstrip("0") == serial
    assert revoke(ca, "hv1") == (serial, True)
    assert revoke(ca, "hv1") == (serial, False)
    lines = (ca / "revoked").read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"serial={serial} name=hv1 at=")
    assert listed(ca / "revoked") == {serial}
    assert cert_serial(ca / "hv2.pem") not in listed(ca / "revoked")


def test_cli_and_errors(ca: Path) -> None:
    r = CliRunner().invoke(app, ["host", "revoke", "hv2", "--ca-dir", str(ca)])
    assert r.exit_code == 0, r.output
    assert f"serial {cert_serial(ca / 'hv2.pem')} revoked" in r.output
    r = CliRunner().invoke(app, ["host", "revoke", "hv9", "--ca-dir", str(ca)])
    assert r.exit_code == 1 and "no such certificate" in " ".join(r.output.split())
    with pytest.raises(RevokeError, match="bad host name"):
        revoke(ca, "../hv1")
    (ca / "junk.pem").write_text("not a certificate\n")
    with pytest.raises(RevokeError, match="not a PEM certificate"):
        revoke(ca, "junk")
    assert len(listed(ca / "revoked")) == 1
