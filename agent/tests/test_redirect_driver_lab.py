"""A stale `redirect` journal entry of a VM that libvirt runs now.

Reported: an agent journal holding `redirect <txn> <vm>` for a VM driven
by libvirt (raw QMP off for libvirt domains) retried the merge forever
("raw QMP is off") and refused every prepare of the VM with BUSY.  A real
host whose VM changed driver (or an upgrade) meets it.  Only the qmp
driver redirects, so the VM's QEMU never held those overlays: the agent
judges them as a gone QEMU's (agent-protocol §5.1): the overlay with guest
writes is kept and reported (a prepare is BUSY saying so: never dropped
silently), the empty one removed; once an operator settles the kept one,
the entry goes and the VM is cut again.

The lab's libvirt domains with RBD disks, real Ceph, the real cutpointd;
the overlays are real qcow2 images in the disks' pool, one written with
qemu-io (agent-lab).
"""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import coordinator_context
from cutpoint.agentclient import AgentClient, AgentReplyError
from cutpoint.lab import agents as A
from cutpoint.lab.ceph import rbd_cmd

pytestmark = [pytest.mark.lab, pytest.mark.lab_config(driver="libvirt", hosts=1,
                                                            vms_per_host=1, disks=2,
                                                            backend="rbd")]


def rbd_file(lab: dict[str, Any], pool: str, image: str) -> str:
    site = lab["sites"]["primary"]
    return (f"rbd:{pool}/{image}:id={site.get('client_id', 'admin')}:"
            f"conf={site['ceph_conf']}:keyring={site['keyring']}")


def images(lab: dict[str, Any], pool: str) -> list[str]:
    import json

    out = subprocess.run(rbd_cmd(lab["sites"]["primary"], "ls", "--format", "json", pool),
                         check=True, capture_output=True, text=True).stdout
    return list(json.loads(out))


def run(*argv: str) -> str:
    r = subprocess.run(argv, check=False, capture_output=True, text=True)
    assert r.returncode == 0, (argv[0], r.stdout, r.stderr)
    return r.stdout


@pytest.fixture
def stale(lab: dict[str, Any], certs_dir: Path) -> Iterator[dict[str, Any]]:
    """The agent stopped; two overlay images of an old txn next to the VM's
    disks (disk 0's written by a guest, disk 1's empty) and the journal
    entry naming them; then the agent started."""
    vm = next(v for v in lab["vms"] if v["site"] == "primary")
    assert vm["driver"] == "libvirt", vm
    host = next(h for h in lab["hosts"] if h["name"] == vm["host"])
    A.stop_agents(lab)
    txn = "t" + uuid.uuid4().hex[:12]
    ovs = [f"{d['image']}.cutpoint-ov.{txn}" for d in vm["disks"]]
    pool = vm["disks"][0]["pool"]
    for ov in ovs:
        run("qemu-img", "create", "-q", "-f", "qcow2", rbd_file(lab, pool, ov), "16M")
    run("qemu-io", "-f", "qcow2", rbd_file(lab, pool, ovs[0]), "-c", "write -P 0x5a 0 64k")
    jdir = A.agents_dir(lab) / host["name"]
    jdir.mkdir(parents=True, exist_ok=True)
    (jdir / "journal").write_text(f"cutpoint-journal 2\nredirect {txn} {vm['name']}\n")
    A.make_certs(certs_dir, lab["hosts"])
    log = jdir / "agent.log"
    at = log.stat().st_size if log.exists() else 0
    rec = A.start_agent(lab, host, certs_dir)
    try:
        yield {"vm": vm, "rec": rec, "txn": txn, "ovs": ovs, "pool": pool, "log": log,
               "at": at, "journal": jdir / "journal"}
    finally:
        A.stop_agents(lab)
        for ov in ovs:
            subprocess.run(rbd_cmd(lab["sites"]["primary"], "rm", f"{pool}/{ov}"),
                           check=False, capture_output=True)


def log_since(s: dict[str, Any]) -> str:
    with open(s["log"], "rb") as f:
        f.seek(s["at"])
        return f.read().decode(errors="replace")


async def until(cond: Any, timeout: float, what: str) -> None:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, f"not within {timeout:.0f} s: {what}"
        await asyncio.sleep(0.5)


async def prepare_or_busy(c: AgentClient, vm: str) -> str:
    """A prepare of vm: "" when it was taken (and aborted at once: the VM
    runs again), else why it was BUSY."""
    txn = "t" + uuid.uuid4().hex[:12]
    try:
        await c.prepare(txn, [vm], 10000)
    except AgentReplyError as e:
        assert e.code == "BUSY", e
        return str(e)
    await c.abort(txn)
    return ""


async def test_stale_redirect_entry_of_a_libvirt_vm(lab: dict[str, Any],
                                                   stale: dict[str, Any],
                                                   certs_dir: Path) -> None:
    vm, rec = stale["vm"], stale["rec"]
    written, empty = stale["ovs"]
    ctx = coordinator_context(certs_dir)
    async with AgentClient(rec["address"], rec["port"], ssl_context=ctx,
                           call_timeout=60) as c:
        # recovery: the written overlay kept and reported, the empty one gone
        await until(lambda: f"event=redirect_overlay_kept vm={vm['name']} disk="
                    f"{vm['disks'][0]['node']}" in log_since(stale), 60,
                    "the written overlay reported kept")
        await until(lambda: empty not in images(lab, stale["pool"]), 60,
                    "the empty overlay removed")
        assert written in images(lab, stale["pool"])
        text = log_since(stale)
        assert "qemu=other_driver" in text, text
        assert "raw QMP is off" not in text, text
        assert f"redirect {stale['txn']} {vm['name']}" in stale["journal"].read_text()
        why = await prepare_or_busy(c, vm["name"])
        assert "holds guest writes" in why, why
        print(f"\nkept and reported: {why}")
        # The operator settles it (operations.md "An overlay kept": here it
        # held nothing the VM needs) by removing the image: the next prepare
        # looks again, the entry goes, and the VM is cut.
        run(*rbd_cmd(lab["sites"]["primary"], "rm", f"{stale['pool']}/{written}"))
        t0 = time.monotonic()
        while (why := await prepare_or_busy(c, vm["name"])):
            assert time.monotonic() - t0 < 30, why
            await asyncio.sleep(0.5)
        print(f"prepare taken {time.monotonic() - t0:.1f} s after the operator's removal")
        assert "redirect " not in stale["journal"].read_text()
        inv = await c.inventory()
        assert [v["state"] for v in inv["vms"] if v["name"] == vm["name"]] == ["running"]
