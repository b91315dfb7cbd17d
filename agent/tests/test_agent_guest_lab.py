"""vm.guest_ping and vm.guest_exec against a real guest's qemu-guest-agent.

The guest is the tiny lab image (dr-tests/lab/image.py), whose init starts
Debian's qemu-ga on the virtio-serial port org.qemu.guest_agent.0, booted
under TCG:

- libvirt driver: a libvirtd of its own (cutpoint.lab.libvirt.LibvirtHost), a
  cutpointd with `definition_key`; the domain is started from a signed
  definition with `transient: true`, as a drill starts its copies.  The
  guest agent answers guest-ping once it is up; guest-exec gives the
  program's exit code, output and stdin; a program that does not exist is
  GUEST_ERROR; one that runs past its deadline GUEST_TIMEOUT with its pid.
  libvirt marks the domain tainted (custom-ga-command), as documented.
  vm.stop then leaves no domain at all (transient).
- qmp driver: a QEMU of the test's own with QMP and a guest agent chardev
  socket, named by `qga =` in the agent's [vm].
"""

from __future__ import annotations

import asyncio
import glob
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cutpoint.agentclient import AgentClient, AgentError
from cutpoint.api.services import vmdef_sign
from cutpoint.lab import image
from cutpoint.lab.libvirt import LibvirtHost
from libvirt_agent import LibvirtAgent
from test_agent_local import _free_port, _launch_agent, _stop_agent

pytestmark = pytest.mark.lab

DOMAIN = "drill-guesttest-g1"


@pytest.fixture(scope="module")
def tiny() -> dict[str, Any]:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    kernel = max(glob.glob("/boot/vmlinuz-*"))
    return image.build(kernel, log=lambda m: print(m))


def tiny_domain(name: str, img: dict[str, Any], console: Path) -> str:
    return f"""<domain type='qemu'>
  <name>{name}</name>
  <memory unit='MiB'>256</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type>
    <kernel>{img['kernel']}</kernel><initrd>{img['initrd']}</initrd>
    <cmdline>console=ttyS0 quiet cp.name={name}</cmdline></os>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <serial type='pty'><log file='{console}' append='off'/><target port='0'/></serial>
    <channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>
    <memballoon model='none'/>
  </devices>
</domain>
"""


async def ping_until_up(c: AgentClient, vm: str, timeout: float) -> tuple[float, int]:
    """guest-ping until it answers: (seconds, failed attempts)."""
    t0, failed = time.monotonic(), 0
    while True:
        try:
            await c.guest_ping(vm, timeout_ms=2000)
            return time.monotonic() - t0, failed
        except AgentError as exc:
            assert exc.code in ("GUEST_ERROR", "GUEST_TIMEOUT", "UNKNOWN_VM"), exc
            failed += 1
        assert time.monotonic() - t0 < timeout, f"{vm}: no guest-ping within {timeout} s"
        await asyncio.sleep(0.5)


async def exercise(c: AgentClient, vm: str, kver: str) -> None:
    r = await c.guest_exec(vm, "/bin/sh", ["-c", "cat; uname -r; echo oops >&2; exit 7"],
                           input="from-stdin\n", timeout_ms=20000)
    print(f"\n{vm}: guest_exec {r}")
    assert r["exitcode"] == 7 and r["signal"] is None
    lines = r["stdout"].splitlines()
    assert lines[0] == "from-stdin" and lines[1] == kver  # the guest's kernel, not the host's
    assert r["stderr"] == "oops\n" and not r["stdout_truncated"]
    with pytest.raises(AgentError) as exc:
        await c.guest_exec(vm, "/nonexistent/prog", timeout_ms=10000)
    assert exc.value.code == "GUEST_ERROR", exc.value
    t0 = time.monotonic()
    with pytest.raises(AgentError) as exc:
        await c.guest_exec(vm, "/bin/sleep", ["60"], timeout_ms=1500)
    took = time.monotonic() - t0
    assert exc.value.code == "GUEST_TIMEOUT", exc.value
    assert exc.value.received["result"]["pid"] > 0, exc.value.received  # §3.4
    print(f"{vm}: a 60 s sleep with timeout_ms=1500 gave GUEST_TIMEOUT after {took:.2f} s")
    assert took < 15


