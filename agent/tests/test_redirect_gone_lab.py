"""The redirect cut's overlays when a VM's QEMU goes away outside a merge.

After each merge the agent makes the overlays of the VM's next cut ahead
(`<image>.cutpoint-ov.ahead-*`, attached in QEMU, never switched to: they
hold no guest data).  These tests stop or kill a VM's QEMU and look for
leftover overlay images and `redirect` journal entries: vm.stop, kill -9 of
QEMU under a running agent, and an agent restarted with the QEMU gone.  The
last test switches a VM onto its overlays and writes to one before its
QEMU dies: that overlay holds guest writes and must be kept and reported,
never deleted (agent-protocol §5.1, docs/operations.md "An overlay kept").

Real QEMU guests, real Ceph, real cutpointd (agent-lab).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import REDIRECT, coordinator_context
from cutpoint.agentclient import AgentClient, AgentReplyError
from cutpoint.lab import agents as A
from cutpoint.lab.ceph import rbd_cmd
from cutpoint.lab.proc import read_pidfile
from cutpoint.lab.status import write_status

# Raw QEMU: the redirect cut (and these tests' own QMP calls) needs it;
# the same lab as test_agent_lab.py, so no extra bring-up.
pytestmark = [pytest.mark.lab, pytest.mark.lab_config(hosts=1, vms_per_host=2, disks=2, driver="qemu")]

# A killed QEMU's watch on an image blocks its removal until the OSD drops
# it (osd_client_watch_timeout, 30 s); the agent retries every second.
GONE_WITHIN_S = 90


def new_txn() -> str:
    return "t" + uuid.uuid4().hex[:12]


def client(rec: dict[str, Any], certs: Path) -> AgentClient:
    return AgentClient(rec["address"], rec["port"], ssl_context=coordinator_context(certs),
                       call_timeout=60)


def rbd_ls(lab: dict[str, Any], pool: str = "rbd") -> list[str]:
    out = subprocess.run(rbd_cmd(lab["sites"]["primary"], "ls", "--format", "json", pool),
                         check=True, capture_output=True, text=True).stdout
    return list(json.loads(out))


def rbd_rm(lab: dict[str, Any], image: str) -> None:
    subprocess.run(rbd_cmd(lab["sites"]["primary"], "rm", f"rbd/{image}"), check=True,
                   capture_output=True)


def overlays(lab: dict[str, Any], vm: dict[str, Any]) -> list[str]:
    """The overlay images next to vm's disks."""
    bases = {d["image"] for d in vm["disks"]}
    return sorted(i for i in rbd_ls(lab, vm["disks"][0]["pool"])
                  if ".cutpoint-ov." in i and i.split(".cutpoint-ov.")[0] in bases)


def journal_of(rec: dict[str, Any]) -> Path:
    return Path(rec["config"]).parent / "journal"


def redirect_entries(rec: dict[str, Any], vm: str) -> list[str]:
    p = journal_of(rec)
    lines = p.read_text().splitlines() if p.exists() else []
    return [ln for ln in lines if ln.startswith("redirect ") and ln.split()[-1] == vm]


def start_agent(lab: dict[str, Any], certs: Path) -> dict[str, Any]:
    # The agent appends to its log across starts (and a reused lab keeps
    # it): a test reads only what this start wrote (log_of).
    log = A.agents_dir(lab) / lab["hosts"][0]["name"] / "agent.log"
    at = log.stat().st_size if log.exists() else 0
    # primary_start: vm.start can start the lab's VMs again
    rec = A.start_agent(lab, lab["hosts"][0], certs, extra=REDIRECT, primary_start=True)
    rec["log_at"] = at
    return rec


def log_of(rec: dict[str, Any]) -> str:
    """What this agent (since its start) logged."""
    with open(rec["log"], "rb") as f:
        f.seek(rec["log_at"])
        return f.read().decode(errors="replace")


@pytest.fixture
def agent(lab: dict[str, Any], certs_dir: Path) -> Iterator[dict[str, Any]]:
    A.stop_agents(lab)
    for j in A.agents_dir(lab).glob("*/journal"):
        j.unlink()
    # A known start: no overlay left by an earlier test (with its journal
    # gone, no agent would remove it).
    for vm in lab["vms"]:
        for node in ("cpov0", "cpov1", "cpovf0", "cpovf1"):
            qmp(vm["qmp"], "blockdev-del", {"node-name": node})
        for image in overlays(lab, vm):
            rbd_rm(lab, image)
    A.make_certs(certs_dir, lab["hosts"])
    rec = start_agent(lab, certs_dir)
    box = {"rec": rec}
    try:
        yield box
    finally:
        A.stop_agents(lab)


