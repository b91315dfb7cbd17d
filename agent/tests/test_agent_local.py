"""cutpointd against its own QEMU guests with qcow2 disks (no Ceph, no lab lock).

Two real QEMU processes (TCG, no guest OS needed: QMP and the block layer
are all the agent touches) with two qcow2 disks each, one real agent on
127.0.0.1.  Covers the wire format over TLS (agent-protocol §2, §3), the
QMP-transaction snapshot method on qcow2, and the lease on qcow2 VMs.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import ssl
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import coordinator_context
from cutpoint.agentclient import AgentClient, AgentReplyError
from cutpoint.lab.agents import CA_SCRIPT, cutpointd_path, stop_agent_pid
from cutpoint.lab.proc import pid_alive

pytestmark = pytest.mark.lab


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _launch_agent(d: Path, cfg: Path, port: int) -> subprocess.Popen[bytes]:
    """Start cutpointd on `cfg` (logging to d/agent.log) and wait until it listens."""
    with open(d / "agent.log", "wb") as log:
        agent = subprocess.Popen([str(cutpointd_path()), "-c", str(cfg)], stdout=log,
                                 stderr=log)
    t0 = time.monotonic()
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return agent
        except OSError:
            assert agent.poll() is None, (d / "agent.log").read_text()
            assert time.monotonic() - t0 < 20
            time.sleep(0.05)


def _stop_agent(agent: subprocess.Popen[bytes] | None, d: Path) -> str:
    """Stop the agent; returns the sanitizer report in its log, if any
    (CUTPOINTD=build-asan/agent/cutpointd), for the fixture to assert on."""
    if agent is None:
        return ""
    stop_agent_pid(agent.pid)
    agent.wait(timeout=10)
    text = (d / "agent.log").read_text(errors="replace")
    if "Sanitizer" not in text:
        return ""
    return text[text.index("=="):][:3000] if "==" in text else text[-3000:]


@pytest.fixture(scope="module")
def local_agent() -> Iterator[dict[str, Any]]:
    d = Path(tempfile.mkdtemp(prefix="cp-agent-local-"))
    qemus: list[subprocess.Popen[bytes]] = []
    agent = None
    try:
        certs = d / "certs"
        subprocess.run([str(CA_SCRIPT), str(certs), "issue", "agent", "agent", "127.0.0.1"], check=True)
        subprocess.run([str(CA_SCRIPT), str(certs), "issue", "coordinator", "coordinator"], check=True)
        vm_sections = []
        for v in ("vm1", "vm2"):
            argv = ["qemu-system-x86_64", "-machine", "accel=tcg", "-nodefaults",
                    "-display", "none", "-m", "64", "-serial", "null",
                    "-qmp", f"unix:{d / v}.sock,server=on,wait=off"]
            if v == "vm1":      # a guest agent channel, but no guest OS answers
                argv += ["-device", "virtio-serial",
                         "-chardev", f"socket,path={d / v}.qga,server=on,wait=off,id=qga0",
                         "-device", "virtserialport,chardev=qga0,name=org.qemu.guest_agent.0"]
            disks = []
            for k in range(2):
                f = d / f"{v}-d{k}.qcow2"
                subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(f), "16M"],
                               check=True)
                argv += ["-blockdev", (f"driver=qcow2,node-name=disk{k},file.driver=file,"
                                       f"file.filename={f}"),
                         "-device", f"virtio-blk-pci,drive=disk{k}"]
                disks.append(f"disk.disk{k} = qcow2:{f}")
            qemus.append(subprocess.Popen(argv))
            qga = f"qga = {d / v}.qga\n" if v == "vm1" else ""
            vm_sections.append(f"[vm {v}]\nqmp = {d / v}.sock\n{qga}" + "\n".join(disks) + "\n")
        for v in ("vm1", "vm2"):
            t0 = time.monotonic()
            while not (d / f"{v}.sock").exists():
                assert time.monotonic() - t0 < 20, "QEMU did not create its QMP socket"
                time.sleep(0.05)
        port = _free_port()
        cfg = d / "agent.ini"
        cfg.write_text(f"[agent]\nhost = local\nlisten = 127.0.0.1:{port}\n"
                       f"journal = {d / 'journal'}\nqmp_timeout_ms = 1000\n\n"
                       f"[tls]\nca = {certs / 'ca.pem'}\ncert = {certs / 'agent.pem'}\n"
                       f"key = {certs / 'agent.key'}\n\n" + "\n".join(vm_sections))
        agent = _launch_agent(d, cfg, port)
        yield {"address": "127.0.0.1", "port": port, "certs": certs, "dir": d,
               "pids": [q.pid for q in qemus]}
    finally:
        sanitizer = _stop_agent(agent, d)
        for q in qemus:
            q.kill()
            q.wait()
        shutil.rmtree(d, ignore_errors=True)
        assert not sanitizer, sanitizer


def _client(a: dict[str, Any]) -> AgentClient:
    return AgentClient(a["address"], a["port"], ssl_context=coordinator_context(a["certs"]))


def _raw(a: dict[str, Any]) -> ssl.SSLSocket:
    ctx = coordinator_context(a["certs"])
    return ctx.wrap_socket(socket.create_connection((a["address"], a["port"]), timeout=5),
                           server_hostname=a["address"])


def _read(s: ssl.SSLSocket) -> dict[str, Any] | None:
    buf = b""
    while len(buf) < 4:
        x = s.recv(4 - len(buf))
        if not x:
            return None
        buf += x
    n = struct.unpack(">I", buf)[0]
    body = b""
    while len(body) < n:
        body += s.recv(n - len(body))
    return dict(json.loads(body))


def test_oversized_frame_bad_frame_then_close(local_agent: dict[str, Any]) -> None:
    s = _raw(local_agent)
    s.sendall(struct.pack(">I", 1048577))          # body never sent
    r = _read(s)
    assert r is not None and r["error"]["code"] == "BAD_FRAME" and r["id"] is None
    assert _read(s) is None                         # closed


def test_invalid_utf8_bad_frame_then_close(local_agent: dict[str, Any]) -> None:
    s = _raw(local_agent)
    body = b'{"id":1,"cmd":"hel\xc3\x28lo"}'
    s.sendall(struct.pack(">I", len(body)) + body)
    r = _read(s)
    assert r is not None and r["error"]["code"] == "BAD_FRAME"
    assert _read(s) is None


def test_pipelined_errors_keep_connection(local_agent: dict[str, Any]) -> None:
    s = _raw(local_agent)
    reqs = [{"id": 1, "cmd": "format-disk"},
            {"id": 2, "cmd": "prepare", "args": {"txn": "a", "vms": "vm1", "lease_ms": 5}},
            {"id": "three", "cmd": "hello"}]
    wire = b"".join(struct.pack(">I", len(b)) + b
                    for b in (json.dumps(r).encode() for r in reqs))
    for i in range(len(wire)):                      # one byte at a time
        s.sendall(wire[i:i + 1])
    got = {r["id"]: r for r in (_read(s) for _ in reqs) if r}
    assert got[1]["error"]["code"] == "UNKNOWN_COMMAND"
    assert got[2]["error"]["code"] == "BAD_REQUEST"
    assert "args.vms" in got[2]["error"]["message"]
    assert got["three"]["ok"] is True and got["three"]["result"]["protocol"] == 1


async def test_qcow2_transaction_commit_and_unknowns(local_agent: dict[str, Any]) -> None:
    async with _client(local_agent) as c:
        inv = await c.inventory()
        assert {v["name"]: v["state"] for v in inv["vms"]} == {"vm1": "running",
                                                               "vm2": "running"}
        with pytest.raises(AgentReplyError) as ei:
            await c.prepare("q0", ["vm1", "nosuch"], 1000)
        assert ei.value.code == "UNKNOWN_VM"
        with pytest.raises(AgentReplyError) as ei:
            await c.commit("never", {"vm1/disk0": "x"}, 1000)
        assert ei.value.code == "UNKNOWN_TXN"
        await c.prepare("q1", ["vm1", "vm2"], 5000)
        with pytest.raises(AgentReplyError) as ei:
            await c.prepare("q2", ["vm2"], 5000)
        assert ei.value.code == "BUSY"
        with pytest.raises(AgentReplyError) as ei:
            await c.commit("q1", {"vm1/disk9": "cp.g.q1"}, 5000)
        assert ei.value.code == "UNKNOWN_DISK"
        snaps = {f"{v}/disk{k}": "cp.g.q1" for v in ("vm1", "vm2") for k in range(2)}
        res = await c.commit("q1", snaps, 5000)
        assert [v["method"] for v in res["vms"]] == ["qmp-transaction"] * 2
        assert all(d["ok"] for v in res["vms"] for d in v["disks"])
        assert await c.snapshot_list("vm2/disk1") == ["cp.g.q1"]
        assert {v["name"]: v["state"] for v in (await c.inventory())["vms"]} == \
            {"vm1": "running", "vm2": "running"}
        assert await c.snapshot_delete("vm2/disk1", "cp.g.q1") is True
        assert await c.snapshot_delete("vm2/disk1", "cp.g.q1") is False
        ab = await c.abort("q1")
        assert len(ab["deleted"]) == 3                # vm2/disk1 already gone
        assert await c.snapshot_list("vm1/disk0") == []
        with pytest.raises(AgentReplyError) as ei:
            await c.commit("q1", snaps, 5000)
        assert ei.value.code == "ABORTED"


async def test_lease_expiry_qcow2(local_agent: dict[str, Any]) -> None:
    async with _client(local_agent) as c:
        await c.prepare("l1", ["vm2"], 200)
        await asyncio.sleep(0.6)
        assert {v["name"]: v["state"] for v in (await c.inventory())["vms"]}["vm2"] == "running"
        with pytest.raises(AgentReplyError) as ei:
            await c.commit("l1", {"vm2/disk0": "cp.g.l1"}, 1000)
        assert ei.value.code == "EXPIRED"
        # abort of an expired txn is fine and idempotent
        assert (await c.abort("l1"))["resumed"] == []
        assert (await c.abort("l1"))["state"] == "aborted"


async def test_all_or_nothing_prepare_with_hung_vm(local_agent: dict[str, Any]) -> None:
    """vm2's QEMU is stopped: prepare of both fails, vm1 is resumed at once."""
    import os
    import signal

    pid2 = local_agent["pids"][1]
    async with _client(local_agent) as c:
        os.kill(pid2, signal.SIGSTOP)
        try:
            with pytest.raises(AgentReplyError) as ei:
                await c.prepare("h1", ["vm1", "vm2"], 5000)
            assert ei.value.code == "QMP_TIMEOUT"
            facts = {v["vm"]: v for v in ei.value.result["vms"]}
            assert facts["vm1"]["stopped"] is True and facts["vm1"]["resumed"] is True
            assert facts["vm2"]["stopped"] is False and "stop" in facts["vm2"]["error"]
            st = {v["name"]: v["state"] for v in (await c.inventory())["vms"]}
            assert st["vm1"] == "running"
            # vm2 has a pending background resume: no new pause until it lands
            with pytest.raises(AgentReplyError) as ei:
                await c.prepare("h2", ["vm2"], 5000)
            assert ei.value.code == "BUSY"
        finally:
            os.kill(pid2, signal.SIGCONT)
        t0 = time.monotonic()
        while {v["name"]: v["state"] for v in (await c.inventory())["vms"]}["vm2"] != "running":
            assert time.monotonic() - t0 < 10
            await asyncio.sleep(0.1)
        # and it can be paused again once resumed
        t0 = time.monotonic()
        while True:
            try:
                await c.prepare("h3", ["vm2"], 5000)
                break
            except AgentReplyError as e:
                assert e.code == "BUSY" and time.monotonic() - t0 < 10
                await asyncio.sleep(0.1)
        assert (await c.abort("h3"))["resumed"] == ["vm2"]


