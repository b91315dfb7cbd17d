"""A prepare that cuts a VM in the pause where the redirect cut would
wait (agent-protocol §5.1, redirect.h): its next overlays are still being
made, or none were made ahead and more VMs than `redirect_inline_max`
would make theirs inside the prepare.

After an abort the agent merges the VMs' overlays back and at once starts
making the next cut's overlays in the background; a prepare right behind
the abort finds them being made.  It waits for them as long as the VM's
RBD snapshots take (at least 100 ms), and no longer than a quarter of a
short lease: the VM is then cut inside the pause, and the reply says why.  Its stop must wait for QEMU's blockdev-create
jobs, because QEMU 7.2 aborts on a `stop` during one (block-backend.c
blk_unref assertion); and no job may start while the txn holds the VM
paused.  Every QEMU must outlive every round, and the overlays made beside
the cut must serve the next one.

Real QEMU guests with RBD disks and a real cutpointd, as test_agent_lab.py.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import agents_with, coordinator_context
from cutpoint.agentclient import AgentClient, AgentReplyError
from cutpoint.lab.ceph import rbd_cmd

# the same lab as test_agent_lab.py, so no extra bring-up.
pytestmark = [pytest.mark.lab, pytest.mark.lab_config(hosts=1, vms_per_host=2, disks=2, driver="qemu")]

WHY = "the overlays of its next cut were still being made"
# A quarter of it (30 ms) is all a prepare waits for overlays being made,
# which takes longer here: QEMU opens an RBD connection per overlay.
SHORT_LEASE_MS = 120
ROUNDS = 15


def new_txn() -> str:
    return "t" + uuid.uuid4().hex[:12]


def client(rec: dict[str, Any], certs: Path) -> AgentClient:
    return AgentClient(rec["address"], rec["port"], ssl_context=coordinator_context(certs),
                       call_timeout=60)


async def states(c: AgentClient) -> dict[str, str]:
    return {vm["name"]: vm["state"] for vm in (await c.inventory())["vms"]}


async def running(c: AgentClient, names: list[str], timeout: float = 20) -> dict[str, str]:
    end = time.monotonic() + timeout
    while True:
        st = await states(c)
        if all(st.get(n) == "running" for n in names) or time.monotonic() > end:
            return st
        await asyncio.sleep(0.1)


async def test_prepare_behind_an_abort_cuts_in_the_pause_and_no_qemu_dies(
        lab: dict[str, Any], agents: list[dict], certs_dir: Path) -> None:
    names = [vm["name"] for vm in lab["vms"]]
    seen: Counter[str] = Counter()
    async with client(agents[0], certs_dir) as c:
        # the first cut makes its overlays inside the prepare; its abort
        # starts the next ones in the background
        first = new_txn()
        await c.prepare(first, names, 5000)
        await c.abort(first)
        for _ in range(ROUNDS):
            txn = new_txn()
            try:
                prep = await c.prepare(txn, names, SHORT_LEASE_MS)
            except AgentReplyError as e:
                # refused before its stop, never half done: the jobs ran past
                # the stop's wait (a quarter of the lease) or a read probe
                # past its own; the VMs run
                assert e.code in ("BUSY", "SNAPSHOT_FAILED", "QMP_TIMEOUT"), e
                assert "not stopped" in str(e) or "no VM paused" in str(e), e
                seen["refused"] += 1
            else:
                assert prep["state"] == "prepared"
                for v in prep["vms"]:
                    if v["pause_path"] == "in_pause":
                        assert v.get("pause_path_why"), v
                        seen["in_pause: " + v["pause_path_why"]] += 1
                    else:
                        assert v["pause_path"] == "redirect" and "pause_path_why" not in v, v
                        seen["redirect"] += 1
            try:
                await c.abort(txn)
            except AgentReplyError:
                pass            # a refused prepare left nothing to abort
            st = await running(c, names)
            # a QEMU that aborted is gone: "shutoff", never back to running
            assert all(st.get(n) == "running" for n in names), (st, seen)
        print(f"paths over {ROUNDS} rounds: {dict(seen)}")
        assert seen[f"in_pause: {WHY}"] >= 1, (
            f"no prepare found overlays still being made: {dict(seen)}")
        # The overlays made beside those cuts serve the next one: a cut with a
        # normal lease takes the redirect path and commits.
        await asyncio.sleep(2)
        txn = new_txn()
        prep = await c.prepare(txn, names, 5000)
        assert {v["pause_path"] for v in prep["vms"]} == {"redirect"}, prep
        res = await c.commit(txn, {f"{vm['name']}/{d['node']}": f"cp.fallback.{txn}"
                                   for vm in lab["vms"] for d in vm["disks"]}, 5000)
        assert res["state"] == "committed"
        assert all(v["resumed"] for v in res["vms"]), res
        await c.abort(txn)      # its member snapshots go
        assert set((await running(c, names)).values()) == {"running"}


INLINE_ONE = "\n[agent]\nredirect_inline_max = 1\n"


@pytest.fixture
def agents_inline_one(lab: dict[str, Any], certs_dir: Path) -> Iterator[list[dict[str, Any]]]:
    """The agents, with overlays made inside a prepare for one VM at most."""
    with agents_with(lab, certs_dir, INLINE_ONE) as recs:
        yield recs


def overlays(lab: dict[str, Any], vm: dict[str, Any]) -> list[str]:
    """The overlay images next to vm's disks."""
    pool = vm["disks"][0]["pool"]
    out = subprocess.run(rbd_cmd(lab["sites"]["primary"], "ls", "--format", "json", pool),
                         check=True, capture_output=True, text=True).stdout
    bases = {d["image"] for d in vm["disks"]}
    return sorted(i for i in json.loads(out)
                  if ".cutpoint-ov." in i and i.split(".cutpoint-ov.")[0] in bases)


