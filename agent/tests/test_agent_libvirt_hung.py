"""Deadlines on libvirt calls: a hung libvirtd or a hung QEMU under libvirt
makes that member's prepare fail within the lease, and the other VM of the
transaction runs again.

One transaction, two VMs on one agent, one per driver: `qv`, a raw QEMU
(driver qmp), and a libvirt domain (driver libvirt).  The test plays the
coordinator (coordinator/twophase.py): PREPARE with the default lease
(2000 ms), and when no PREPARED came within its prepare timeout (lease / 2)
an ABORT.  The fault is SIGSTOP on libvirtd, or on the domain's QEMU; it is
always undone (SIGCONT) in `finally`, and then the libvirt domain must run
again too (the agent keeps resuming it: its suspend may land late).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cutpoint.agentclient import AgentReplyError
from libvirt_agent import (
    LibvirtAgent,
    domain_xml,
    domstate,
    forget_domain,
    until,
    virsh,
)
from libvirt_env import OwnLibvirtd, domain_pid, libvirtd_owned

pytestmark = pytest.mark.lab

DOMAIN = "cp-lvhung-dom"
LEASE_MS = 2000                 # the coordinator's default lease
PREPARE_TIMEOUT_S = LEASE_MS / 2 / 1000     # and its prepare timeout
# The fault matrix's bound (docs/reliability.md): the QMP VM resumed within
# the lease plus this, although its libvirt peer hangs.
PAUSE_SLACK_MS = 100


@pytest.fixture
def pair(lab_session: Any, tmp_path: Path) -> Iterator[tuple[LibvirtAgent, OwnLibvirtd]]:
    lab_session.lock()          # stops libvirtd: no other lab test meanwhile
    qemu = None
    with libvirtd_owned() as lv:
        forget_domain(DOMAIN)
        xml = tmp_path / "dom.xml"
        xml.write_text(domain_xml(DOMAIN))
        virsh("create", str(xml))
        sock = tmp_path / "qv.qmp"
        qemu = subprocess.Popen([
            "qemu-system-x86_64", "-machine", "accel=tcg", "-nodefaults",
            "-display", "none", "-m", "64", "-serial", "null",
            "-qmp", f"unix:{sock},server=on,wait=off"])
        agent = None
        try:
            t0 = time.monotonic()
            while not sock.exists():
                assert time.monotonic() - t0 < 20, "QEMU did not create its QMP socket"
                time.sleep(0.05)
            agent = LibvirtAgent(tmp_path, discover=False, extra=(
                f"[vm qv]\nqmp = {sock}\n\n[vm lv]\ndriver = libvirt\n"
                f"domain = {DOMAIN}\n"))
            agent.start()
            yield agent, lv
        finally:
            sanitizer = agent.stop() if agent else ""
            qemu.kill()
            qemu.wait()
            forget_domain(DOMAIN)
            assert not sanitizer, sanitizer


async def _states(c: Any) -> dict[str, str]:
    return {v["name"]: v["state"] for v in (await c.inventory())["vms"]}


async def _coordinated_prepare(c: Any, txn: str) -> tuple[dict[str, Any], float, float]:
    """PREPARE, ABORT after the prepare timeout; the prepare's error reply,
    its time and the abort's time (s, from the PREPARE)."""
    t0 = time.monotonic()
    prep = asyncio.ensure_future(c.prepare(txn, ["qv", "lv"], LEASE_MS, timeout=30))
    done, _ = await asyncio.wait({prep}, timeout=PREPARE_TIMEOUT_S)
    assert not done, "prepared although a member hangs"
    await c.abort(txn, timeout=30)
    t_abort = time.monotonic() - t0
    with pytest.raises(AgentReplyError) as e:
        await prep
    t_prep = time.monotonic() - t0
    assert e.value.received is not None
    return e.value.received, min(t_prep, t_abort), t_abort


def _check_reply(reply: dict[str, Any]) -> dict[str, dict[str, Any]]:
    assert reply["error"]["code"] == "QMP_TIMEOUT", reply
    vms = {v["vm"]: v for v in reply["result"]["vms"]}
    assert vms["qv"]["stopped"] is True and vms["qv"]["resumed"] is True
    assert vms["lv"]["stopped"] is False
    assert f"no answer from libvirt within {LEASE_MS} ms" in vms["lv"]["error"]
    return vms


async def _after_sigcont(agent: LibvirtAgent, c: Any) -> float:
    """The libvirt domain runs again and the journal empties."""
    took = await until(lambda: domstate(DOMAIN) == "running", "domain running again", 30)
    await until(lambda: (agent.dir / "journal").read_text() == "", "journal empty", 30)
    await until(lambda: _all_running(c), "inventory: both running", 30)
    return took


async def _all_running(c: Any) -> bool:
    vms = (await c.inventory())["vms"]
    return all(v["state"] == "running" and v["ready"] for v in vms)


async def test_sigstop_libvirtd_during_prepare(
        pair: tuple[LibvirtAgent, OwnLibvirtd]) -> None:
    agent, lv = pair
    async with agent.client() as c:
        await until(lambda: _all_running(c), "both running", 20)
        os.kill(lv.pid(), signal.SIGSTOP)
        try:
            reply, t_prep, t_abort = await _coordinated_prepare(c, "hung-lvd")
            vms = _check_reply(reply)
            # the other VM already runs: QMP answers while libvirtd sleeps
            assert (await _states(c))["qv"] == "running"
        finally:
            os.kill(lv.pid(), signal.SIGCONT)
        took = await _after_sigcont(agent, c)
    print(f"\nSIGSTOP libvirtd: prepare failed {t_prep * 1000:.0f} ms, abort done "
          f"{t_abort * 1000:.0f} ms after PREPARE (lease {LEASE_MS} ms); qv paused "
          f"{vms['qv']['paused_ms']:.0f} ms; domain running {took * 1000:.0f} ms "
          f"after SIGCONT")
    assert vms["qv"]["paused_ms"] <= LEASE_MS + PAUSE_SLACK_MS
    assert t_abort <= LEASE_MS / 1000 + 1.0


async def test_sigstop_domain_qemu_during_prepare(
        pair: tuple[LibvirtAgent, OwnLibvirtd]) -> None:
    agent, _ = pair
    pid = domain_pid(DOMAIN)
    assert pid > 0
    async with agent.client() as c:
        await until(lambda: _all_running(c), "both running", 20)
        os.kill(pid, signal.SIGSTOP)
        try:
            reply, t_prep, t_abort = await _coordinated_prepare(c, "hung-qemu")
            vms = _check_reply(reply)
            assert (await _states(c))["qv"] == "running"
            # a retried resume does not pile up threads: the slot is busy
            await asyncio.sleep(1.2)
            assert "an earlier virDomainSuspend has not returned" in agent.log_text()
        finally:
            os.kill(pid, signal.SIGCONT)
        took = await _after_sigcont(agent, c)
    print(f"\nSIGSTOP QEMU: prepare failed {t_prep * 1000:.0f} ms, abort done "
          f"{t_abort * 1000:.0f} ms after PREPARE (lease {LEASE_MS} ms); qv paused "
          f"{vms['qv']['paused_ms']:.0f} ms; domain running {took * 1000:.0f} ms "
          f"after SIGCONT")
    assert vms["qv"]["paused_ms"] <= LEASE_MS + PAUSE_SLACK_MS
    assert t_abort <= LEASE_MS / 1000 + 1.0
