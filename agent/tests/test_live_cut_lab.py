"""The live cut (`[agent] pause_path = live`, agent-protocol §5.1, hold.h):
no VM is stopped; each disk switches onto its overlay while the vCPUs run,
and the packets the guest sends are held in QEMU from before its switch
until its resume.  These tests watch that from outside the agent: a pinger
in the guest's host namespace sends an ICMP echo every 20 ms, and the
guest's replies are what the hold holds.

- Commit: the VMs stay `running` in the prepare; no reply arrives between
  the prepare and the commit; the replies to the echoes sent then arrive
  after the commit, none lost; the member snapshots exist.
- Every other end releases the hold too: abort, an expired lease, and a
  restart after kill -9 (the journal's `paused` entry; the filters are
  found by name; while no agent runs the guest's network stays held, and
  its vCPUs run).

Real QEMU guests with RBD disks and a real cutpointd, as test_agent_lab.py
(the same lab, so no extra bring-up).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, agents_with, coordinator_context
from cutpoint.agentclient import AgentClient, AgentReplyError
from cutpoint.lab import agents as A
from cutpoint.lab.ceph import rbd_cmd

pytestmark = [pytest.mark.lab, pytest.mark.lab_config(hosts=1, vms_per_host=2, disks=2,
                                                            driver="qemu")]

LIVE = "\n[agent]\npause_path = live\n"
PINGER = ROOT / "dr-tests" / "bench" / "icmp_pinger.py"
INTERVAL_S = 0.02


def new_txn() -> str:
    return "t" + uuid.uuid4().hex[:12]


def client(rec: dict[str, Any], certs: Path) -> AgentClient:
    return AgentClient(rec["address"], rec["port"], ssl_context=coordinator_context(certs),
                       call_timeout=30)


class Pings:
    """The pinger's replies: (sent_at, received_at) in time.time(), and how
    many echoes got no reply."""

    def __init__(self) -> None:
        self.replies: list[tuple[float, float]] = []
        self.lost = -1


@contextmanager
def pinging(vm: dict[str, Any]) -> Iterator[Pings]:
    """icmp_pinger.py from the VM's host namespace for the block; it waits
    2 s after the block for replies still held."""
    p = subprocess.Popen(["ip", "netns", "exec", vm["host"], "python3", str(PINGER),
                          vm["address"], str(INTERVAL_S)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    out = Pings()
    try:
        yield out
    finally:
        text, _ = p.communicate(timeout=30)     # closes its stdin: it stops
    for line in text.splitlines():
        f = line.split()
        if f[0] == "lost":
            out.lost = int(f[1])
        else:
            out.replies.append((float(f[0]), float(f[2])))


async def answers(vm: dict[str, Any], seconds: float = 1.0) -> int:
    """How many echoes sent in `seconds` the guest answered at once (within
    0.5 s): 0 while its network is held."""
    with pinging(vm) as pings:
        await asyncio.sleep(seconds)
    return sum(1 for s, r in pings.replies if r - s < 0.5)


def qmp(sock: str, cmd: str, **args: Any) -> Any:
    """One QMP command over the VM's own socket (only while no agent holds it)."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    s.connect(sock)
    f = s.makefile("rwb")

    def call(c: str, a: dict[str, Any]) -> Any:
        f.write(json.dumps({"execute": c, "arguments": a}).encode() + b"\n")
        f.flush()
        while True:
            m = json.loads(f.readline())
            if "return" in m:
                return m["return"]
            assert "error" not in m, m

    json.loads(f.readline())
    call("qmp_capabilities", {})
    try:
        return call(cmd, args)
    finally:
        s.close()


async def states(c: AgentClient) -> dict[str, str]:
    return {vm["name"]: vm["state"] for vm in (await c.inventory())["vms"]}


def rbd_snaps(lab: dict[str, Any], disk: dict[str, Any]) -> list[str]:
    out = subprocess.run(rbd_cmd(lab["sites"]["primary"], "snap", "ls", "--format", "json",
                                 f"{disk['pool']}/{disk['image']}"),
                         check=True, capture_output=True, text=True).stdout
    return [s["name"] for s in json.loads(out)]