async def test_past_redirect_inline_max_a_first_cut_is_in_the_pause_then_redirected(
        lab: dict[str, Any], agents_inline_one: list[dict], certs_dir: Path) -> None:
    """No overlays are made ahead before a VM's first cut.  With
    redirect_inline_max = 1 and two VMs, one makes its overlays inside the
    prepare and the other is cut in the pause, saying why; after the txn
    that one gets its overlays, and the next cut redirects both.  (With the
    default, 8, both VMs' first cuts redirect: test_agent_lab.py.)"""
    names = [vm["name"] for vm in lab["vms"]]
    by_name = {vm["name"]: vm for vm in lab["vms"]}
    snaps = {f"{vm['name']}/{d['node']}": "cp.inline." for vm in lab["vms"] for d in vm["disks"]}
    async with client(agents_inline_one[0], certs_dir) as c:
        for v in by_name.values():
            assert overlays(lab, v) == [], "overlays left by an earlier test"
        txn = new_txn()
        prep = await c.prepare(txn, names, 5000)
        paths = {v["vm"]: v for v in prep["vms"]}
        cut_in = [n for n, v in paths.items() if v["pause_path"] == "in_pause"]
        assert sorted(v["pause_path"] for v in paths.values()) == ["in_pause", "redirect"], prep
        assert "redirect_inline_max" in paths[cut_in[0]]["pause_path_why"], prep
        res = await c.commit(txn, {d: s + txn for d, s in snaps.items()}, 5000)
        assert res["state"] == "committed" and all(v["resumed"] for v in res["vms"]), res
        await c.abort(txn)      # its member snapshots go
        # the VM cut in the pause gets its next cut's overlays after the txn
        vm = by_name[cut_in[0]]
        t0 = time.monotonic()
        while len(overlays(lab, vm)) < len(vm["disks"]):
            assert time.monotonic() - t0 < 30, f"no overlays made for {vm['name']}"
            await asyncio.sleep(0.3)
        assert all(".cutpoint-ov.ahead-" in i for i in overlays(lab, vm))
        await asyncio.sleep(1)  # the other VM's, made after its merge
        txn = new_txn()
        prep = await c.prepare(txn, names, 5000)
        assert {v["pause_path"] for v in prep["vms"]} == {"redirect"}, prep
        res = await c.commit(txn, {d: s + txn for d, s in snaps.items()}, 5000)
        assert res["state"] == "committed" and all(v["resumed"] for v in res["vms"]), res
        await c.abort(txn)
        assert set((await running(c, names)).values()) == {"running"}