def test_other_client_killed_keeps_our_connection(local_agent: dict[str, Any]) -> None:
    """A client that dies mid-connection (kill -9: a TCP reset) must not
    disturb another client's connection (OpenSSL's per-thread error queue
    once leaked the dead connection's error into the next healthy read)."""
    ours = _raw(local_agent)
    hello = json.dumps({"id": 1, "cmd": "hello"}).encode()
    ours.sendall(struct.pack(">I", len(hello)) + hello)
    assert (_read(ours) or {}).get("ok") is True
    for abortive in (False, True, False):
        victim = _raw(local_agent)
        victim.sendall(struct.pack(">I", len(hello)) + hello)
        assert (_read(victim) or {}).get("ok") is True
        # Gone without a TLS close_notify, as a process killed -9: a plain
        # FIN (OpenSSL: "unexpected eof"), or a reset.
        if abortive:
            victim.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        victim.close()
        time.sleep(0.1)
        ours.sendall(struct.pack(">I", len(hello)) + hello)
        r = _read(ours)
        assert r is not None and r["ok"] is True, "our connection was dropped"


async def test_refused_member_snapshot_is_snapshot_failed(local_agent: dict[str, Any]) -> None:
    """Invariant 3: a member snapshot QEMU refuses (here: the name already
    exists on vm1/disk1) makes commit fail with SNAPSHOT_FAILED, never
    COMMITTED; the VMs are resumed and abort deletes what was made."""
    async with _client(local_agent) as c:
        await c.prepare("dup0", ["vm1"], 5000)
        await c.commit("dup0", {"vm1/disk1": "cp.g.dup"}, 5000)   # the squatter
        await c.prepare("dup1", ["vm1", "vm2"], 5000)
        snaps = {f"{v}/disk{k}": "cp.g.dup" for v in ("vm1", "vm2") for k in range(2)}
        with pytest.raises(AgentReplyError) as ei:
            await c.commit("dup1", snaps, 5000)
        assert ei.value.code == "SNAPSHOT_FAILED", ei.value
        assert "vm1/disk" in str(ei.value)
        done = {d["disk"]: d["ok"] for v in ei.value.result["vms"] for d in v["disks"]}
        assert done == {"vm1/disk0": False, "vm1/disk1": False,
                        "vm2/disk0": True, "vm2/disk1": True}, done
        assert all(v["resumed"] for v in ei.value.result["vms"])
        # a repeated commit gives the same answer (idempotent)
        with pytest.raises(AgentReplyError) as ei:
            await c.commit("dup1", snaps, 5000)
        assert ei.value.code == "SNAPSHOT_FAILED"
        assert {v["name"]: v["state"] for v in (await c.inventory())["vms"]} == \
            {"vm1": "running", "vm2": "running"}
        await c.abort("dup1")
        await c.abort("dup0")
        for v in ("vm1", "vm2"):
            for k in range(2):
                assert await c.snapshot_list(f"{v}/disk{k}") == []


