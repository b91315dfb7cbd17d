"""The pause of the QMP-transaction method on RBD disks is bounded when
Ceph hangs (agent-protocol §6, "Pause bound").

QEMU runs `blockdev-snapshot-internal-sync` in its main loop, the loop that
also serves `cont`; on an rbd node it waits there for Ceph as long as its
own Ceph client does.  So the bound of that pause is QEMU's
`rados_osd_op_timeout` / `rados_mon_op_timeout` (the lab's
`qemu_op_timeout_s`, written into the conf QEMU opens its disks with), and
the agent refuses the method when QEMU has none.

Real QEMU guests on real Ceph; the site's OSD or mon stopped with SIGSTOP
just before the commit, a real cutpointd with `method = qmp`.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import select
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import coordinator_context
from cutpoint.agentclient import AgentClient, AgentReplyError
from cutpoint.lab import agents as A
from cutpoint.lab import ceph as labceph

QEMU_OP_TIMEOUT_S = 5
LEASE_MS = 10000
BUDGET_MS = 1000
# Stated margin past lease + budget: QEMU's own wait for Ceph (the op
# timeout), one period of the agent's resume retry (500 ms), and 1 s for a
# loaded 2-core TCG host.
MARGIN_MS = QEMU_OP_TIMEOUT_S * 1000 + 500 + 1000

pytestmark = [pytest.mark.lab]


def _client(rec: dict[str, Any], certs: Path) -> AgentClient:
    return AgentClient(rec["address"], rec["port"], ssl_context=coordinator_context(certs),
                       call_timeout=60)


def _ceph_pid(lab: dict[str, Any], daemon: str) -> int:
    run = Path(lab["sites"]["primary"]["data_dir"]) / "run"
    return int((run / f"{daemon}.pid").read_text())


def _snaps(lab: dict[str, Any], vm: dict[str, Any]) -> dict[str, list[str]]:
    site = lab["sites"]["primary"]
    out = {}
    for d in vm["disks"]:
        r = subprocess.run(labceph.rbd_cmd(site, "snap", "ls", "--format", "json",
                                           f"{d['pool']}/{d['image']}"),
                           capture_output=True, text=True, timeout=120, check=True)
        out[d["node"]] = [s["name"] for s in json.loads(r.stdout)]
    return out


def _start(lab: dict[str, Any], certs: Path, method: str = "qmp") -> dict[str, Any]:
    A.stop_agents(lab)
    for j in A.agents_dir(lab).glob("*/journal"):
        j.unlink()
    A.make_certs(certs, lab["hosts"])
    host = next(h for h in lab["hosts"] if h["site"] == "primary")
    log = A.agents_dir(lab) / host["name"] / "agent.log"
    log_from = log.stat().st_size if log.exists() else 0
    rec = A.start_agent(lab, host, certs, method=method, standby=False)
    rec["log_from"] = log_from
    # Its images are opened in the background after the start (§7): a
    # prepare before that is BUSY.
    t0 = time.monotonic()
    while "event=bringup result=done" not in log.read_text(errors="replace")[log_from:]:
        assert time.monotonic() - t0 < 60, "the agent's bringup did not finish"
        time.sleep(0.1)
    return rec


@pytest.mark.lab_config(hosts=1, vms_per_host=1, disks=2, driver="qemu", qemu_op_timeout_s=0)
async def test_qmp_method_refused_when_qemu_ceph_client_never_gives_up(
        lab: dict[str, Any], certs_dir: Path) -> None:
    """QEMU's conf has no op timeouts: prepare refuses the VM, nothing paused."""
    vm = lab["vms"][0]
    rec = _start(lab, certs_dir)
    try:
        async with _client(rec, certs_dir) as c:
            with pytest.raises(AgentReplyError) as ei:
                await c.prepare("t" + os.urandom(6).hex(), [vm["name"]], LEASE_MS)
            print(f"refused: {ei.value.code}: {ei.value.message}")
            assert ei.value.code == "SNAPSHOT_FAILED"
            assert "no VM paused" in ei.value.message
            assert "rados_osd_op_timeout=0" in ei.value.message
            assert "method = rbd" in ei.value.message
            inv = await c.inventory()
            assert {v["name"]: v["state"] for v in inv["vms"]}[vm["name"]] == "running"
        journal = Path(rec["config"]).with_name("journal")
        assert not journal.exists() or journal.read_text() == ""
    finally:
        A.stop_agents(lab)