async def test_live_cut_holds_the_network_not_the_vcpus(lab: dict[str, Any],
                                                        certs_dir: Path) -> None:
    vms = lab["vms"]
    names = [vm["name"] for vm in vms]
    disks = {f"{vm['name']}/{d['node']}": d for vm in vms for d in vm["disks"]}
    txn = new_txn()
    snap = f"cp.live.{txn}"
    with agents_with(lab, certs_dir, LIVE) as recs:
        async with client(recs[0], certs_dir) as c:
            # the first prepare makes each VM's filters; the next one is the
            # steady state
            first = new_txn()
            await c.prepare(first, names, 10000)
            await c.abort(first)
            with pinging(vms[0]) as pings:
                await asyncio.sleep(0.5)
                prep = await c.prepare(txn, names, 10000)
                held_from = time.time()
                assert set((await states(c)).values()) == {"running"}
                await asyncio.sleep(1.0)
                released_at = time.time()
                res = await c.commit(txn, {d: snap for d in disks}, 5000)
                await asyncio.sleep(0.5)
    assert {v["pause_path"] for v in prep["vms"]} == {"live"}, prep["vms"]
    for v in prep["vms"]:
        assert v["switch_ms"] >= 0 and v["hold_on_ms"] >= 0, v
    assert res["state"] == "committed"
    for v in res["vms"]:
        assert v["pause_path"] == "live" and v["resumed"] is True, v
        assert all(d["ok"] for d in v["disks"]), v
        # the guest waited only for its switch; its packets for the commit
        assert v["paused_ms"] < v["held_ms"], v
        assert v["held_ms"] >= 1000, v
    for d in disks.values():
        assert snap in rbd_snaps(lab, d)
    # Held, not dropped: every echo answered; none between the prepare and
    # the commit; the echoes sent then answered after the commit.
    assert pings.lost == 0, pings.lost
    in_hold = [(s, r) for s, r in pings.replies if held_from <= s < released_at]
    assert len(in_hold) >= 0.5 / INTERVAL_S, len(in_hold)
    assert all(r >= released_at for _, r in in_hold), \
        [round(r - released_at, 3) for _, r in in_hold if r < released_at]
    before = [r - s for s, r in pings.replies if r < held_from - 0.2]
    assert before and max(before) < 0.5, before
    print(f"\nlive cut: {len(in_hold)} replies held for {released_at - held_from:.2f} s, "
          f"released by the commit, 0 lost; switch_ms "
          f"{[round(v['paused_ms'], 2) for v in res['vms']]}, held_ms "
          f"{[round(v['held_ms'], 1) for v in res['vms']]}")


async def test_live_cut_released_by_abort_lease_and_restart(lab: dict[str, Any],
                                                           certs_dir: Path) -> None:
    vms = lab["vms"]
    names = [vm["name"] for vm in vms]
    with agents_with(lab, certs_dir, LIVE) as recs:
        rec = recs[0]
        async with client(rec, certs_dir) as c:
            assert await answers(vms[0]) > 10
            # abort
            txn = new_txn()
            await c.prepare(txn, names, 10000)
            assert await answers(vms[0], 0.5) == 0
            await c.abort(txn)
            assert await answers(vms[0]) > 10
            # an expired lease: the reaper releases it
            txn = new_txn()
            await c.prepare(txn, names, 1500)
            await asyncio.sleep(2.5)
            assert await answers(vms[0]) > 10
            with pytest.raises(AgentReplyError) as ei:
                await c.commit(txn, {f"{names[0]}/disk0": f"cp.x.{txn}"}, 1000)
            assert ei.value.code == "EXPIRED"
            # kill -9 while held
            txn = new_txn()
            await c.prepare(txn, names, 600000)
        os.kill(rec["pid"], signal.SIGKILL)
        t0 = time.monotonic()
        while A.pid_alive(rec["pid"]) and time.monotonic() - t0 < 5:
            await asyncio.sleep(0.02)
        # nothing releases it now: the network stays held, the vCPUs run
        for vm in vms:
            assert qmp(vm["qmp"], "query-status")["status"] == "running"
            assert qmp(vm["qmp"], "qom-get", path="/objects/cutpoint-hold-net0",
                       property="status") == "on"
        assert await answers(vms[0], 0.5) == 0
        host = next(h for h in lab["hosts"] if h["name"] == rec["host"])
        rec2 = A.start_agent(lab, host, certs_dir)
        async with client(rec2, certs_dir) as c:
            assert set((await states(c)).values()) == {"running"}
            assert (await c.stats())["resumed_by_journal"] == 2
        for vm in vms:
            assert await answers(vm) > 10, vm["name"]
        log = Path(rec2["log"]).read_text()
        for n in names:
            assert f"event=journal_resume txn={txn} vm={n} result=resumed" in log
