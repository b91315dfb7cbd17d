"""Recovery comes first: a restart after kill -9 resumes the journal's VMs
before it connects to Ceph, and keeps serving while Ceph is unreachable.

Real QEMU guests, real Ceph (its mon and OSD stopped with SIGSTOP while
the agent restarts), a real cutpointd killed with -9 mid-prepare.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import agents_with, coordinator_context
from cutpoint.agentclient import AgentClient, AgentReplyError
from cutpoint.lab import agents as A

pytestmark = [pytest.mark.lab, pytest.mark.lab_config(hosts=1, vms_per_host=2, disks=2, driver="qemu")]

# The bound: the VMs are running within a second of the start.
RECOVERY_BOUND_MS = 1000
# The kill must land while the prepare stops the VMs: on the cut in the
# pause, stops come right after the journal write (on the redirect cut a
# hung QEMU fails the prepare at its overlays, before any stop).
IN_PAUSE = "\n[agent]\npause_path = in_pause\n"


@pytest.fixture
def agents(lab: dict[str, Any], certs_dir: Path) -> Any:
    with agents_with(lab, certs_dir, IN_PAUSE) as recs:
        yield recs


def _client(rec: dict[str, Any], certs: Path) -> AgentClient:
    return AgentClient(rec["address"], rec["port"], ssl_context=coordinator_context(certs),
                       call_timeout=30)


def _ceph_pids(lab: dict[str, Any]) -> list[int]:
    run = Path(lab["sites"]["primary"]["data_dir"]) / "run"
    return [int((run / f"{n}.pid").read_text()) for n in ("mon.a", "osd.0")]


def _ts(line: str) -> float:
    m = re.match(r"ts=(\S+)Z ", line)
    assert m, line
    return dt.datetime.fromisoformat(m.group(1)).replace(tzinfo=dt.UTC).timestamp()


def _qmp_status(sock: str) -> str:
    import json
    import socket
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    s.connect(sock)
    f = s.makefile("rwb")
    f.readline()
    for cmd in ("qmp_capabilities", "query-status"):
        f.write(json.dumps({"execute": cmd}).encode() + b"\n")
        f.flush()
        while True:
            r = json.loads(f.readline())
            if "return" in r or "error" in r:
                break
    s.close()
    return str(r["return"]["status"])


async def test_kill9_mid_prepare_ceph_unreachable_restart_resumes_first(
        lab: dict[str, Any], agents: list[dict], certs_dir: Path) -> None:
    rec = agents[0]
    names = [vm["name"] for vm in lab["vms"]]
    journal = Path(rec["config"]).parent / "journal"
    txn = "t" + os.urandom(6).hex()
    hung = lab["vms"][1]
    async with _client(rec, certs_dir) as c:
        # Mid-prepare: one VM's QEMU is hung, so the prepare has stopped
        # the other and is still waiting for this one's `stop` when killed.
        os.kill(hung["pid"], signal.SIGSTOP)
        try:
            task = asyncio.create_task(c.prepare(txn, names, 600000))
            t0 = time.monotonic()
            while not journal.exists() or not journal.read_bytes():
                assert time.monotonic() - t0 < 10, "prepare never wrote its journal"
                await asyncio.sleep(0.001)
            await asyncio.sleep(0.5)
            assert not task.done()
            os.kill(rec["pid"], signal.SIGKILL)
            with pytest.raises(Exception):
                await task
        finally:
            os.kill(hung["pid"], signal.SIGCONT)
    while A.pid_alive(rec["pid"]):
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.3)
    before = {vm["name"]: _qmp_status(vm["qmp"]) for vm in lab["vms"]}
    print(f"after kill -9 mid-prepare: {before}")
    assert "paused" in before.values(), "the kill came before any stop"

    host = next(h for h in lab["hosts"] if h["name"] == rec["host"])
    ceph = _ceph_pids(lab)
    log = Path(rec["log"])
    log_from = log.stat().st_size
    for pid in ceph:
        os.kill(pid, signal.SIGSTOP)
    rec2 = None
    try:
        t_popen = time.time()
        rec2 = A.start_agent(lab, host, certs_dir, extra=IN_PAUSE)
        text = log.read_text(errors="replace")[log_from:]
        start = next(ln for ln in text.splitlines() if "event=start " in ln)
        resumed = [ln for ln in text.splitlines()
                   if "event=resumed" in ln and "why=journal" in ln]
        # every VM of the journal gets its `cont` (running ones too: harmless)
        assert sorted(re.search(r" vm=(\S+)", ln).group(1) for ln in resumed) == sorted(names)
        last = max(_ts(ln) for ln in resumed)
        from_start_ms = (last - _ts(start)) * 1000
        from_exec_ms = (last - t_popen) * 1000
        print(f"VMs running {from_start_ms:.0f} ms after the agent's start "
              f"({from_exec_ms:.0f} ms after exec), Ceph mon and OSD stopped")
        assert from_start_ms < RECOVERY_BOUND_MS
        assert journal.read_text() == ""
        # It keeps serving while Ceph is unreachable: state reads work, and a
        # prepare of an rbd VM is refused (BUSY), not hung.
        async with _client(rec2, certs_dir) as c:
            inv = await c.inventory()
            assert {v["name"]: v["state"] for v in inv["vms"]} == dict.fromkeys(names,
                                                                            "running")
            with pytest.raises(AgentReplyError) as ei:
                await c.prepare("t" + os.urandom(6).hex(), names[:1], 5000)
            assert ei.value.code == "BUSY"
            await asyncio.sleep(3)
            assert A.pid_alive(rec2["pid"])
            assert (await c.hello())
    finally:
        for pid in ceph:
            os.kill(pid, signal.SIGCONT)
    # Ceph back: bringup finishes on its own and a full snapshot works.
    t0 = time.monotonic()
    while "event=bringup result=done" not in log.read_text(errors="replace")[log_from:]:
        assert time.monotonic() - t0 < 120, "bringup did not finish after SIGCONT"
        await asyncio.sleep(0.2)
    text = log.read_text(errors="replace")[log_from:]
    assert "event=bringup_retry step=ceph" in text or "step=ceph result=ok" in text
    async with _client(rec2, certs_dir) as c:
        t2 = "t" + os.urandom(6).hex()
        await c.prepare(t2, names, 10000)
        res = await c.commit(t2, {f"{names[0]}/disk0": f"cp.rec.{t2}"}, 10000)
        assert res["state"] == "committed"
    A.stop_agent_pid(rec2["pid"])
