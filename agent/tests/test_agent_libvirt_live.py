"""The libvirt driver's live inventory and vm.start, against a real libvirtd.

- A domain defined and started after the agent is listed by `inventory`
  within 5 s, without a restart (domain lifecycle events), and the
  inventory's `generation` changes with it.
- libvirtd killed (-9): the inventory is stale (`stale: true`, the
  connection `connected: false`); libvirtd started again: fresh, with the
  same domains, after the agent reconnects by itself.
- vm.start of a configured libvirt VM defines it from the config's `xml =`
  and starts it; a discovered domain is not the agent's to start.
- kill -9 of the agent while a discovered domain is paused: the restarted
  agent resumes it once discovery has found it again (its journal entry
  is kept until then).

The test owns libvirtd (libvirt_env.libvirtd_owned) and holds the lab lock
while it kills it, so no other lab test runs meanwhile.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cutpoint.agentclient import AgentReplyError
from libvirt_agent import (
    GUEST_AGENT,
    LibvirtAgent,
    domain_xml,
    domstate,
    forget_domain,
    until,
    virsh,
)
from libvirt_env import OwnLibvirtd, libvirtd_owned

pytestmark = pytest.mark.lab

PREFIX = "cp-lvlive-"
STARTED = PREFIX + "start"       # a configured VM, defined by vm.start
NEW = PREFIX + "new"             # defined and started behind the agent's back


def _forget_all() -> None:
    for name in virsh("list", "--all", "--name", check=False).split():
        if name.startswith(PREFIX):
            forget_domain(name)


@pytest.fixture
def live(lab_session: Any, tmp_path: Path) -> Iterator[tuple[LibvirtAgent, OwnLibvirtd, Path]]:
    lab_session.lock()          # kills libvirtd: no other lab test meanwhile
    with libvirtd_owned() as lv:
        _forget_all()
        xmldir = Path(tempfile.mkdtemp(prefix=PREFIX, dir="/var/tmp"))
        xmldir.chmod(0o755)
        (xmldir / "start.xml").write_text(domain_xml(STARTED, GUEST_AGENT))
        agent = LibvirtAgent(tmp_path, extra=(
            f"[vm {STARTED}]\ndriver = libvirt\nxml = {xmldir / 'start.xml'}\n"))
        agent.start()
        try:
            yield agent, lv, xmldir
        finally:
            sanitizer = agent.stop()
            _forget_all()
            shutil.rmtree(xmldir, ignore_errors=True)
            assert not sanitizer, sanitizer


def _vm(inv: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((v for v in inv["vms"] if v["name"] == name), None)


async def test_new_domain_listed_within_5s(live: tuple[LibvirtAgent, OwnLibvirtd, Path],
                                           tmp_path: Path) -> None:
    agent, _, _ = live
    async with agent.client() as c:
        await until(lambda: _fresh(c), "libvirt connected")
        inv0 = await c.inventory()
        assert _vm(inv0, NEW) is None
        xml = tmp_path / "new.xml"
        xml.write_text(domain_xml(NEW, GUEST_AGENT))
        t0 = time.monotonic()
        virsh("define", str(xml))
        virsh("start", NEW)
        started = time.monotonic() - t0

        async def listed() -> bool:
            v = _vm(await c.inventory(), NEW)
            return v is not None and v["state"] == "running"

        took = await until(listed, f"{NEW} in the inventory", timeout=5)
        inv = await c.inventory()
        v = _vm(inv, NEW)
        assert v is not None
        print(f"\nvirsh define+start {started * 1000:.0f} ms; listed running "
              f"{took * 1000:.0f} ms after start returned")
        assert v["driver"] == "libvirt" and v["stale"] is False
        assert len(v["uuid"]) == 36 and v["guest_agent"] is True
        assert v["disks"] == [] and v["unsupported_disks"] == []
        assert inv["generation"] > inv0["generation"]
        assert inv["instance"] == inv0["instance"]
        # nothing changed: same generation (a poller need not sync)
        assert (await c.inventory())["generation"] == inv["generation"]
        # paused behind our back: the state follows, the generation moves
        virsh("suspend", NEW)
        await until(lambda: _state(c, NEW, "paused"), "paused in the inventory", 5)
        virsh("resume", NEW)
        # undefined: gone from the inventory
        virsh("destroy", NEW)
        virsh("undefine", NEW)
        await until(lambda: _gone(c, NEW), f"{NEW} gone from the inventory", 5)
    assert f"event=vm_adopted vm={NEW} driver=libvirt" in agent.log_text()


async def _fresh(c: Any) -> bool:
    inv = await c.inventory()
    return inv["stale"] is False


async def _state(c: Any, name: str, state: str) -> bool:
    v = _vm(await c.inventory(), name)
    return v is not None and v["state"] == state


async def _ready(c: Any, name: str) -> bool:
    v = _vm(await c.inventory(), name)
    return v is not None and v["ready"] and not v["stale"]


async def _gone(c: Any, name: str) -> bool:
    return _vm(await c.inventory(), name) is None


async def test_libvirtd_killed_stale_then_fresh(
        live: tuple[LibvirtAgent, OwnLibvirtd, Path]) -> None:
    agent, lv, _ = live
    async with agent.client() as c:
        await until(lambda: _fresh(c), "libvirt connected")
        before = await c.inventory()
        lv.kill9()
        t0 = time.monotonic()
        stale = await until(lambda: _stale(c), "inventory stale after kill -9", 10)
        inv = await c.inventory()
        conn = inv["connections"][0]
        assert conn["driver"] == "libvirt" and conn["connected"] is False
        assert conn["error"]
        assert all(v["stale"] for v in inv["vms"] if v["driver"] == "libvirt")
        assert inv["generation"] > before["generation"]
        lv.start()
        fresh = await until(lambda: _fresh(c), "inventory fresh after restart", 40)
        after = await c.inventory()
        assert after["connections"][0]["epoch"] == conn["epoch"] + 1
        assert {v["name"] for v in after["vms"]} == {v["name"] for v in before["vms"]}
        print(f"\nstale {stale * 1000:.0f} ms after kill -9; fresh "
              f"{fresh * 1000:.0f} ms after libvirtd answered again "
              f"({(time.monotonic() - t0):.1f} s in all)")
    text = agent.log_text()
    assert "event=libvirt_down" in text and "inventory=stale" in text
    assert text.count("event=libvirt_connected") >= 2


async def _stale(c: Any) -> bool:
    return bool((await c.inventory())["stale"])


async def test_vm_start_defines_the_configured_domain(
        live: tuple[LibvirtAgent, OwnLibvirtd, Path]) -> None:
    agent, _, _ = live
    async with agent.client() as c:
        await until(lambda: _ready(c, STARTED), f"{STARTED} ready")
        v = _vm(await c.inventory(), STARTED)
        assert v is not None and v["state"] == "shutoff" and v["defined"] is False
        res = await c.call("vm.start", {"spec": {"vm": STARTED}}, timeout=60)
        assert res["state"] == "running" and res["already_running"] is False
        assert domstate(STARTED) == "running"
        assert "<name>" + STARTED in virsh("dumpxml", "--inactive", STARTED)
        await until(lambda: _state(c, STARTED, "running"), "running in the inventory", 5)
        again = await c.call("vm.start", {"spec": {"vm": STARTED}}, timeout=60)
        assert again["already_running"] is True
        # stopped, then started again from the (now defined) domain
        await c.call("vm.stop", {"vm": STARTED})
        assert domstate(STARTED) == "shut off"
        res = await c.call("vm.start", {"spec": {"vm": STARTED}}, timeout=60)
        assert res["state"] == "running"
        # still no definition from the wire
        with pytest.raises(AgentReplyError) as e:
            await c.call("vm.start", {"spec": {"xml": domain_xml("x")}})
        assert e.value.code == "FORBIDDEN"


async def test_vm_start_refuses_a_discovered_domain(
        live: tuple[LibvirtAgent, OwnLibvirtd, Path], tmp_path: Path) -> None:
    agent, _, _ = live
    xml = tmp_path / "d.xml"
    xml.write_text(domain_xml(NEW))
    virsh("define", str(xml))
    async with agent.client() as c:
        await until(lambda: _state(c, NEW, "shutoff"), "defined domain listed", 5)
        with pytest.raises(AgentReplyError) as e:
            await c.call("vm.start", {"spec": {"vm": NEW}})
        assert e.value.code == "UNKNOWN_VM"
        assert "configuration" in e.value.message
    assert domstate(NEW) == "shut off"


async def test_kill9_while_paused_discovered_domain_resumes(
        live: tuple[LibvirtAgent, OwnLibvirtd, Path], tmp_path: Path) -> None:
    agent, _, _ = live
    xml = tmp_path / "k.xml"
    xml.write_text(domain_xml(NEW))
    virsh("define", str(xml))
    virsh("start", NEW)

    async def ready() -> bool:
        v = _vm(await agent_inv(agent), NEW)
        return v is not None and v["ready"] and v["state"] == "running"

    await until(ready, f"{NEW} ready", 10)
    async with agent.client() as c:
        await c.prepare("k1", [NEW], 60000)
    assert domstate(NEW) == "paused"
    assert agent.proc is not None
    os.kill(agent.proc.pid, signal.SIGKILL)
    agent.proc.wait()
    agent.proc = None
    assert domstate(NEW) == "paused"
    agent.start()
    took = await until(lambda: domstate(NEW) == "running", "resumed after restart", 15)
    await until(lambda: (agent.dir / "journal").read_text() == "", "journal empty", 10)
    print(f"\ndiscovered domain running {took * 1000:.0f} ms after the agent's restart")
    text = agent.log_text()
    assert f"event=journal_resume txn=k1 vm={NEW} result=deferred" in text
    assert f"event=journal_resume txn=k1 vm={NEW} result=retrying why=discovered" in text


async def agent_inv(agent: LibvirtAgent) -> dict[str, Any]:
    async with agent.client() as c:
        return await c.inventory()
