"""Integration tests of cutpointd against the lab.

Real QEMU guests in host namespaces, real Ceph (cephx), real agents started
by cutpoint.lab.agents; the coordinator side is cutpoint.agentclient.
Each test starts from running VMs and injects one fault.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import ssl
import struct
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import coordinator_context
from cutpoint.agentclient import AgentClient, AgentReplyError
from cutpoint.lab import agents as A
from cutpoint.lab.ceph import rbd_cmd

pytestmark = [pytest.mark.lab, pytest.mark.lab_config(hosts=1, vms_per_host=2, disks=2, driver="qemu")]

LAB_CONFIG = {"hosts": 1, "vms_per_host": 2, "disks": 2}


def new_txn() -> str:
    return "t" + uuid.uuid4().hex[:12]


def client(rec: dict[str, Any], certs: Path) -> AgentClient:
    return AgentClient(rec["address"], rec["port"], ssl_context=coordinator_context(certs),
                       call_timeout=30)


def vm_names(lab: dict[str, Any]) -> list[str]:
    return [vm["name"] for vm in lab["vms"]]


def rbd_snaps(lab: dict[str, Any], disk: dict[str, Any]) -> list[str]:
    site = lab["sites"][disk.get("site", "primary")]
    out = subprocess.run(rbd_cmd(site, "snap", "ls", "--format", "json",
                                 f"{disk['pool']}/{disk['image']}"),
                         check=True, capture_output=True, text=True).stdout
    return [s["name"] for s in json.loads(out)]


def rbd_ls(lab: dict[str, Any], pool: str = "rbd") -> list[str]:
    """The images of the primary site's pool (`rbd ls`)."""
    out = subprocess.run(rbd_cmd(lab["sites"]["primary"], "ls", "--format", "json", pool),
                         check=True, capture_output=True, text=True).stdout
    return list(json.loads(out))


