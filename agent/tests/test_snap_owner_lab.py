"""Ownership of member snapshots (agent-protocol §6): a snapshot the agent
makes carries its txn id in the image metadata key cutpoint.snap.<snap id>,
and abort deletes only what its transaction made, by snap id: a snapshot
that existed before under the same name is left alone.

Real QEMU guests on real Ceph (the lab), a real cutpointd, rbd CLI checks.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import coordinator_context
from cutpoint.agentclient import AgentClient, AgentReplyError
from cutpoint.lab.ceph import rbd_cmd

pytestmark = [pytest.mark.lab, pytest.mark.lab_config(hosts=1, vms_per_host=2, disks=2)]


def _client(rec: dict[str, Any], certs: Path) -> AgentClient:
    return AgentClient(rec["address"], rec["port"], ssl_context=coordinator_context(certs),
                       call_timeout=30)


def _rbd(lab: dict[str, Any], *args: str) -> str:
    site = lab["sites"]["primary"]
    return subprocess.run(rbd_cmd(site, *args), check=True, capture_output=True,
                          text=True).stdout


def _snaps(lab: dict[str, Any], disk: dict[str, Any]) -> dict[str, int]:
    out = _rbd(lab, "snap", "ls", "--format", "json", f"{disk['pool']}/{disk['image']}")
    return {s["name"]: int(s["id"]) for s in json.loads(out)}


def _owner(lab: dict[str, Any], disk: dict[str, Any], snap_id: int) -> str:
    return _rbd(lab, "image-meta", "get", f"{disk['pool']}/{disk['image']}",
                f"cutpoint.snap.{snap_id}").strip()


async def test_abort_spares_a_snapshot_that_existed_before(
        lab: dict[str, Any], agents: list[dict], certs_dir: Path) -> None:
    vm = lab["vms"][0]
    d0, d1 = vm["disks"][0], vm["disks"][1]
    txn = "t" + os.urandom(6).hex()
    name = f"cp.own.{txn}"
    # Someone else's snapshot, under the very name the txn will use on the
    # first disk (node disk0 of raw QEMU, vda of a libvirt domain).
    _rbd(lab, "snap", "create", f"{d0['pool']}/{d0['image']}@{name}")
    before = _snaps(lab, d0)[name]
    async with _client(agents[0], certs_dir) as c:
        await c.prepare(txn, [vm["name"]], 10000)
        with pytest.raises(AgentReplyError) as ei:
            await c.commit(txn, {f"{vm['name']}/{d0['node']}": name,
                                 f"{vm['name']}/{d1['node']}": name}, 10000)
        assert ei.value.code == "SNAPSHOT_FAILED", ei.value
        assert "exists already" in str(ei.value)
        # disk1's member is this txn's: tagged with its id
        made = _snaps(lab, d1)[name]
        assert _owner(lab, d1, made) == txn
        # The caller also names disk0's snapshot: abort must still spare it.
        ab = await c.abort(txn, {f"{vm['name']}/{d0['node']}": name})
    assert ab["deleted"] == [{"disk": f"{vm['name']}/{d1['node']}", "name": name}], ab
    assert [x["disk"] for x in ab["not_deleted"]] == [f"{vm['name']}/{d0['node']}"], ab
    assert "not created by txn" in ab["not_deleted"][0]["error"]
    assert _snaps(lab, d0).get(name) == before, "abort deleted a snapshot it did not make"
    assert name not in _snaps(lab, d1)
    _rbd(lab, "snap", "rm", f"{d0['pool']}/{d0['image']}@{name}")


async def test_committed_member_is_tagged_and_abort_deletes_by_id(
        lab: dict[str, Any], agents: list[dict], certs_dir: Path) -> None:
    vm = lab["vms"][0]
    d0 = vm["disks"][0]
    txn = "t" + os.urandom(6).hex()
    name = f"cp.own.{txn}"
    async with _client(agents[0], certs_dir) as c:
        await c.prepare(txn, [vm["name"]], 10000)
        res = await c.commit(txn, {f"{vm['name']}/{d0['node']}": name}, 10000)
        assert res["state"] == "committed"
        sid = _snaps(lab, d0)[name]
        assert _owner(lab, d0, sid) == txn
        ab = await c.abort(txn)
    assert ab["deleted"] == [{"disk": f"{vm['name']}/{d0['node']}", "name": name}]
    assert name not in _snaps(lab, d0)
    keys = _rbd(lab, "image-meta", "list", "--format", "json", f"{d0['pool']}/{d0['image']}")
    assert f"cutpoint.snap.{sid}" not in json.loads(keys or "{}")