async def test_quiesce_fs_freeze_falls_back_to_crash(local_agent: dict[str, Any]) -> None:
    """quiesce fs-freeze with a guest agent channel nobody answers (vm1: no
    guest OS) and with no channel at all (vm2): both fall back to crash
    consistency with the reason, and the snapshot is still taken.  vm1's
    freeze never got past the sync, so the guest cannot be frozen: there is
    no thaw after cont (none to fail, none to retry)."""
    async with _client(local_agent) as c:
        thaw_failed0 = (await c.stats())["thaw_failed"]
        with pytest.raises(AgentReplyError) as ei:
            await c.call("prepare", {"txn": "qz0", "vms": ["vm1"], "lease_ms": 5000,
                                     "quiesce": "app"})
        assert ei.value.code == "BAD_REQUEST" and "quiesce" in ei.value.message
        prep = await c.call("prepare", {"txn": "qz1", "vms": ["vm1", "vm2"],
                                        "lease_ms": 5000, "quiesce": "fs-freeze"})
        q = {v["vm"]: v for v in prep["vms"]}
        assert q["vm1"]["consistency"] == "crash"
        assert "guest-sync-delimited" in q["vm1"]["freeze_error"]
        assert q["vm1"]["freeze_ms"] >= 999         # waited out the 1 s sync deadline
        assert q["vm2"]["consistency"] == "crash"
        assert "no qga socket" in q["vm2"]["freeze_error"]
        snaps = {f"{v}/disk0": "cp.g.qz1" for v in ("vm1", "vm2")}
        res = await c.commit("qz1", snaps, 5000)
        r = {v["vm"]: v for v in res["vms"]}
        assert r["vm1"]["consistency"] == "crash" and r["vm1"]["freeze_error"]
        assert r["vm1"]["thaw_ms"] is None          # the freeze was never sent
        assert r["vm2"]["thaw_ms"] is None          # nothing to thaw
        assert all(d["ok"] for v in res["vms"] for d in v["disks"])
        assert r["vm1"]["thaw_error"] is None and r["vm2"]["thaw_error"] is None
        assert (await c.stats())["thaw_failed"] == thaw_failed0
        await c.abort("qz1")
        assert (await c.stats())["thaw_failed"] == thaw_failed0
        plain = await c.prepare("qz2", ["vm2"], 5000)
        assert plain["vms"][0]["consistency"] == "crash"
        assert plain["vms"][0]["freeze_error"] is None
        await c.abort("qz2")
        # The same for an abort; and no thaw is left pending that would
        # refuse the next fs-freeze prepare.
        await c.prepare("qz3", ["vm1"], 5000, quiesce="fs-freeze", timeout=10)
        ab = await c.abort("qz3", timeout=10)
        assert [(x["vm"], x["thaw_error"]) for x in ab["timings"]] == [("vm1", None)]
        await c.prepare("qz4", ["vm1"], 5000, quiesce="fs-freeze", timeout=10)
        await c.abort("qz4", timeout=10)
        assert (await c.stats())["thaw_failed"] == thaw_failed0