def qmp_status(sock: str, timeout: float = 5) -> str:
    """query-status over the VM's own QMP socket (only while no agent holds it)."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(timeout)
    s.connect(sock)
    f = s.makefile("rwb")

    def call(cmd: str) -> dict[str, Any]:
        f.write(json.dumps({"execute": cmd}).encode() + b"\n")
        f.flush()
        while True:
            m = json.loads(f.readline())
            if "return" in m or "error" in m:
                return m

    json.loads(f.readline())            # greeting
    call("qmp_capabilities")
    st = call("query-status")["return"]["status"]
    s.close()
    return str(st)


async def states(c: AgentClient) -> dict[str, str]:
    inv = await c.inventory()
    return {vm["name"]: vm["state"] for vm in inv["vms"]}


# 1 -------------------------------------------------------------------------
async def test_prepare_commit_two_vms_two_disks_rbd(lab: dict[str, Any], agents: list[dict],
                                                    certs_dir: Path) -> None:
    txn = new_txn()
    name = f"cp.agenttest.{txn}"
    names = vm_names(lab)
    disks = {f"{vm['name']}/{d['node']}": d for vm in lab["vms"] for d in vm["disks"]}
    assert len(names) == 2 and len(disks) == 4
    async with client(agents[0], certs_dir) as c:
        assert set((await states(c)).values()) == {"running"}
        prep = await c.prepare(txn, names, 5000)
        assert prep["state"] == "prepared"
        assert set((await states(c)).values()) == {"paused"}
        res = await c.commit(txn, {d: name for d in disks}, 5000)
        assert res["state"] == "committed"
        for vm in res["vms"]:
            assert vm["method"] == "rbd"
            assert vm["resumed"] is True
            assert all(d["ok"] for d in vm["disks"])
            for k in ("stop_ms", "barrier_ms", "snapshot_ms", "cont_ms", "paused_ms"):
                assert vm[k] >= 0, k
            # qmp VMs with RBD disks take the redirect cut (agent-protocol
            # §5.1): the snapshots are taken after `cont`, then merged back.
            assert vm["pause_path"] == "redirect", vm
            assert "merge_error" not in vm, vm
            assert vm["merge_ms"] >= 0
        assert {v["pause_path"] for v in prep["vms"]} == {"redirect"}
        assert set((await states(c)).values()) == {"running"}
        for d in disks.values():
            assert name in rbd_snaps(lab, d)
        # the agent lists the same snapshots through librbd
        first = next(iter(disks))
        assert name in await c.snapshot_list(first)
        # idempotent commit: the stored result, no new pause
        assert await c.commit(txn, {d: name for d in disks}, 5000) == res
        # abort of the committed txn deletes its member snapshots
        ab = await c.abort(txn)
        assert sorted(x["disk"] for x in ab["deleted"]) == sorted(disks)
        for d in disks.values():
            assert name not in rbd_snaps(lab, d)


# 2 -------------------------------------------------------------------------
async def test_dropped_connection_lease_resumes(lab: dict[str, Any], agents: list[dict],
                                                certs_dir: Path) -> None:
    txn = new_txn()
    lease_ms = 600
    names = vm_names(lab)
    watcher = client(agents[0], certs_dir)
    await watcher.connect()
    try:
        coord = client(agents[0], certs_dir)
        await coord.connect()
        await coord.prepare(txn, names, lease_ms)
        t_prepared = time.monotonic()
        await coord.close()             # the coordinator vanishes
        assert set((await states(watcher)).values()) == {"paused"}
        while True:
            st = await states(watcher)   # QMP query-status, through the agent
            if set(st.values()) == {"running"}:
                break
            assert (time.monotonic() - t_prepared) * 1000 < lease_ms + 2000, st
            await asyncio.sleep(0.01)
        resumed_after_ms = (time.monotonic() - t_prepared) * 1000
        print(f"resumed {resumed_after_ms:.0f} ms after prepare, lease {lease_ms} ms")
        assert resumed_after_ms <= lease_ms + 100
        with pytest.raises(AgentReplyError) as ei:
            await watcher.commit(txn, {f"{names[0]}/disk0": f"cp.x.{txn}"}, 1000)
        assert ei.value.code == "EXPIRED"
        stats = await watcher.stats()
        assert stats["txns"]["expired"] == 1
        assert stats["resumed_by_lease"] == 2
    finally:
        await watcher.close()


# 3 -------------------------------------------------------------------------
async def test_kill9_while_paused_restart_resumes(lab: dict[str, Any], agents: list[dict],
                                                  certs_dir: Path) -> None:
    txn = new_txn()
    names = vm_names(lab)
    rec = agents[0]
    async with client(rec, certs_dir) as c:
        await c.prepare(txn, names, 600000)
    os.kill(rec["pid"], signal.SIGKILL)
    t0 = time.monotonic()
    while A.pid_alive(rec["pid"]) and time.monotonic() - t0 < 5:
        await asyncio.sleep(0.02)
    # The agent is gone and nothing else will resume them: they stay paused.
    await asyncio.sleep(0.3)
    for vm in lab["vms"]:
        assert qmp_status(vm["qmp"]) == "paused"
    journal = Path(rec["config"]).parent / "journal"
    lines = journal.read_text().splitlines()
    assert lines[0] == "cutpoint-journal 2"
    # paused, and switched onto the overlays of the redirect cut
    assert sorted(line.split()[2] for line in lines[1:] if line.startswith("paused ")) == \
        sorted(names)
    assert sorted(line.split()[2] for line in lines[1:] if line.startswith("redirect ")) == \
        sorted(names)
    overlay_ids = {line.split()[1] for line in lines[1:] if line.startswith("redirect ")}
    host = next(h for h in lab["hosts"] if h["name"] == rec["host"])
    rec2 = A.start_agent(lab, host, certs_dir)
    try:
        async with client(rec2, certs_dir) as c:
            assert set((await states(c)).values()) == {"running"}
            assert (await c.stats())["resumed_by_journal"] == 2
            with pytest.raises(AgentReplyError) as ei:
                await c.commit(txn, {f"{names[0]}/disk0": f"cp.x.{txn}"}, 1000)
            assert ei.value.code == "UNKNOWN_TXN"
        log = Path(rec2["log"]).read_text()
        for n in names:
            assert f"event=journal_resume txn={txn} vm={n} result=resumed" in log
        # The overlays of the cut are merged back in the background after
        # the restart: their entries leave the journal, the overlay images
        # go.  (Then the next cut's overlays are made ahead: new entries.)
        def left() -> list[str]:
            text = journal.read_text()
            return [ln for ln in text.splitlines()[1:]
                    if ln.startswith("paused ") or ln.split()[1] in overlay_ids]

        t0 = time.monotonic()
        while left():
            assert time.monotonic() - t0 < 60, journal.read_text()
            await asyncio.sleep(0.2)
        ahead = [ln for ln in journal.read_text().splitlines()[1:] if ln]
        assert all(ln.startswith("redirect ahead-") for ln in ahead), ahead
        log = Path(rec2["log"]).read_text()
        for n in names:
            # (the first try may merge and then wait for the RBD images,
            # which the agent opens after recovery: a later one finishes)
            # (named by the txn, or by the id of overlays made ahead of it)
            assert re.search(rf"event=redirect_merged txn=\S+ vm={n} why=recovery ", log), n
        # the overlay images the journal named are gone (earlier tests'
        # agents lost theirs with their journal: the fixture deletes it)
        pool_images = rbd_ls(lab)
        assert not [i for i in pool_images
                    if i.rsplit(".cutpoint-ov.", 1)[-1] in overlay_ids], pool_images
    finally:
        A.stop_agent_pid(rec2["pid"])


# 4 -------------------------------------------------------------------------
async def test_hung_qemu_prepare_fails_others_untouched(lab: dict[str, Any],
                                                        agents: list[dict],
                                                        certs_dir: Path) -> None:
    hung, ok = lab["vms"][1], lab["vms"][0]
    qmp_timeout_ms = 2000               # the generated config's default
    async with client(agents[0], certs_dir) as c:
        os.kill(hung["pid"], signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            hung_task = asyncio.create_task(c.prepare(new_txn(), [hung["name"]], 5000))
            await asyncio.sleep(0.1)
            # Meanwhile a whole transaction on the other VM goes through.
            txn = new_txn()
            await c.prepare(txn, [ok["name"]], 5000)
            res = await c.commit(txn, {f"{ok['name']}/disk0": f"cp.agenttest.{txn}"}, 5000)
            assert res["state"] == "committed"
            assert not hung_task.done(), "the hung VM's prepare returned too early"
            with pytest.raises(AgentReplyError) as ei:
                await hung_task
            elapsed_ms = (time.monotonic() - t0) * 1000
            print(f"prepare of the hung VM failed after {elapsed_ms:.0f} ms: {ei.value}")
            assert ei.value.code == "QMP_TIMEOUT"
            assert hung["name"] in str(ei.value) and "stop" in str(ei.value)
            assert elapsed_ms < qmp_timeout_ms + 1000
            st = await states(c)
            assert st[ok["name"]] == "running"
            assert st[hung["name"]] == "unknown"
            await c.abort(txn)
        finally:
            os.kill(hung["pid"], signal.SIGCONT)
        # QEMU wakes, runs the `stop` still queued on its socket; the agent's
        # resume retry brings it back.
        t0 = time.monotonic()
        while (await states(c))[hung["name"]] != "running":
            assert time.monotonic() - t0 < 15, "hung VM not resumed after SIGCONT"
            await asyncio.sleep(0.1)


# 5 -------------------------------------------------------------------------
def _try_hello(addr: str, port: int, ctx: ssl.SSLContext) -> bytes:
    """Handshake and one hello; returns the reply bytes, b'' when refused."""
    raw = socket.create_connection((addr, port), timeout=5)
    try:
        s = ctx.wrap_socket(raw, server_hostname=addr)
        body = json.dumps({"id": 1, "cmd": "hello"}).encode()
        s.sendall(struct.pack(">I", len(body)) + body)
        return s.recv(65536)
    except (ssl.SSLError, ConnectionError, OSError):
        return b""
    finally:
        raw.close()


def test_client_without_valid_certificate_refused(lab: dict[str, Any], agents: list[dict],
                                                  certs_dir: Path, tmp_path: Path) -> None:
    rec = agents[0]
    # a certificate from another CA
    subprocess.run([str(A.CA_SCRIPT), str(tmp_path / "rogue"), "issue", "coordinator", "coordinator"],
                   check=True)
    rogue = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    rogue.load_verify_locations(certs_dir / "ca.pem")
    rogue.load_cert_chain(tmp_path / "rogue" / "coordinator.pem",
                          tmp_path / "rogue" / "coordinator.key")
    assert _try_hello(rec["address"], rec["port"], rogue) == b""
    # no certificate at all
    anon = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    anon.load_verify_locations(certs_dir / "ca.pem")
    assert _try_hello(rec["address"], rec["port"], anon) == b""
    # the valid coordinator certificate gets a reply (the test can fail)
    good = coordinator_context(certs_dir)
    assert len(_try_hello(rec["address"], rec["port"], good)) > 4
    log = Path(rec["log"]).read_text()
    assert log.count("event=tls_refused") >= 2


# budget ---------------------------------------------------------------------
async def test_budget_overrun_still_resumes(lab: dict[str, Any], agents: list[dict],
                                            certs_dir: Path) -> None:
    """A 1 ms budget cannot cover an RBD snapshot: BUDGET_EXCEEDED, VMs run."""
    txn = new_txn()
    name = f"cp.agenttest.{txn}"
    vm = lab["vms"][0]
    disks = {f"{vm['name']}/{d['node']}": d for d in vm["disks"]}
    async with client(agents[0], certs_dir) as c:
        await c.prepare(txn, [vm["name"]], 5000)
        with pytest.raises(AgentReplyError) as ei:
            await c.commit(txn, {d: name for d in disks}, 1)
        assert ei.value.code == "BUDGET_EXCEEDED"
        facts = ei.value.result
        assert facts["vms"][0]["resumed"] is True
        assert (await states(c))[vm["name"]] == "running"
        # the same error again for a repeated commit (idempotent)
        with pytest.raises(AgentReplyError) as ei2:
            await c.commit(txn, {d: name for d in disks}, 1)
        assert ei2.value.code == "BUDGET_EXCEEDED"
        # abort removes the member snapshots that completed late
        await asyncio.sleep(1)
        await c.abort(txn)
        for d in disks.values():
            assert name not in rbd_snaps(lab, d)


# invariant 3 ---------------------------------------------------------------
async def test_snapshot_refused_by_snap_limit_is_snapshot_failed(
        lab: dict[str, Any], agents: list[dict], certs_dir: Path) -> None:
    """One image is at its `rbd snap limit`: commit must answer
    SNAPSHOT_FAILED (cutpointd 0.1.0 answered COMMITTED: librbd returned 0),
    resume both VMs, and abort deletes the member snapshots that were made."""
    txn = new_txn()
    name = f"cp.agenttest.{txn}"
    names = vm_names(lab)
    disks = {f"{vm['name']}/{d['node']}": d for vm in lab["vms"] for d in vm["disks"]}
    bad_id, bad = next(iter(disks.items()))
    site = lab["sites"]["primary"]
    spec = f"{bad['pool']}/{bad['image']}"
    # The limit is enforced by the lock owner (QEMU) from its cached header:
    # set it one above the current count and create one more snapshot, which
    # refreshes QEMU's header; the image is then full (recipe from
    # coordinator/tests/test_coordinator_lab.py).
    count = len(rbd_snaps(lab, bad))
    subprocess.run(rbd_cmd(site, "snap", "limit", "set", "--limit", str(count + 1), spec),
                   check=True)
    try:
        subprocess.run(rbd_cmd(site, "snap", "create", f"{spec}@limit-probe"), check=True)
        probe = subprocess.run(rbd_cmd(site, "snap", "create", f"{spec}@limit-probe2"),
                               capture_output=True, text=True, check=False)
        assert probe.returncode != 0, "the snapshot limit is not enforced"
        async with client(agents[0], certs_dir) as c:
            await c.prepare(txn, names, 5000)
            with pytest.raises(AgentReplyError) as ei:
                await c.commit(txn, {d: name for d in disks}, 5000)
            assert ei.value.code == "SNAPSHOT_FAILED", ei.value
            assert bad_id in str(ei.value)
            assert set((await states(c)).values()) == {"running"}
            assert name not in rbd_snaps(lab, bad)
            await c.abort(txn)
            for d in disks.values():
                assert name not in rbd_snaps(lab, d)
    finally:
        subprocess.run(rbd_cmd(site, "snap", "limit", "clear", spec), check=True)
        subprocess.run(rbd_cmd(site, "snap", "rm", f"{spec}@limit-probe"), check=False)
