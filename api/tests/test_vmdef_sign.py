"""vmdef_sign: the signed bytes are the agent's (context NUL name NUL
XML), the signature verifies with the public half and not for another
name, and a key that is missing, unreadable or not Ed25519 is refused
naming the path only.  (That the agent accepts it: agent/tests/
test_agent_vmdef_lab.py.)"""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cutpoint.api.services import vmdef_sign


def _pem(key: object) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM,  # type: ignore[attr-defined]
                             serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def test_sign_and_verify(tmp_path: Path) -> None:
    key = Ed25519PrivateKey.generate()
    (tmp_path / "k.pem").write_bytes(_pem(key))
    loaded = vmdef_sign.load_key(tmp_path / "k.pem")
    xml = "<domain type='qemu'><name>db1</name></domain>\n"
    assert vmdef_sign.message("db1", xml) == b"cutpoint-vm-definition/1\0db1\0" + xml.encode()
    spec = vmdef_sign.spec(loaded, "db1", xml)
    assert spec["vm"] == "db1" and spec["xml"] == xml and len(spec["sig"]) == 88
    sig = base64.b64decode(spec["sig"])
    key.public_key().verify(sig, vmdef_sign.message("db1", xml))
    with pytest.raises(InvalidSignature):
        key.public_key().verify(sig, vmdef_sign.message("db2", xml))
    assert vmdef_sign.public_pem(loaded).startswith(b"-----BEGIN PUBLIC KEY-----")
    with pytest.raises(ValueError):
        vmdef_sign.message("a\0b", xml)


def test_bad_keys(tmp_path: Path) -> None:
    with pytest.raises(vmdef_sign.SigningKeyError, match="no definition_signing_key"):
        vmdef_sign.load_key(None)
    with pytest.raises(vmdef_sign.SigningKeyError, match="FileNotFoundError"):
        vmdef_sign.load_key(tmp_path / "missing.pem")
    (tmp_path / "ec.pem").write_bytes(_pem(ec.generate_private_key(ec.SECP256R1())))
    with pytest.raises(vmdef_sign.SigningKeyError, match="not an Ed25519 key"):
        vmdef_sign.load_key(tmp_path / "ec.pem")
    (tmp_path / "junk.pem").write_text("-----BEGIN PRIVATE KEY-----\nAAAA\n")
    with pytest.raises(vmdef_sign.SigningKeyError) as exc:
        vmdef_sign.load_key(tmp_path / "junk.pem")
    assert "AAAA" not in str(exc.value)
