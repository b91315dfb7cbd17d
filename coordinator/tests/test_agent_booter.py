"""The product's booter against a real agent: cutpointd with standby VMs.

No Ceph and no lab lock: one cutpointd on 127.0.0.1 whose config defines
`sb1`, a real QEMU (TCG, a qcow2 disk, daemonizing) started by its
`start =` command, and `bad`, whose start command fails.  AgentBooter
starts `sb1` through `vm.start`, waits until the agent lists it running,
finds it already running on a second start, stops it through `vm.stop`,
and reports nothing left; a VM whose start fails is a BootError that names
the agent's error and still hands back the VMs that did start.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cutpoint.coordinator.dr.boot import (
    FAILOVER,
    AgentBooter,
    AgentRef,
    BootDisk,
    BootError,
    BootRequest,
    BootVM,
    Guest,
)
from cutpoint.coordinator.dr.site import CephSite
from cutpoint.lab.agents import CA_SCRIPT, cutpointd_path, stop_agent_pid
from cutpoint.lab.proc import pid_alive

pytestmark = pytest.mark.lab


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def standby_agent() -> Iterator[dict[str, Any]]:
    d = Path(tempfile.mkdtemp(prefix="cp-agent-booter-"))
    agent: subprocess.Popen[bytes] | None = None
    try:
        certs = d / "certs"
        subprocess.run([str(CA_SCRIPT), str(certs), "issue", "agent", "agent", "127.0.0.1"], check=True)
        subprocess.run([str(CA_SCRIPT), str(certs), "issue", "coordinator", "coordinator"], check=True)
        disk = d / "sb1-d0.qcow2"
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(disk), "16M"], check=True)
        qemu = shutil.which("qemu-system-x86_64")
        assert qemu, "qemu-system-x86_64 not installed"
        start = " ".join([qemu, "-machine", "accel=tcg", "-nodefaults", "-display", "none",
                          "-m", "64", "-serial", "null",
                          "-qmp", f"unix:{d / 'sb1.sock'},server=on,wait=off",
                          "-blockdev", (f"driver=qcow2,node-name=disk0,file.driver=file,"
                                        f"file.filename={disk}"),
                          "-device", "virtio-blk-pci,drive=disk0",
                          "-pidfile", str(d / "sb1.pid"), "-daemonize"])
        port = _free_port()
        cfg = d / "agent.ini"
        cfg.write_text(
            f"[agent]\nhost = dr-local\nlisten = 127.0.0.1:{port}\n"
            f"journal = {d / 'journal'}\nqmp_timeout_ms = 1000\n\n"
            f"[tls]\nca = {certs / 'ca.pem'}\ncert = {certs / 'agent.pem'}\n"
            f"key = {certs / 'agent.key'}\n\n"
            f"[vm sb1]\nqmp = {d / 'sb1.sock'}\nstart = {start}\ndisk.disk0 = qcow2:{disk}\n\n"
            f"[vm bad]\nqmp = {d / 'bad.sock'}\nstart = /bin/ls /nonexistent-cp-start\n")
        with open(d / "agent.log", "wb") as log:
            agent = subprocess.Popen([str(cutpointd_path()), "-c", str(cfg)], stdout=log,
                                     stderr=log)
        t0 = time.monotonic()
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert agent.poll() is None, (d / "agent.log").read_text()
                assert time.monotonic() - t0 < 20
                time.sleep(0.05)
        yield {"agent": AgentRef("127.0.0.1", port), "dir": d,
               "tls": (str(certs / "ca.pem"), str(certs / "coordinator.pem"),
                       str(certs / "coordinator.key"))}
    finally:
        if agent is not None:
            stop_agent_pid(agent.pid)
            agent.wait(timeout=10)
        try:
            os.kill(int((d / "sb1.pid").read_text().strip()), signal.SIGKILL)
        except (OSError, ValueError):
            pass
        shutil.rmtree(d, ignore_errors=True)


def _request(a: dict[str, Any], *names: str) -> BootRequest:
    site = CephSite("dr", pools={"rbd": "rbd"}, ceph_conf="/nonexistent/ceph.conf")
    return BootRequest(FAILOVER, site, [BootVM(n, (BootDisk("disk0", f"{n}-disk0"),))
                                      for n in names], "failover-t",
                       agents={n: a["agent"] for n in names}, tls=a["tls"])


def test_start_ready_stop_through_the_agent(standby_agent: dict[str, Any]) -> None:
    a = standby_agent
    booter = AgentBooter()
    req = _request(a, "sb1")
    assert booter.states(req, ["sb1"]) == {"sb1": "shutoff"}
    events: list[tuple[str, dict[str, Any]]] = []
    guests = booter.start(req, lambda step, d: events.append((step, d)))
    assert [(g.vm, g.agent, g.already_running) for g in guests] == [
        ("sb1", str(a["agent"]), False)]
    assert guests[0].start_ms and guests[0].start_ms > 0
    assert [s for s, _ in events] == ["vm_start"] and events[0][1]["agent"] == str(a["agent"])
    booter.wait_ready(req, guests, 30, lambda step, d: events.append((step, d)))
    assert events[-1] == ("ready", {"vm": "sb1"})
    pid = int((a["dir"] / "sb1.pid").read_text().strip())
    assert pid_alive(pid)
    # A second start finds it running: never a second QEMU on the same disks.
    again = booter.start(req)
    assert again[0].already_running is True
    assert booter.leftovers(req) == {"vms": ["sb1 (running)"]}
    assert booter.stop(req, guests) == []
    t0 = time.monotonic()
    while pid_alive(pid):
        assert time.monotonic() - t0 < 10, "QEMU did not quit"
        time.sleep(0.05)
    assert booter.leftovers(req) == {"vms": []}


def test_a_failed_start_names_the_agents_error_and_returns_what_started(
        standby_agent: dict[str, Any]) -> None:
    a = standby_agent
    booter = AgentBooter()
    req = _request(a, "sb1", "bad")
    with pytest.raises(BootError) as ei:
        booter.start(req)
    msg = str(ei.value)
    assert "bad: vm.start on" in msg and "QMP_ERROR" in msg, msg
    assert [g.vm for g in ei.value.guests] == ["sb1"]  # the caller stops it
    assert booter.stop(req, ei.value.guests) == []
    # Not running and never will be: wait_ready gives up, naming the state.
    with pytest.raises(BootError) as ei2:
        booter.wait_ready(_request(a, "bad"), [Guest("bad")], 1)
    assert "not running after 1s: bad (shutoff)" in str(ei2.value)


def test_preflight_asks_without_starting(standby_agent: dict[str, Any]) -> None:
    """A failover's `dr_agents_ready` precondition: the agent answers, has
    vm.start and defines the VM; a VM it does not define, an agent that does
    not answer and a VM no agent is named for are each reported, and
    nothing is started."""
    from cutpoint.coordinator.dr.preconditions import dr_agents_ready

    a = standby_agent
    booter = AgentBooter()
    assert booter.preflight(_request(a, "sb1", "bad")) == []  # "bad" is defined
    assert dr_agents_ready(booter, _request(a, "sb1")).ok
    ghost = booter.preflight(_request(a, "sb1", "ghost"))
    assert [(u.vm, u.why) for u in ghost] == [("ghost", "unknown_vm")], ghost
    assert "does not define it" in ghost[0].message and str(a["agent"]) in ghost[0].message
    check = dr_agents_ready(booter, _request(a, "sb1", "ghost"))
    assert (check.status, check.code, check.unavailable) == ("fail", "dr_agent_unknown_vm",
                                                             False), check
    assert "ghost" in check.message and "sb1" not in check.detail["vms"]
    # An agent that does not answer: reported within the check deadline.
    gone = dict(a, agent=AgentRef("127.0.0.1", _free_port()))
    t0 = time.monotonic()
    check = dr_agents_ready(booter, _request(gone, "sb1"))
    assert time.monotonic() - t0 < 12
    assert (check.code, check.unavailable) == ("dr_agent_unreachable", True), check
    # An agent whose certificate is not the pinned one (the CA signed both):
    # refused before any request is sent, like an agent that does not answer.
    impostor = dict(a, agent=AgentRef("127.0.0.1", a["agent"].port, "00" * 32))
    check = dr_agents_ready(booter, _request(impostor, "sb1"))
    assert (check.code, check.unavailable) == ("dr_agent_unreachable", True), check
    assert "fingerprint" in check.message.lower() or "pin" in check.message.lower() \
        or "CERT_MISMATCH" in check.message, check.message
    # No agent named for the VM, or no certificate: nobody to ask.
    nobody = BootRequest(FAILOVER, None, [BootVM("sb1", ())], "failover-t", tls=a["tls"])
    assert [u.why for u in booter.preflight(nobody)] == ["no_agent"]
    # Asking started nothing: sb1 is still shut off, no QEMU pid file.
    assert booter.states(_request(a, "sb1"), ["sb1"]) == {"sb1": "shutoff"}
    assert not (a["dir"] / "sb1.pid").exists()