async def until(cond: Any, timeout: float, what: str) -> None:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, f"not within {timeout:.0f} s: {what}"
        await asyncio.sleep(0.5)


async def ready(c: AgentClient, timeout: float = 60) -> None:
    """Until the agent has every VM's disks open (a prepare is BUSY before)."""
    t0 = time.monotonic()
    while not all(v.get("ready") for v in (await c.inventory())["vms"]):
        assert time.monotonic() - t0 < timeout, "agent not ready"
        await asyncio.sleep(0.3)


async def cut_with_ahead(lab: dict[str, Any], c: AgentClient) -> None:
    """One committed group snapshot of every VM, then the next cut's
    overlays made ahead (the state a VM is in between snapshots)."""
    await ready(c)
    txn = new_txn()
    names = [v["name"] for v in lab["vms"]]
    await c.prepare(txn, names, 10000)
    res = await c.commit(txn, {f"{v['name']}/{d['node']}": f"cp.gone.{txn}"
                               for v in lab["vms"] for d in v["disks"]}, 10000)
    assert res["state"] == "committed"
    assert {v["pause_path"] for v in res["vms"]} == {"redirect"}, res
    vm = lab["vms"][0]
    await until(lambda: len(overlays(lab, vm)) == len(vm["disks"]), 20,
                "overlays made ahead")
    assert all(".cutpoint-ov.ahead-" in i for i in overlays(lab, vm))
    await c.abort(txn)          # its member snapshots go; the overlays stay


def kill_qemu(vm: dict[str, Any]) -> None:
    os.kill(vm["pid"], signal.SIGKILL)
    t0 = time.monotonic()
    while A.pid_alive(vm["pid"]) and time.monotonic() - t0 < 10:
        time.sleep(0.05)


async def start_vm_again(lab: dict[str, Any], c: AgentClient, vm: dict[str, Any]) -> None:
    """vm.start through the agent; the lab's status follows the new pid, so
    that the next test reuses the lab and `cutpoint-lab down` stops it."""
    r = await c.call("vm.start", {"spec": {"vm": vm["name"]}}, timeout=120)
    assert r["state"] == "running", r
    vm["pid"] = read_pidfile(Path(vm["pidfile"]))
    write_status(lab)


# 1 -------------------------------------------------------------------------
async def test_vm_stop_removes_overlays_made_ahead(lab: dict[str, Any], agent: dict[str, Any],
                                                   certs_dir: Path) -> None:
    rec, vm = agent["rec"], lab["vms"][0]
    async with client(rec, certs_dir) as c:
        await cut_with_ahead(lab, c)
        try:
            r = await c.call("vm.stop", {"vm": vm["name"]}, timeout=60)
            assert r["state"] == "shutoff"
            # at the reply: removed while QEMU still ran, entry gone
            assert overlays(lab, vm) == []
            assert redirect_entries(rec, vm["name"]) == []
            log = log_of(rec)
            assert re.search(rf"event=redirect_merged txn=ahead-\S+ vm={vm['name']} "
                             r"why=vm_stop ", log), log[-2000:]
        finally:
            await start_vm_again(lab, c, vm)


# 2 -------------------------------------------------------------------------
async def test_qemu_killed_overlays_removed(lab: dict[str, Any], agent: dict[str, Any],
                                            certs_dir: Path) -> None:
    rec, vm = agent["rec"], lab["vms"][0]
    async with client(rec, certs_dir) as c:
        await cut_with_ahead(lab, c)
        try:
            kill_qemu(vm)
            t0 = time.monotonic()
            await until(lambda: overlays(lab, vm) == [] and
                        redirect_entries(rec, vm["name"]) == [], GONE_WITHIN_S,
                        "overlays of the killed VM removed")
            print(f"overlays of the killed VM gone after {time.monotonic() - t0:.1f} s")
            log = log_of(rec)
            assert f"event=redirect_vm_gone vm={vm['name']}" in log
            assert re.search(rf"event=redirect_merged txn=ahead-\S+ vm={vm['name']} "
                             r"why=vm_gone .*qemu=gone", log), log[-2000:]
            # the other VM keeps its overlays made ahead
            assert len(overlays(lab, lab["vms"][1])) == len(lab["vms"][1]["disks"])
        finally:
            await start_vm_again(lab, c, vm)