@pytest.fixture
def lv(tiny: dict[str, Any], tmp_path: Path) \
        -> Iterator[tuple[LibvirtAgent, LibvirtHost, Ed25519PrivateKey]]:
    key = Ed25519PrivateKey.generate()
    pub = tmp_path / "definition-signing.pub"
    pub.write_bytes(vmdef_sign.public_pem(key))
    host = LibvirtHost(Path(tempfile.mkdtemp(prefix="cp-guest-lv-")))
    host.start()
    agent = None
    try:
        agent = LibvirtAgent(tmp_path, discover=True, uri=host.uri,
                             # what the signed tiny domain names of the host
                             # (agent/defpolicy.h): its kernel, initrd, console log
                             extra=f"definition_key = {pub}\ndefinition_paths = "
                             f"{Path(tiny['kernel']).parent} {Path(tiny['initrd']).parent} "
                             f"{tmp_path}\n")
        agent.start()
        yield agent, host, key
    finally:
        sanitizer = agent.stop() if agent else ""
        host.stop()
        assert not sanitizer, sanitizer


def test_libvirt_guest_agent_and_transient_stop(
        tiny: dict[str, Any], tmp_path: Path,
        lv: tuple[LibvirtAgent, LibvirtHost, Ed25519PrivateKey]) -> None:
    agent, host, key = lv
    console = tmp_path / "console.log"
    xml = tiny_domain(DOMAIN, tiny, console)

    async def run() -> None:
        async with agent.client() as c:
            spec = {**vmdef_sign.spec(key, DOMAIN, xml), "transient": True}
            r = await c.call("vm.start", {"spec": spec}, timeout=90)
            assert r["state"] == "running", r
            took, failed = await ping_until_up(c, DOMAIN, 90)
            print(f"\nlibvirt: guest-ping answered {took:.2f} s after vm.start "
                  f"({failed} attempts failed before)")
            await exercise(c, DOMAIN, tiny["kernel_version"])
            log = (host.dir / "log" / "qemu" / f"{DOMAIN}.log").read_text(errors="replace")
            assert "custom-ga-command" in log  # documented: agent-protocol §4.12
            await c.call("vm.stop", {"vm": DOMAIN}, timeout=30)

    asyncio.run(run())
    assert "cp-init: ready" in console.read_text(errors="replace")
    assert DOMAIN not in (host.virsh("list", "--all", "--name") or "")
    assert host.virsh("domstate", DOMAIN, check=False) is None  # no such domain


def test_qmp_driver_guest_agent(tiny: dict[str, Any], tmp_path: Path) -> None:
    d = tmp_path
    certs = d / "certs"
    from cutpoint.lab.agents import CA_SCRIPT

    for name, role, *ip in (("agent", "agent", "127.0.0.1"), ("coordinator", "coordinator")):
        subprocess.run([str(CA_SCRIPT), str(certs), "issue", name, role, *ip], check=True,
                       capture_output=True)
    qemu = subprocess.Popen(
        ["qemu-system-x86_64", "-accel", "tcg", "-m", "256", "-nodefaults", "-display", "none",
         "-kernel", tiny["kernel"], "-initrd", tiny["initrd"],
         "-append", "console=ttyS0 quiet cp.name=gq",
         "-serial", f"file:{d / 'console.log'}",
         "-qmp", f"unix:{d / 'gq.qmp'},server=on,wait=off",
         "-device", "virtio-serial",
         "-chardev", f"socket,path={d / 'gq.qga'},server=on,wait=off,id=qga0",
         "-device", "virtserialport,chardev=qga0,name=org.qemu.guest_agent.0"])
    agent = None
    try:
        t0 = time.monotonic()
        while not (d / "gq.qga").exists():
            assert time.monotonic() - t0 < 20, "QEMU did not create its sockets"
            time.sleep(0.05)
        port = _free_port()
        cfg = d / "agent.ini"
        cfg.write_text(f"[agent]\nhost = local\nlisten = 127.0.0.1:{port}\n"
                       f"journal = {d / 'journal'}\n\n"
                       f"[tls]\nca = {certs / 'ca.pem'}\ncert = {certs / 'agent.pem'}\n"
                       f"key = {certs / 'agent.key'}\n\n"
                       f"[vm gq]\nqmp = {d / 'gq.qmp'}\nqga = {d / 'gq.qga'}\n")
        agent = _launch_agent(d, cfg, port)
        from conftest import coordinator_context

        async def run() -> None:
            async with AgentClient("127.0.0.1", port,
                                   ssl_context=coordinator_context(certs)) as c:
                took, failed = await ping_until_up(c, "gq", 90)
                print(f"\nqmp: guest-ping answered {took:.2f} s after the agent started "
                      f"({failed} attempts failed before)")
                await exercise(c, "gq", tiny["kernel_version"])

        asyncio.run(run())
    finally:
        sanitizer = _stop_agent(agent, d)
        qemu.kill()
        qemu.wait()
        assert not sanitizer, sanitizer
