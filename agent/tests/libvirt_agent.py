"""Helpers of the libvirt driver's tests: domains, virsh, one cutpointd.

`LibvirtAgent` writes an agent config with a `[libvirt]` section (and any
`[vm]` sections the test adds), starts cutpointd on it and stops it; the
domains the tests create are `type='qemu'` (TCG) and need no guest OS:
libvirt, QEMU's monitor and its block layer are all the agent touches.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conftest import coordinator_context
from cutpoint.agentclient import AgentClient
from cutpoint.lab.agents import CA_SCRIPT
from libvirt_env import URI
from test_agent_local import _free_port, _launch_agent, _stop_agent

GUEST_AGENT = ("<channel type='unix'><target type='virtio' "
               "name='org.qemu.guest_agent.0'/></channel>")


def domain_xml(name: str, devices: str = "", *, uuid: str | None = None) -> str:
    """A small TCG domain; `devices` goes inside <devices>."""
    return f"""<domain type='qemu'>
  <name>{name}</name>{f"<uuid>{uuid}</uuid>" if uuid else ""}
  <memory unit='MiB'>64</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type></os>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    {devices}
    <memballoon model='none'/>
  </devices>
</domain>
"""


def virsh(*args: str, check: bool = True) -> str:
    r = subprocess.run(["virsh", "-c", URI, *args], check=False, capture_output=True,
                       text=True)
    if check and r.returncode != 0:
        raise AssertionError(f"virsh {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


def forget_domain(name: str) -> None:
    """Destroy and undefine name if it exists (a leftover of a crash)."""
    virsh("destroy", name, check=False)
    virsh("undefine", name, check=False)


def log_since(path: Path, offset: int) -> str:
    """What libvirt appended to a domain's log after offset."""
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def domstate(name: str) -> str:
    return virsh("domstate", name, check=False).strip()


async def until(cond: Callable[[], Any], what: str, timeout: float = 10) -> float:
    """Polls cond (sync or async) every 20 ms; returns the seconds it took."""
    t0 = time.monotonic()
    while True:
        r = cond()
        if asyncio.iscoroutine(r):
            r = await r
        if r:
            return time.monotonic() - t0
        assert time.monotonic() - t0 < timeout, f"{what}: not within {timeout} s"
        await asyncio.sleep(0.02)


class LibvirtAgent:
    """One cutpointd in directory d with a [libvirt] section."""

    def __init__(self, d: Path, *, discover: bool = True, extra: str = "",
                 agent_extra: str = "", uri: str = URI, host: str = "libvirt-test",
                 certs: Path | None = None, cert: str = "agent") -> None:
        """`certs`: a CA directory shared with other agents (default: its own);
        `cert`: the name of its certificate there."""
        self.dir = d
        self.certs = certs or d / "certs"
        self.cert = self.certs / f"{cert}.pem"
        subprocess.run([str(CA_SCRIPT), str(self.certs), "issue", cert, "agent",
                        "127.0.0.1"], check=True, capture_output=True)
        subprocess.run([str(CA_SCRIPT), str(self.certs), "issue", "coordinator",
                        "coordinator"], check=True, capture_output=True)
        self.port = _free_port()
        self.log = d / "agent.log"
        self.cfg = d / "agent.ini"
        self.cfg.write_text(
            f"[agent]\nhost = {host}\nlisten = 127.0.0.1:{self.port}\n"
            f"journal = {d / 'journal'}\n{agent_extra}\n"
            f"[tls]\nca = {self.certs / 'ca.pem'}\ncert = {self.cert}\n"
            f"key = {self.certs / (cert + '.key')}\n\n"
            f"[libvirt]\nuri = {uri}\ndiscover = {'yes' if discover else 'no'}\n\n"
            + extra)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = _launch_agent(self.dir, self.cfg, self.port)

    def stop(self) -> str:
        """Stops the agent; returns a sanitizer report, if any."""
        out = _stop_agent(self.proc, self.dir)
        self.proc = None
        return out

    def client(self) -> AgentClient:
        return AgentClient("127.0.0.1", self.port,
                           ssl_context=coordinator_context(self.certs))

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")