# vm.start of the qmp driver (agent-protocol §4.9) ----------------------------

@pytest.fixture(scope="module")
def standby_agent() -> Iterator[dict[str, Any]]:
    """An agent whose VMs are not running yet (standbys), each with the
    operator's `start =` command: `sb1` a real QEMU (daemonizing, qcow2
    disk), `bad` a command that fails with a message on stderr, `never` a
    command that exits 0 without starting anything, `plain` none at all."""
    d = Path(tempfile.mkdtemp(prefix="cp-agent-start-"))
    agent = None
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
            f"[agent]\nhost = local\nlisten = 127.0.0.1:{port}\n"
            f"journal = {d / 'journal'}\nqmp_timeout_ms = 1000\n\n"
            f"[tls]\nca = {certs / 'ca.pem'}\ncert = {certs / 'agent.pem'}\n"
            f"key = {certs / 'agent.key'}\n\n"
            f"[vm sb1]\nqmp = {d / 'sb1.sock'}\nstart = {start}\ndisk.disk0 = qcow2:{disk}\n\n"
            f"[vm bad]\nqmp = {d / 'bad.sock'}\nstart = /bin/ls /nonexistent-cp-start\n\n"
            f"[vm never]\nqmp = {d / 'never.sock'}\nstart = /bin/true\n"
            "start_timeout_ms = 700\n\n"
            f"[vm plain]\nqmp = {d / 'plain.sock'}\n")
        agent = _launch_agent(d, cfg, port)
        yield {"address": "127.0.0.1", "port": port, "certs": certs, "dir": d}
    finally:
        sanitizer = _stop_agent(agent, d)
        pidfile = d / "sb1.pid"
        if pidfile.exists():
            import os
            import signal
            try:
                os.kill(int(pidfile.read_text().strip()), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        shutil.rmtree(d, ignore_errors=True)
        assert not sanitizer, sanitizer


def _qemus_on(sock: Path) -> list[int]:
    """Pids of processes whose command line names `sock` (QEMUs of that VM)."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            if str(sock).encode() in (p / "cmdline").read_bytes() and pid_alive(int(p.name)):
                out.append(int(p.name))
        except OSError:
            continue
    return out


async def test_vm_start_runs_only_the_configured_command(standby_agent: dict[str, Any]) -> None:
    a = standby_agent
    sock = a["dir"] / "sb1.sock"
    async with AgentClient(a["address"], a["port"], ssl_context=coordinator_context(a["certs"]),
                           call_timeout=30) as c:
        # Standbys: listed, shutoff, and the agent started fine without them.
        assert {v["name"]: v["state"] for v in (await c.inventory())["vms"]} == {
            "sb1": "shutoff", "bad": "shutoff", "never": "shutoff", "plain": "shutoff"}
        r = await c.call("vm.start", {"spec": {"vm": "sb1"}})
        assert r["vm"] == "sb1" and r["state"] == "running" and r["already_running"] is False
        assert r["start_ms"] >= r["command_ms"] > 0
        pid = int((a["dir"] / "sb1.pid").read_text().strip())
        assert _qemus_on(sock) == [pid]
        assert {v["name"]: v["state"] for v in (await c.inventory())["vms"]}["sb1"] == "running"
        # Again: the VM answers, so nothing runs (never two QEMUs on one disk).
        again = await c.call("vm.start", {"spec": {"vm": "sb1"}})
        assert again["already_running"] is True and again["start_ms"] == 0
        assert _qemus_on(sock) == [pid]
        # The agent drives the VM it started (QMP transaction on qcow2).
        await c.prepare("st1", ["sb1"], 5000)
        res = await c.commit("st1", {"sb1/disk0": "cp.g.st1"}, 5000)
        assert all(d["ok"] for v in res["vms"] for d in v["disks"])
        assert await c.snapshot_list("sb1/disk0") == ["cp.g.st1"]

        async def code_of(spec: Any) -> tuple[str, str]:
            with pytest.raises(AgentReplyError) as ei:
                await c.call("vm.start", {"spec": spec})
            return ei.value.code, ei.value.message

        assert (await code_of({"vm": "nosuch"}))[0] == "UNKNOWN_VM"
        code, message = await code_of({"vm": "plain"})
        assert code == "BAD_REQUEST" and "no start command" in message
        code, message = await code_of({"vm": "bad"})
        assert code == "QMP_ERROR" and "exited with 2" in message, message
        assert "/nonexistent-cp-start" in message      # the command's stderr
        code, message = await code_of({"vm": "never"})
        assert code == "QMP_TIMEOUT" and "did not report running" in message, message
        assert (await code_of({}))[0] == "BAD_REQUEST"
        assert (await code_of({"vm": 7}))[0] == "BAD_REQUEST"
        # A definition from the wire is never started (it could name any
        # disk or device of the host): only the configured VMs are.
        for spec in ({"vm": "sb1", "xml": "<domain/>"}, {"xml": "<domain/>"}):
            code, message = await code_of(spec)
            assert code == "FORBIDDEN" and "configuration" in message, message

        assert (await c.call("vm.stop", {"vm": "sb1"}))["state"] == "shutoff"
        t0 = time.monotonic()
        while pid_alive(pid):
            assert time.monotonic() - t0 < 10, "QEMU did not quit"
            await asyncio.sleep(0.05)
    log = (a["dir"] / "agent.log").read_text()
    assert "event=vm_start vm=sb1 result=started" in log
    assert "event=vm_start vm=sb1 result=already_running" in log


def test_lab_dr_agent_config_lists_standbys(tmp_path: Path) -> None:
    """The lab's DR agent config: one standby per primary RBD VM, its start
    command the standby launcher on a spec file written first; `cutpointd -n`
    accepts it (the start program is executable)."""
    from cutpoint.lab.agents import render_config
    from cutpoint.lab.standby import write_specs

    site = {"ceph_conf": "/x/ceph.conf", "keyring": "/x/k", "client_id": "admin",
            "pool": "rbd", "mon_addr": "10.77.0.2:3300"}
    status: dict[str, Any] = {
        "state_dir": str(tmp_path), "accel": "tcg", "sites": {"primary": site, "dr": site},
        "hosts": [{"name": "primary-h1", "site": "primary", "netns": "primary-h1",
                   "address": "10.77.1.1"},
                  {"name": "dr-h1", "site": "dr", "netns": "dr-h1", "address": "10.77.2.1"}],
        "vms": [{"name": f"primary-h1-vm{i}", "host": "primary-h1", "site": "primary",
                 "index": i, "qmp": f"/x/vm{i}/qmp.sock",
                 "disks": [{"node": "disk0", "backend": "rbd", "pool": "rbd",
                            "image": f"primary-h1-vm{i}-disk0"}]} for i in (1, 2)],
        "image": {"kernel": "/x/vmlinuz", "initrd": "/x/initrd"}}
    certs = tmp_path / "certs"
    subprocess.run([str(CA_SCRIPT), str(certs), "issue", "dr-h1", "agent", "10.77.2.1"], check=True)
    specs = write_specs(status)
    assert [s["name"] for s in specs] == ["primary-h1-vm1", "primary-h1-vm2"]
    assert specs[1]["disks"] == [{"node": "disk0", "backend": "rbd", "pool": "rbd",
                                  "image": "primary-h1-vm2-disk0", "site": "dr"}]
    assert specs[1]["tap"] == "sb2" and specs[1]["netns"] == "dr-h1"
    assert json.loads(Path(specs[0]["spec"]).read_text())["workload"] == "none"
    text = render_config(status, status["hosts"][1], certs, tmp_path / "agent",
                         standby_specs=specs)
    assert "[vm primary-h1-vm2]" in text
    assert f"-m cutpoint.lab.standby start {specs[1]['spec']}" in text
    cfg = tmp_path / "dr.ini"
    cfg.write_text(text)
    chk = subprocess.run([str(cutpointd_path()), "-n", "-c", str(cfg)], capture_output=True,
                         text=True, check=False)
    assert chk.returncode == 0, chk.stderr
    # a start program that cannot run is refused by the check
    cfg.write_text(text.replace("start = /", "start = /nonexistent/", 1))
    chk = subprocess.run([str(cutpointd_path()), "-n", "-c", str(cfg)], capture_output=True,
                         text=True, check=False)
    assert chk.returncode != 0 and "/nonexistent/" in chk.stderr, chk.stderr


# prepare's freeze_timeout_ms (agent-protocol §4.3) ---------------------------

QGA_TRANSCRIPT = (Path(__file__).resolve().parents[2] / "dr-tests" / "tests" / "data"
                  / "qga_transcript.json")


class SlowFreezeGuestAgent(threading.Thread):
    """The guest-agent end of a VM's `qga` socket, replaying the bytes a
    real qemu-guest-agent sent (dr-tests/tests/data/qga_transcript.json,
    "live"): it answers guest-sync-delimited (with the id asked for) and
    guest-fsfreeze-thaw, and never answers guest-fsfreeze-freeze, like a
    guest whose freeze hangs on a busy filesystem -- unless `answer_freeze`
    is set, then it answers that too (the recorded reply: 4 filesystems).
    With `silent` set it answers nothing (a hung guest agent).  The thaw
    tests (test_agent_thaw.py) also set `fail_thaws` (that many thaws get
    qga's error reply before one succeeds) and `freeze_delay` (seconds
    before the freeze answer: a late one); `frozen` is the guest's state."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        live = json.loads(QGA_TRANSCRIPT.read_text())["live"][0]
        got = [b.encode("latin-1") for d, b in live if d == "received"]
        self.sync_reply, self.freeze_reply, self.thaw_reply = got[0], got[1], got[2]
        self.answer_freeze = False
        self.silent = False
        self.fail_thaws = 0
        self.freeze_delay = 0.0
        self.frozen = False
        self.sync_id = json.loads(next(b for d, b in live if d == "sent"))["arguments"]["id"]
        self.commands: list[str] = []
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(str(path))
        self.srv.listen(4)

    def run(self) -> None:
        while True:
            try:
                conn, _ = self.srv.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            buf = b""
            while True:
                try:
                    chunk = conn.recv(4096)
                except OSError:
                    return
                if not chunk:
                    return
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    req = json.loads(line.lstrip(b"\xff"))
                    self.commands.append(req["execute"])
                    if self.silent:
                        continue
                    if req["execute"] == "guest-sync-delimited":
                        conn.sendall(self.sync_reply.replace(
                            str(self.sync_id).encode(), str(req["arguments"]["id"]).encode()))
                    elif req["execute"] == "guest-fsfreeze-thaw" and self.fail_thaws > 0:
                        self.fail_thaws -= 1
                        conn.sendall(b'{"error": {"class": "GenericError", "desc": '
                                     b'"failed to thaw /: Input/output error"}}\n')
                    elif req["execute"] == "guest-fsfreeze-thaw":
                        self.frozen = False
                        conn.sendall(self.thaw_reply)
                    elif req["execute"] == "guest-fsfreeze-freeze" and self.answer_freeze:
                        time.sleep(self.freeze_delay)   # the guest agent is serial
                        self.frozen = True
                        conn.sendall(self.freeze_reply)

    def close(self) -> None:
        self.srv.close()


@pytest.fixture(scope="module")
def slow_freeze_agent() -> Iterator[dict[str, Any]]:
    """One QEMU (no guest OS) whose `qga` is a SlowFreezeGuestAgent, and a
    cutpointd with `[agent] freeze_timeout_ms = 2500`.  A test that restarts
    the agent puts the new process in the yielded "agent"."""
    d = Path(tempfile.mkdtemp(prefix="cpft.", dir="/tmp"))    # short UNIX paths
    qemu = agent = None
    info: dict[str, Any] = {}
    guest = SlowFreezeGuestAgent(d / "vq.qga")
    guest.start()
    try:
        certs = d / "certs"
        subprocess.run([str(CA_SCRIPT), str(certs), "issue", "agent", "agent", "127.0.0.1"], check=True)
        subprocess.run([str(CA_SCRIPT), str(certs), "issue", "coordinator", "coordinator"], check=True)
        f = d / "vq.qcow2"
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(f), "16M"], check=True)
        qemu = subprocess.Popen(["qemu-system-x86_64", "-machine", "accel=tcg", "-nodefaults",
                                 "-display", "none", "-m", "64", "-serial", "null",
                                 "-qmp", f"unix:{d / 'vq.sock'},server=on,wait=off",
                                 "-blockdev", (f"driver=qcow2,node-name=disk0,file.driver=file,"
                                               f"file.filename={f}"),
                                 "-device", "virtio-blk-pci,drive=disk0"])
        t0 = time.monotonic()
        while not (d / "vq.sock").exists():
            assert time.monotonic() - t0 < 20, "QEMU did not create its QMP socket"
            time.sleep(0.05)
        port = _free_port()
        cfg = d / "agent.ini"
        cfg.write_text(f"[agent]\nhost = local\nlisten = 127.0.0.1:{port}\n"
                       f"journal = {d / 'journal'}\nqmp_timeout_ms = 1000\n"
                       f"freeze_timeout_ms = 2500\n\n"
                       f"[tls]\nca = {certs / 'ca.pem'}\ncert = {certs / 'agent.pem'}\n"
                       f"key = {certs / 'agent.key'}\n\n"
                       f"[vm vq]\nqmp = {d / 'vq.sock'}\nqga = {d / 'vq.qga'}\n"
                       f"disk.disk0 = qcow2:{f}\n")
        agent = _launch_agent(d, cfg, port)
        info.update({"address": "127.0.0.1", "port": port, "certs": certs, "dir": d,
                     "guest": guest, "agent": agent, "cfg": cfg, "qemu_pid": qemu.pid})
        yield info
    finally:
        sanitizer = _stop_agent(info.get("agent", agent), d)
        if qemu is not None:
            qemu.kill()
            qemu.wait()
        guest.close()
        shutil.rmtree(d, ignore_errors=True)
        assert not sanitizer, sanitizer


