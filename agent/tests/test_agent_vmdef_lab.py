"""vm.start of a signed definition, and vm.definition, on a real libvirtd.

A libvirtd of its own (libvirt_hosts.LibvirtHost: a private mount
namespace, no other libvirtd touched) and a cutpointd with `[libvirt]
definition_key` naming the public half of an Ed25519 key made here, the
private half signing as the control plane does (api/services/vmdef_sign.py:
the bytes the agent's defsig.c verifies, made by another implementation).
A domain the agent's config does not name (a small TCG domain):

- sent unsigned, signed by another key, or signed for another VM name:
  FORBIDDEN, and libvirt has no such domain afterwards;
- sent signed: libvirt defines and starts it (virsh domstate: running),
  and discovery lists it in the agent's inventory;
- vm.definition then gives its inactive XML (no live `id=`), whose sha256
  is the one the agent reports.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cutpoint.agentclient import AgentError
from cutpoint.api.services import vmdef_sign
from libvirt_agent import LibvirtAgent, domain_xml, until
from libvirt_hosts import LibvirtHost

pytestmark = pytest.mark.lab

DOMAIN = "cp-vmdef-signed"


@pytest.fixture
def signed_agent(tmp_path: Path) -> Iterator[tuple[LibvirtAgent, LibvirtHost,
                                                   Ed25519PrivateKey]]:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    key = Ed25519PrivateKey.generate()
    pub = tmp_path / "definition-signing.pub"
    pub.write_bytes(vmdef_sign.public_pem(key))
    host = LibvirtHost(Path(tempfile.mkdtemp(prefix="cp-vmdef-lv-")))
    host.start()
    agent = None
    try:
        agent = LibvirtAgent(tmp_path, discover=True, uri=host.uri,
                             extra=f"definition_key = {pub}\n")
        agent.start()
        yield agent, host, key
    finally:
        sanitizer = agent.stop() if agent else ""
        host.stop()
        assert not sanitizer, sanitizer


async def test_signed_definition_starts_unsigned_and_forged_are_refused(
        signed_agent: tuple[LibvirtAgent, LibvirtHost, Ed25519PrivateKey]) -> None:
    agent, host, key = signed_agent
    xml = domain_xml(DOMAIN)
    forged = vmdef_sign.spec(Ed25519PrivateKey.generate(), DOMAIN, xml)
    other_name = {**vmdef_sign.spec(key, "cp-other", xml), "vm": DOMAIN}
    async with agent.client() as c:
        for spec, why in (({"vm": DOMAIN, "xml": xml}, "signature (args.spec.sig)"),
                          (forged, "does not verify"), (other_name, "does not verify")):
            with pytest.raises(AgentError) as exc:
                await c.call("vm.start", {"spec": spec}, timeout=30)
            assert exc.value.code == "FORBIDDEN", exc.value
            assert why in exc.value.message, exc.value.message
            assert host.virsh("domstate", DOMAIN, check=False) is None  # never defined
        r = await c.call("vm.start", {"spec": vmdef_sign.spec(key, DOMAIN, xml)}, timeout=90)
        print(f"\nsigned vm.start: {r}")
        assert r["state"] == "running" and r["definition"] == "signed"
        assert not r["already_running"]
        assert (host.virsh("domstate", DOMAIN) or "").strip() == "running"

        async def listed() -> bool:
            inv = await c.inventory()
            return any(v["name"] == DOMAIN and v["state"] == "running" for v in inv["vms"])

        took = await until(listed, "the signed domain in the inventory", 10)
        print(f"listed by discovery after {took:.2f} s")
        d = await c.call("vm.definition", {"vm": DOMAIN}, timeout=30)
        assert d["format"] == "libvirt-domain-xml" and d["driver"] == "libvirt"
        assert f"<name>{DOMAIN}</name>" in d["definition"]
        assert "<domain type='qemu'>" in d["definition"]  # inactive: no live id=
        assert d["sha256"] == hashlib.sha256(d["definition"].encode()).hexdigest()
        again = await c.call("vm.start", {"spec": vmdef_sign.spec(key, DOMAIN, xml)},
                             timeout=30)
        assert again["already_running"] is True
    log = agent.log_text()
    assert "why=definition_unsigned" in log and "why=bad_signature" in log
    assert f"event=vm_start vm={DOMAIN} result=started definition=signed" in log
