"""The control plane's signature of a VM definition it sends to an agent.

An agent defines a libvirt domain from the wire only when it is signed by
the key its config names ([libvirt] definition_key, agent-protocol 4.9):
a domain XML can name any disk, device or emulator of the host.  The
control plane holds the private half (setting `definition_signing_key`,
a PEM file read when signing, never logged or stored) and signs, with
Ed25519, exactly the bytes the agent verifies:

    b"cutpoint-vm-definition/1" NUL <vm name> NUL <the XML, UTF-8>

The name is in the message, so the signature of VM a's XML does not start
VM b.  `spec` is the `vm.start` spec that carries it.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

CONTEXT = b"cutpoint-vm-definition/1"


class SigningKeyError(RuntimeError):
    """The signing key is not set, unreadable, or not Ed25519 (the path only
    is named)."""


def message(vm: str, xml: str) -> bytes:
    if "\0" in vm:
        raise ValueError("a VM name has no NUL")
    return CONTEXT + b"\0" + vm.encode() + b"\0" + xml.encode()


def load_key(path: Path | None) -> Ed25519PrivateKey:
    if path is None:
        raise SigningKeyError("no definition_signing_key is configured")
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise SigningKeyError(f"definition_signing_key {path}: "
                              f"{type(exc).__name__}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningKeyError(f"definition_signing_key {path}: not an Ed25519 key")
    return key


def sign(key: Ed25519PrivateKey, vm: str, xml: str) -> str:
    """base64 of the 64-byte signature of `vm`'s `xml`."""
    return base64.b64encode(key.sign(message(vm, xml))).decode()


def spec(key: Ed25519PrivateKey, vm: str, xml: str) -> dict[str, Any]:
    """The `vm.start` spec of a signed definition."""
    return {"vm": vm, "xml": xml, "sig": sign(key, vm, xml)}


def public_pem(key: Ed25519PrivateKey) -> bytes:
    """The public half, as the agent's definition_key file holds it."""
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo)