# 3 -------------------------------------------------------------------------
async def test_agent_restart_with_qemu_gone(lab: dict[str, Any], agent: dict[str, Any],
                                            certs_dir: Path) -> None:
    rec, vm = agent["rec"], lab["vms"][0]
    async with client(rec, certs_dir) as c:
        await cut_with_ahead(lab, c)
    os.kill(rec["pid"], signal.SIGKILL)
    kill_qemu(vm)
    assert len(redirect_entries(rec, vm["name"])) == 1
    rec2 = agent["rec"] = start_agent(lab, certs_dir)
    async with client(rec2, certs_dir) as c:
        try:
            await until(lambda: overlays(lab, vm) == [] and
                        redirect_entries(rec2, vm["name"]) == [], GONE_WITHIN_S, "overlays of the VM whose QEMU is gone removed")
            log = log_of(rec2)
            assert re.search(rf"event=redirect_merged txn=ahead-\S+ vm={vm['name']} "
                             r"why=recovery .*qemu=gone", log), log[-2000:]
        finally:
            await start_vm_again(lab, c, vm)


# 4 -------------------------------------------------------------------------
async def test_agent_stop_removes_overlays_made_ahead(lab: dict[str, Any],
                                                      agent: dict[str, Any],
                                                      certs_dir: Path) -> None:
    """An agent stopped for good (a drill's agent, a host taken out) leaves
    no overlay behind: its VMs keep running on their disks."""
    rec = agent["rec"]
    async with client(rec, certs_dir) as c:
        await cut_with_ahead(lab, c)
    A.stop_agent_pid(rec["pid"])            # SIGTERM
    for vm in lab["vms"]:
        assert overlays(lab, vm) == [], vm["name"]
        assert redirect_entries(rec, vm["name"]) == []
    log = log_of(rec)
    assert re.search(r"event=redirect_merged txn=ahead-\S+ vm=\S+ why=agent_stop ", log), \
        log[-2000:]