class _Qmp:
    """A bare QMP connection whose reads have a deadline (select), so that
    a monitor that does not answer is seen as such."""

    def __init__(self, path: str) -> None:
        self.s = socket.socket(socket.AF_UNIX)
        self.s.connect(path)
        self.buf = b""
        self.line(10)                               # greeting
        self.send("qmp_capabilities")
        self.reply(10)

    def send(self, cmd: str, args: dict[str, Any] | None = None) -> None:
        msg: dict[str, Any] = {"execute": cmd}
        if args is not None:
            msg["arguments"] = args
        self.s.sendall(json.dumps(msg).encode() + b"\n")

    def line(self, timeout: float) -> dict[str, Any] | None:
        end = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = end - time.monotonic()
            if left <= 0 or not select.select([self.s], [], [], left)[0]:
                return None
            chunk = self.s.recv(65536)
            assert chunk, "QEMU closed the monitor"
            self.buf += chunk
        ln, self.buf = self.buf.split(b"\n", 1)
        return dict(json.loads(ln))

    def reply(self, timeout: float) -> dict[str, Any] | None:
        """The next reply (events skipped), or None at the deadline."""
        end = time.monotonic() + timeout
        while True:
            r = self.line(max(0.0, end - time.monotonic()))
            if r is None or "return" in r or "error" in r:
                return r

    def close(self) -> None:
        self.s.close()


@pytest.mark.lab_config(hosts=1, vms_per_host=1, disks=2, driver="qemu", qemu_op_timeout_s=0)
def test_without_qemu_op_timeout_the_pause_lasts_as_long_as_ceph_hangs(
        lab: dict[str, Any]) -> None:
    """Negative control, QEMU alone (no agent): what the refusal above
    prevents.  With the OSD stopped, a QMP internal snapshot of an rbd node
    holds QEMU's main loop, and `cont` is not even read, until the OSD
    comes back."""
    A.stop_agents(lab)
    vm = lab["vms"][0]
    snap = "cp.h3.control." + os.urandom(4).hex()
    pid = _ceph_pid(lab, "osd.0")
    hold_s = 8.0
    q = _Qmp(vm["qmp"])
    try:
        q.send("stop")
        assert "return" in (q.reply(10) or {})
        os.kill(pid, signal.SIGSTOP)
        try:
            q.send("transaction", {"actions": [
                {"type": "blockdev-snapshot-internal-sync",
                 "data": {"device": d["node"], "name": snap}} for d in vm["disks"]]})
            q.send("cont")
            # no answer to either while the OSD is stopped: the main loop
            # is held by the snapshot, and `cont` waits behind it
            assert q.reply(hold_s) is None
        finally:
            t_cont = time.monotonic()
            os.kill(pid, signal.SIGCONT)
        tx = q.reply(120) or {}
        cont = q.reply(10) or {}
        waited = time.monotonic() - t_cont
        print(f"OSD stopped {hold_s:.0f} s: QEMU answered the transaction "
              f"({'ok' if 'return' in tx else tx.get('error')}) and cont "
              f"{waited * 1000:.0f} ms after SIGCONT")
        assert "return" in cont
        q.send("query-status")
        assert (q.reply(10) or {})["return"]["status"] == "running"
        for d in vm["disks"]:
            q.send("blockdev-snapshot-delete-internal-sync",
                   {"device": d["node"], "name": snap})
            q.reply(60)
    finally:
        q.close()