async def test_prepare_freeze_timeout_is_min_of_request_and_config(
        slow_freeze_agent: dict[str, Any]) -> None:
    """The freeze deadline is min(prepare's freeze_timeout_ms, [agent]
    freeze_timeout_ms = 2500): a request for 300 ms gives up after ~300 ms,
    one for 60 s still after 2.5 s, and one without the argument (older
    coordinators) uses the config.  The thaw, answered, reports no error."""
    g: SlowFreezeGuestAgent = slow_freeze_agent["guest"]
    async with _client(slow_freeze_agent) as c:
        with pytest.raises(AgentReplyError) as ei:
            await c.call("prepare", {"txn": "ft0", "vms": ["vq"], "lease_ms": 5000,
                                     "quiesce": "fs-freeze", "freeze_timeout_ms": 0})
        assert ei.value.code == "BAD_REQUEST" and "freeze_timeout_ms" in ei.value.message
        got: dict[str, dict[str, Any]] = {}
        for txn, ft in (("ft1", 300), ("ft2", 60000), ("ft3", None)):
            prep = await c.prepare(txn, ["vq"], 5000, quiesce="fs-freeze",
                                   freeze_timeout_ms=ft, timeout=20)
            got[txn] = prep["vms"][0]
            if txn == "ft1":
                res = await c.commit(txn, {"vq/disk0": f"cp.g.{txn}"}, 5000, timeout=20)
                v = res["vms"][0]
                assert v["thaw_ms"] is not None and v["thaw_error"] is None, v
            await c.abort(txn)
        stats = await c.stats()
    for v in got.values():
        assert v["consistency"] == "crash"
        assert v["freeze_error"].startswith("guest-fsfreeze-freeze"), v
    assert 300 <= got["ft1"]["freeze_ms"] < 2000, got["ft1"]
    assert 2500 <= got["ft2"]["freeze_ms"] < 10000, got["ft2"]
    assert 2500 <= got["ft3"]["freeze_ms"] < 10000, got["ft3"]
    assert g.commands.count("guest-fsfreeze-freeze") == 3
    assert g.commands.count("guest-fsfreeze-thaw") == 3
    assert stats["thaw_failed"] == 0


