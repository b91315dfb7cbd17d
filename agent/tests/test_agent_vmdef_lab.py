"""vm.start of a signed definition, and vm.definition, on a real libvirtd.

A libvirtd of its own (cutpoint.lab.libvirt.LibvirtHost: a private mount
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

import asyncio
import hashlib
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cutpoint.agentclient import AgentError
from cutpoint.api.services import vmdef_sign
from cutpoint.api.services.vmdef_rewrite import DrTarget, rewrite
from cutpoint.coordinator.dr.boot import (
    FAILOVER,
    AgentBooter,
    AgentRef,
    BootRequest,
    BootVM,
)
from cutpoint.lab.libvirt import LibvirtHost
from libvirt_agent import LibvirtAgent, domain_xml, until

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
        assert (await c.hello())["signed_definitions"] is True
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


def test_captured_definition_starts_on_another_host_through_the_booter(
        tmp_path: Path,
        signed_agent: tuple[LibvirtAgent, LibvirtHost, Ed25519PrivateKey]) -> None:
    """Capture on one libvirtd, start at another: the source host's agent
    (its own libvirtd, a [vm] for a defined domain with a bridge interface)
    gives the domain's definition (vm.definition); it is rewritten for the
    other host as a drill would (vmdef_rewrite: new name and UUID, the
    bridge mapped to one that exists there, no MACs) and signed; the
    product's booter (AgentBooter, as failover runs it) passes preflight on
    the DR agent's hello (signed_definitions) though the agent does not
    list the VM, starts it there, waits until the agent lists it running,
    and stops it."""
    dr_agent, dr_host, key = signed_agent
    src_host = LibvirtHost(Path(tempfile.mkdtemp(prefix="cp-vmdef-src-")))
    src_host.start()
    src = None
    try:
        xml = domain_xml("cp-vmdef-src", "<interface type='bridge'><source bridge='br-src'/>"
                         "<model type='virtio'/></interface>")
        (tmp_path / "src.xml").write_text(xml)
        src_host.virsh("define", str(tmp_path / "src.xml"))
        (tmp_path / "src").mkdir()
        src = LibvirtAgent(tmp_path / "src", discover=False, uri=src_host.uri,
                           extra="[vm cp-vmdef-src]\ndriver = libvirt\n")
        src.start()

        async def capture() -> dict:
            async with src.client() as c:
                async def up() -> bool:
                    inv = await c.inventory()
                    return not inv["stale"] and any(v["name"] == "cp-vmdef-src" and v["ready"]
                                                    for v in inv["vms"])

                await until(up, "the source agent connected to its libvirtd", 30)
                return await c.call("vm.definition", {"vm": "cp-vmdef-src"}, timeout=30)

        d = asyncio.run(capture())
        assert "br-src" in d["definition"] and "<uuid>" in d["definition"]
        # the DR host's bridge: made in the DR libvirtd's view (the host's network)
        subprocess.run(["ip", "link", "add", "cpvmdef-br", "type", "bridge"], check=False)
        subprocess.run(["ip", "link", "set", "cpvmdef-br", "up"], check=True)
        name = "cp-vmdef-drill1"
        out = rewrite(d["definition"], DrTarget(
            pool="rbd", mon_hosts=(("127.0.0.1", 6789),), auth_user="x",
            secret_uuid="0b7e3c1a-2f45-4e8a-9d61-3c2a5e7f9b10",
            networks={"br-src": "cpvmdef-br"}, name=name,
            uuid="7d3f0c2e-8b1a-4c5d-9e6f-0a1b2c3d4e5f"))
        ca = dr_agent.certs
        req = BootRequest(FAILOVER, None, [BootVM(name, ())], "vmdef-test",
                          agents={name: AgentRef("127.0.0.1", dr_agent.port)},
                          specs={name: vmdef_sign.spec(key, name, out)},
                          tls=(str(ca / "ca.pem"), str(ca / "coordinator.pem"),
                               str(ca / "coordinator.key")))
        booter = AgentBooter()
        assert booter.preflight(req) == []
        unsigned = BootRequest(FAILOVER, None, req.vms, "vmdef-test", agents=req.agents,
                               tls=req.tls)
        assert [u.why for u in booter.preflight(unsigned)] == ["unknown_vm"]
        guests = booter.start(req)
        assert [g.vm for g in guests] == [name] and not guests[0].already_running
        booter.wait_ready(req, guests, 20)
        info = dr_host.virsh("dumpxml", name) or ""
        assert "7d3f0c2e-8b1a-4c5d-9e6f-0a1b2c3d4e5f" in info and "cpvmdef-br" in info
        assert (src_host.virsh("domstate", "cp-vmdef-src") or "").strip() == "shut off"
        assert booter.stop(req, guests) == []
        assert (dr_host.virsh("domstate", name) or "").strip() == "shut off"
    finally:
        sanitizer = src.stop() if src else ""
        src_host.stop()
        subprocess.run(["ip", "link", "del", "cpvmdef-br"], check=False)
        assert not sanitizer, sanitizer


def test_the_watch_captures_a_protected_vm_and_its_redefinition(
        tmp_path: Path,
        signed_agent: tuple[LibvirtAgent, LibvirtHost, Ed25519PrivateKey]) -> None:
    """The control plane's inventory watch against the real agent and
    libvirtd: a defined domain the agent discovers is captured once it is a
    group member (version 1, the agent's vm.definition, sha256 of the
    text), not again while nothing changes, and as version 2 after `virsh
    define` changes it (the agent's inventory generation moves)."""
    import ssl
    import time

    from cutpoint.api.config import Settings
    from cutpoint.api.models import (
        Base,
        Group,
        GroupMember,
        Host,
        Site,
        Vm,
        VmDefinition,
    )
    from cutpoint.api.services.inventory_watch import watch_round
    from sqlalchemy import create_engine, select
    from sqlalchemy.orm import sessionmaker

    agent, host, _ = signed_agent
    name = "cp-vmdef-watch"
    (tmp_path / "w.xml").write_text(domain_xml(name))
    host.virsh("define", str(tmp_path / "w.xml"))
    eng = create_engine(f"sqlite:///{tmp_path / 'cp.db'}")
    Base.metadata.create_all(eng)
    sf = sessionmaker(eng, expire_on_commit=False)
    certs = agent.certs
    settings = Settings(token_secret="vmdef-watch-secret-0123", database_url=str(eng.url),
                        agent_ca=certs / "ca.pem", agent_cert=certs / "coordinator.pem",
                        agent_key=certs / "coordinator.key")
    pin = hashlib.sha256(ssl.PEM_cert_to_DER_cert(agent.cert.read_text())).hexdigest()
    with sf() as s:
        site = Site(name="dr")
        s.add(site)
        s.flush()
        s.add(Host(name="lv", site_id=site.id, address="127.0.0.1", port=agent.port,
                   cert_fingerprint=pin))
        s.commit()

    def vm_row() -> Vm | None:
        with sf() as s:
            return s.scalar(select(Vm).where(Vm.name == name))

    t0 = time.monotonic()
    while vm_row() is None:
        assert time.monotonic() - t0 < 15, "the discovered domain never reached the database"
        watch_round(sf, settings)
        time.sleep(0.2)
    assert watch_round(sf, settings)["definitions"] == 0  # not protected: not captured
    with sf() as s:
        g = Group(name="app")
        s.add(g)
        s.flush()
        s.add(GroupMember(group_id=g.id, vm_id=vm_row().id))
        s.commit()
    assert watch_round(sf, settings)["definitions"] == 1
    assert watch_round(sf, settings)["definitions"] == 0
    # a new persistent definition: libvirt reports the domain defined (updated)
    (tmp_path / "w2.xml").write_text((host.virsh("dumpxml", "--inactive", name) or "").replace(
        "<memory unit='KiB'>65536</memory>", "<memory unit='KiB'>131072</memory>").replace(
        "<currentMemory unit='KiB'>65536</currentMemory>",
        "<currentMemory unit='KiB'>131072</currentMemory>"))
    host.virsh("define", str(tmp_path / "w2.xml"))
    got, t0 = 0, time.monotonic()
    while got == 0:
        assert time.monotonic() - t0 < 15, "the redefinition was never captured"
        got = watch_round(sf, settings)["definitions"]
        time.sleep(0.2)
    with sf() as s:
        rows = list(s.scalars(select(VmDefinition).order_by(VmDefinition.version)))
    assert [(r.version, r.format, r.host) for r in rows] == \
        [(1, "libvirt-domain-xml", "lv"), (2, "libvirt-domain-xml", "lv")]
    assert "<memory unit='KiB'>65536</memory>" in rows[0].definition
    assert "<memory unit='KiB'>131072</memory>" in rows[1].definition
    for r in rows:
        assert r.sha256 == hashlib.sha256(r.definition.encode()).hexdigest()
    print(f"\ncaptured v1 {rows[0].sha256[:12]}, v2 {rows[1].sha256[:12]} "
          f"{time.monotonic() - t0:.2f} s after the redefinition")