@pytest.mark.lab_config(hosts=1, vms_per_host=1, disks=2, driver="qemu", qemu_op_timeout_s=QEMU_OP_TIMEOUT_S)
@pytest.mark.parametrize("daemon", ["osd.0", "mon.a"])
async def test_ceph_hung_mid_commit_pause_is_bounded(lab: dict[str, Any], certs_dir: Path,
                                                      daemon: str) -> None:
    vm = lab["vms"][0]
    name = vm["name"]
    txn = "t" + os.urandom(6).hex()
    snap = f"cp.h3.{txn}"
    disks = {f"{name}/{d['node']}": snap for d in vm["disks"]}
    rec = _start(lab, certs_dir)
    log = Path(rec["log"])
    pid = _ceph_pid(lab, daemon)
    try:
        async with _client(rec, certs_dir) as c:
            prep = await c.prepare(txn, [name], LEASE_MS)
            overrun = prep["vms"][0]["overrun_ms"]
            # QEMU's client: 5 s per request to the OSD and to the mon, per disk
            assert overrun == 2 * 2 * QEMU_OP_TIMEOUT_S * 1000, prep
            os.kill(pid, signal.SIGSTOP)
            try:
                t0 = time.monotonic()
                with pytest.raises(AgentReplyError) as ei:
                    await c.commit(txn, disks, BUDGET_MS)
                reply_s = time.monotonic() - t0
                err = ei.value
                print(f"{daemon} stopped: commit replied {err.code} after {reply_s:.2f} s: "
                      f"{err.message}")
                assert err.code == "BUDGET_EXCEEDED"
                assert "transaction" in err.message and "storage" in err.message
                assert err.result["vms"][0]["resumed"] is False
                # The VM runs again once QEMU's Ceph client gives up, with
                # the daemon still stopped.
                pat = re.compile(rf"event=resumed vm={re.escape(name)} txn={txn} .*"
                                 r"paused_ms=([0-9.]+)")
                deadline = t0 + (LEASE_MS + BUDGET_MS + MARGIN_MS) / 1000 + 5
                m = None
                while m is None and time.monotonic() < deadline:
                    m = pat.search(log.read_text(errors="replace")[rec["log_from"]:])
                    await asyncio.sleep(0.1)
                assert m, f"{name} not resumed {deadline - t0:.0f} s after the commit"
                paused_ms = float(m.group(1))
                running_s = time.monotonic() - t0
                print(f"{daemon} stopped: {name} running again, paused {paused_ms:.0f} ms "
                      f"(bound: lease {LEASE_MS} + budget {BUDGET_MS} + margin {MARGIN_MS}); "
                      f"seen {running_s:.2f} s after the commit was sent")
                assert paused_ms <= LEASE_MS + BUDGET_MS + MARGIN_MS
                inv = await c.inventory()
                assert {v["name"]: v["state"] for v in inv["vms"]}[name] == "running"
            finally:
                os.kill(pid, signal.SIGCONT)
            # The coordinator aborts the failed commit: nothing of txn stays,
            # not even a snapshot the OSD completes when it wakes up.
            res = await c.abort(txn, disks)
            assert res["state"] == "aborted", res
        left = {node: [s for s in names if s == snap] for node, names in _snaps(lab, vm).items()}
        assert left == {d["node"]: [] for d in vm["disks"]}, left
        text = log.read_text(errors="replace")[rec["log_from"]:]
        assert f"event=pause_bound vm={name} method=qmp-transaction bound_ms={overrun}" in text
    finally:
        A.stop_agents(lab)