async def test_agent_killed_while_frozen_thaws_at_restart(
        slow_freeze_agent: dict[str, Any]) -> None:
    """agent-protocol §7: `kill -9` of the agent between the freeze and the
    thaw (prepared with fs-freeze, never committed) leaves the VM paused and
    its guest frozen; the restarted agent resumes it from its journal, then
    thaws the guest.  Also a journal holding only a `frozen` line (killed
    after the cont, before the thaw) is thawed at start."""
    import os
    import signal

    a = slow_freeze_agent
    g: SlowFreezeGuestAgent = a["guest"]
    d: Path = a["dir"]
    journal = d / "journal"
    g.answer_freeze = True
    try:
        async with _client(a) as c:
            prep = await c.prepare("kf1", ["vq"], 60000, quiesce="fs-freeze", timeout=20)
        v = prep["vms"][0]
        assert v["consistency"] == "fs-freeze" and v["freeze_error"] is None, v
        thaws = g.commands.count("guest-fsfreeze-thaw")
        a["agent"].kill()           # SIGKILL: no resume, no thaw on the way out
        a["agent"].wait(timeout=10)
        assert g.commands.count("guest-fsfreeze-thaw") == thaws
        left = journal.read_text()
        a["agent"] = _launch_agent(d, a["cfg"], a["port"])   # recovery runs before listen
        assert g.commands.count("guest-fsfreeze-thaw") == thaws + 1, g.commands[-4:]
        assert left == "cutpoint-journal 2\npaused kf1 vq\nfrozen kf1 vq\n"
        log = (d / "agent.log").read_text()
        resumed = log.index("event=journal_resume txn=kf1 vm=vq result=resumed")
        assert log.index("event=journal_thaw txn=kf1 vm=vq result=ok") > resumed, log
        assert journal.read_text() == ""
        async with _client(a) as c:
            st = {x["name"]: x["state"] for x in (await c.inventory())["vms"]}
            assert st["vq"] == "running"
            assert (await c.stats())["resumed_by_journal"] == 1

        # Killed after the cont, before the thaw: only `frozen` is left.
        stop_agent_pid(a["agent"].pid)
        a["agent"].wait(timeout=10)
        journal.write_text("frozen kf2 vq\n")
        a["agent"] = _launch_agent(d, a["cfg"], a["port"])
        assert g.commands.count("guest-fsfreeze-thaw") == thaws + 2, g.commands[-4:]
        log = (d / "agent.log").read_text()
        assert "event=journal_thaw txn=kf2 vm=vq result=ok" in log, log
        assert "event=journal_resume" not in log, log
        assert journal.read_text() == ""

        # A guest agent that does not answer: the recovery thaw fails, is
        # logged, and its entry kept for the reaper's retries (see
        # test_agent_thaw.py); an old-format `paused` line still resumes;
        # an entry of a VM no longer configured is dropped.
        stop_agent_pid(a["agent"].pid)
        a["agent"].wait(timeout=10)
        g.silent = True
        journal.write_text("paused kf3 vq\nfrozen kf3 vq\nfrozen kf3 ghost\n")
        a["agent"] = _launch_agent(d, a["cfg"], a["port"])
        log = (d / "agent.log").read_text()
        assert "event=journal_resume txn=kf3 vm=vq result=resumed" in log, log
        assert ('event=journal_thaw txn=kf3 vm=vq result=failed entry=kept retry=yes '
                'msg="guest-sync-delimited: guest agent did not answer before the '
                'deadline"') in log, log
        assert "event=journal_thaw txn=kf3 vm=ghost result=unknown_vm" in log, log
        assert journal.read_text() == "cutpoint-journal 2\nfrozen kf3 vq\n"
        async with _client(a) as c:
            assert (await c.stats())["thaw_failed"] >= 1

        # QEMU not answering at start: the cont fails, the thaw waits for
        # the background retry's cont, and the entry stays until then.
        stop_agent_pid(a["agent"].pid)
        a["agent"].wait(timeout=10)
        g.silent = False
        thaws = g.commands.count("guest-fsfreeze-thaw")
        journal.write_text("paused kf4 vq\nfrozen kf4 vq\n")
        os.kill(a["qemu_pid"], signal.SIGSTOP)
        try:
            a["agent"] = _launch_agent(d, a["cfg"], a["port"])
            log = (d / "agent.log").read_text()
            assert "event=journal_resume txn=kf4 vm=vq result=retrying" in log, log
            assert "event=journal_thaw txn=kf4 vm=vq result=deferred" in log, log
            assert journal.read_text() == "paused kf4 vq\nfrozen kf4 vq\n"
            assert g.commands.count("guest-fsfreeze-thaw") == thaws
        finally:
            os.kill(a["qemu_pid"], signal.SIGCONT)
        t0 = time.monotonic()
        while journal.read_text() != "":
            assert time.monotonic() - t0 < 20, (d / "agent.log").read_text()
            await asyncio.sleep(0.1)
        assert g.commands.count("guest-fsfreeze-thaw") == thaws + 1
        log = (d / "agent.log").read_text()
        assert log.index("event=thawed vm=vq txn=kf4") > log.index(
            "event=resumed vm=vq txn=kf4 why=retry"), log
    finally:
        g.answer_freeze = g.silent = False