# 5 -------------------------------------------------------------------------
def qmp(sock: str, cmd: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    """One QMP command over the VM's own socket (while no agent holds it)."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(sock)
    f = s.makefile("rwb")

    def call(cmd: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
        f.write(json.dumps({"execute": cmd, "arguments": args or {}}).encode() + b"\n")
        f.flush()
        while True:
            m = json.loads(f.readline())
            if "return" in m or "error" in m:
                return dict(m)

    json.loads(f.readline())
    call("qmp_capabilities")
    r = call(cmd, args)
    s.close()
    return r


def hmp(sock: str, line: str) -> str:
    """One HMP command over the VM's QMP socket (no agent holds it)."""
    r = qmp(sock, "human-monitor-command", {"command-line": line})
    assert "return" in r, r
    return str(r["return"])


async def refused(c: AgentClient, vm: str, timeout: float = 30) -> str:
    """Why a prepare of vm is BUSY.  The resume that the restarted agent
    owes the VM (its journal says paused; QEMU was gone) is retried by the
    reaper until the VM runs again: BUSY for that is waited out."""
    t0 = time.monotonic()
    while True:
        txn = new_txn()
        try:
            await c.prepare(txn, [vm], 5000)
        except AgentReplyError as e:
            assert e.code == "BUSY", e
            if "pending resume" not in str(e):
                return str(e)
            assert time.monotonic() - t0 < timeout, e
            await asyncio.sleep(0.5)
            continue
        await c.abort(txn)
        raise AssertionError(f"prepare of {vm} was not refused")


def rbd_file(lab: dict[str, Any], pool: str, image: str) -> str:
    """QEMU's rbd: filename of pool/image at the primary site."""
    site = lab["sites"]["primary"]
    return (f"rbd:{pool}/{image}:id={site.get('client_id', 'admin')}:"
            f"conf={site['ceph_conf']}:keyring={site['keyring']}")


def merge_by_hand(lab: dict[str, Any], disk: dict[str, Any], overlay: str) -> None:
    """operations.md "An overlay kept": name the base as the overlay's
    backing file (unsafe rebase: header only), then commit it down."""
    ov = rbd_file(lab, disk["pool"], overlay)
    base = rbd_file(lab, disk["pool"], disk["image"])
    subprocess.run(["qemu-img", "rebase", "-u", "-f", "qcow2", "-b", base, "-F", "raw", ov],
                   check=True, capture_output=True, text=True)
    subprocess.run(["qemu-img", "commit", "-f", "qcow2", ov], check=True,
                   capture_output=True, text=True)


def base_reads(lab: dict[str, Any], disk: dict[str, Any], pattern: int) -> bool:
    r = subprocess.run(["qemu-io", "-r", "-f", "raw", rbd_file(lab, disk["pool"], disk["image"]),
                        "-c", f"read -P {pattern:#x} 0 64k"], check=False,
                       capture_output=True, text=True)
    return r.returncode == 0 and "Pattern verification failed" not in r.stdout


def overlay_reads(lab: dict[str, Any], image: str, pattern: int) -> bool:
    """The overlay image, exported, reads `pattern` in its first 64 KiB."""
    site = lab["sites"]["primary"]
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "ov.qcow2"
        subprocess.run(rbd_cmd(site, "export", f"rbd/{image}", str(out)), check=True,
                       capture_output=True)
        r = subprocess.run(["qemu-io", "-r", "-f", "qcow2", str(out), "-c",
                            f"read -P {pattern:#x} 0 64k"], check=False, capture_output=True,
                           text=True)
        return r.returncode == 0 and "Pattern verification failed" not in r.stdout


async def test_switched_overlay_with_writes_is_kept(lab: dict[str, Any], agent: dict[str, Any],
                                                    certs_dir: Path) -> None:
    """A VM on its overlays, guest data written to one, then its QEMU and
    its agent die.  The restarted agent finds QEMU gone: the overlay with
    the writes is kept and reported, the empty one removed.  The VM is
    started again on its bases: a QEMU that does not hold the overlay,
    which still stays, and the VM takes no new cut until an operator
    settles it."""
    rec, vm = agent["rec"], lab["vms"][0]
    txn = new_txn()
    async with client(rec, certs_dir) as c:
        await ready(c)
        prep = await c.prepare(txn, [vm["name"]], 600000)
        assert [v["pause_path"] for v in prep["vms"]] == ["redirect"], prep
    # The agent dies with the VM paused on its overlays (the journal keeps
    # both facts); the guest's write lands in disk0's overlay.
    os.kill(rec["pid"], signal.SIGKILL)
    await asyncio.sleep(0.3)
    dev = "/machine/peripheral/vd0/virtio-backend"
    out = hmp(vm["qmp"], f'qemu-io -d {dev} "write -P 0x5a 0 64k"')
    # and flushed, as a guest's acknowledged write is (QEMU's qcow2 and
    # librbd caches would lose it to the kill otherwise)
    out += hmp(vm["qmp"], f'qemu-io -d {dev} "flush"')
    # (HMP's qemu-io prints its result on QEMU's stdout, not the monitor:
    # only an error comes back; the write is read back from the image below)
    assert "rror" not in out, out
    kill_qemu(vm)
    ovs = overlays(lab, vm)
    assert len(ovs) == 2, ovs
    written = next(i for i in ovs if i.startswith(vm["disks"][0]["image"] + "."))
    assert overlay_reads(lab, written, 0x5A)
    rec2 = agent["rec"] = start_agent(lab, certs_dir)
    async with client(rec2, certs_dir) as c:
        try:
            # the agent's recovery resumes nothing (QEMU gone) and looks at
            # the overlays: the one with writes stays, the empty one goes
            await until(lambda: f"event=redirect_overlay_kept vm={vm['name']} disk="
                        f"{vm['disks'][0]['node']}" in log_of(rec2),
                        GONE_WITHIN_S, "the written overlay reported kept")
            await until(lambda: overlays(lab, vm) == [written], GONE_WITHIN_S,
                        "the empty overlay removed, the written one kept")
            assert overlay_reads(lab, written, 0x5A)
            assert len(redirect_entries(rec2, vm["name"])) == 1
            await start_vm_again(lab, c, vm)
            await ready(c)
            # a QEMU that does not hold it: still kept, and no new cut
            assert "holds guest writes" in await refused(c, vm["name"])
            # looked at again with the QEMU that runs now (the code before
            # this test deleted it then: it saw no overlay node in QEMU)
            await asyncio.sleep(3)
            assert "holds guest writes" in await refused(c, vm["name"])
            assert overlays(lab, vm) == [written]
            log = log_of(rec2)
            assert f"image=rbd/{written}" in log
            # The operator settles it as operations.md says ("An overlay
            # kept"): stop the VM, merge the overlay into its base with
            # qemu-img, remove it, start the VM.
            assert (await c.call("vm.stop", {"vm": vm["name"]}, timeout=60))["state"] == \
                "shutoff"
            assert overlays(lab, vm) == [written]       # vm.stop kept it too
            merge_by_hand(lab, vm["disks"][0], written)
            assert base_reads(lab, vm["disks"][0], 0x5A)
            rbd_rm(lab, written)
            await start_vm_again(lab, c, vm)
            await ready(c)
            t0 = time.monotonic()
            while True:
                t2 = new_txn()
                try:
                    p = await c.prepare(t2, [vm["name"]], 5000)
                    break
                except AgentReplyError as e:
                    assert e.code == "BUSY" and time.monotonic() - t0 < 30, e
                    await asyncio.sleep(0.5)
            assert p["state"] == "prepared"
            await c.abort(t2)
        finally:
            if not A.pid_alive(read_pidfile(Path(vm["pidfile"])) or 0):
                await start_vm_again(lab, c, vm)