@pytest.mark.lab_config(hosts=1, vms_per_host=1, disks=2, driver="qemu", qemu_op_timeout_s=QEMU_OP_TIMEOUT_S)
async def test_ceph_hung_mid_commit_rbd_method_resumes_at_the_budget(
        lab: dict[str, Any], certs_dir: Path) -> None:
    """The comparison: method rbd snapshots from the agent's own librbd, so
    QEMU's main loop stays free and the VM is resumed at the budget deadline
    whatever Ceph does.  (Its late create tags itself and is swept if the
    abort comes first: agent-protocol §6, Ownership.)"""
    vm = lab["vms"][0]
    name = vm["name"]
    txn = "t" + os.urandom(6).hex()
    disks = {f"{name}/{d['node']}": f"cp.h3.{txn}" for d in vm["disks"]}
    rec = _start(lab, certs_dir, method="rbd")
    pid = _ceph_pid(lab, "osd.0")
    try:
        async with _client(rec, certs_dir) as c:
            prep = await c.prepare(txn, [name], LEASE_MS)
            assert prep["vms"][0]["overrun_ms"] == 0, prep
            os.kill(pid, signal.SIGSTOP)
            try:
                t0 = time.monotonic()
                with pytest.raises(AgentReplyError) as ei:
                    await c.commit(txn, disks, BUDGET_MS)
                reply_s = time.monotonic() - t0
                v = ei.value.result["vms"][0]
                print(f"osd.0 stopped, method rbd: commit replied {ei.value.code} after "
                      f"{reply_s:.2f} s, resumed {v['resumed']}, paused {v['paused_ms']:.0f} ms")
                assert ei.value.code == "BUDGET_EXCEEDED"
                assert v["resumed"] is True
                # 1 s for a loaded TCG host: the cont itself is milliseconds
                assert v["paused_ms"] <= LEASE_MS + BUDGET_MS + 1000
            finally:
                os.kill(pid, signal.SIGCONT)
            assert (await c.abort(txn, disks))["state"] == "aborted"
    finally:
        A.stop_agents(lab)


@pytest.mark.lab_config(hosts=1, vms_per_host=1, disks=2, driver="qemu", paxos="default",
                        qemu_op_timeout_s=QEMU_OP_TIMEOUT_S)
async def test_qmp_snapshot_that_outlives_the_budget_is_deleted_by_abort(
        lab: dict[str, Any], certs_dir: Path) -> None:
    """A slow Ceph, not a hung one: with the mon's default Paxos interval an
    RBD snapshot takes about 1 s, so a 100 ms budget ends while QEMU's
    transaction still runs, and it completes later.  The abort that
    follows must delete what it made (agent-protocol §6: qmp-transaction
    snapshots carry no owner key, so it deletes them by name)."""
    vm = lab["vms"][0]
    name = vm["name"]
    txn = "t" + os.urandom(6).hex()
    snap = f"cp.h3.{txn}"
    disks = {f"{name}/{d['node']}": snap for d in vm["disks"]}
    rec = _start(lab, certs_dir)
    try:
        async with _client(rec, certs_dir) as c:
            await c.prepare(txn, [name], LEASE_MS)
            with pytest.raises(AgentReplyError) as ei:
                await c.commit(txn, disks, 100)
            assert ei.value.code == "BUDGET_EXCEEDED"
            # QEMU answers the `cont` queued behind its transaction once the
            # snapshot is done: then both snapshots exist.
            t0 = time.monotonic()
            while {v["name"]: v["state"] for v in (await c.inventory())["vms"]}[name] != "running":
                assert time.monotonic() - t0 < 30
                await asyncio.sleep(0.2)
            late = {node: snap in names for node, names in _snaps(lab, vm).items()}
            res = await c.abort(txn)
            print(f"slow Ceph, budget 100 ms: late snapshots {late}; abort deleted "
                  f"{res['deleted']}, not deleted {res['not_deleted']}")
            assert res["not_deleted"] == [], res
        left = {node: [s for s in names if s == snap] for node, names in _snaps(lab, vm).items()}
        assert left == {d["node"]: [] for d in vm["disks"]}, left
    finally:
        A.stop_agents(lab)
