"""The lab in libvirt mode, through the product: a group of libvirt domains
on two hosts, and its failover from captured definitions.

The lab (`driver = libvirt`, dr-tests/lab/domains.py): primary-h1 and
primary-h2 each run a libvirtd of their own with one domain, whose two
RBD network disks are opened as client.cutpoint through a libvirt cephx
secret; the writer ring spans both guests.  The agents drive them with the
libvirt driver (native API: suspend/resume, librbd snapshots).

- Group snapshots through the API (snapshot job, replicate job) commit
  with all four disks (`vm/vda`, `vm/vdb` from the domain XML); the group
  is restored as clones at the primary and the writer checker passes on
  the clones; the domains' libvirt logs have no `tainted` line after
  the snapshots.  Negative control: one raw QMP command through libvirt
  (`virsh qemu-monitor-command`) puts the line there and the check finds it.
- Planned failover with the product's booter (`agent`): the DR host's
  agent lists no VM, so each primary VM is started at DR from its captured
  definition (the inventory watch stored it when it joined the group),
  rewritten for DR (DR images, monitors, cephx secret) and signed
  (failover_signed.py; the DR agent holds the lab's definition key).  The
  domains run on dr-h1's libvirtd with their UUIDs, the DR images and the
  DR secret; the writer checker passes on the DR copy of the recovery
  point the guests booted from, with the records of the primary's stopped
  disks.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cutpoint.api import services_local
from cutpoint.api.config import DefinitionTarget
from cutpoint.lab import domains
from fastapi.testclient import TestClient
from labflow import (  # api/tests/labflow.py
    finish,
    lab_site,
    register,
    snapshot_and_replicate,
    writer_verdict,
)
from plane import Plane, lab_plane, wait_for

pytestmark = [pytest.mark.lab,
              pytest.mark.lab_config(driver="libvirt", hosts=2, vms_per_host=1, disks=2,
                                     backend="rbd", workload="writer")]


@pytest.fixture
def plane(lab: dict[str, Any], agents: list[dict[str, Any]], tmp_path: Path,
          local_services: services_local.Endpoints) -> Iterator[Plane]:
    """The failover plane with the product's booter, the lab's definition
    signing key and the DR site's definition target; the DR agent lists no
    standby (raw QEMU), so failover must use the captured definitions."""
    from cutpoint.lab.agents import start_agent, stop_agent_pid

    lv = lab["libvirt"]
    dr = next(h for h in lab["hosts"] if h["name"] == lv["definition_targets"]["dr"]["host"])
    stop_agent_pid(next(a["pid"] for a in agents if a["host"] == dr["name"]))
    start_agent(lab, dr, Path(lab["state_dir"]) / "certs", standby=False)
    targets = lv["definition_targets"]
    with lab_plane(lab, tmp_path, int(local_services.redis_port or 0),
                   CUTPOINT_AGENT_TIMEOUT_S="15", CUTPOINT_RETENTION_INTERVAL_S="3600",
                   CUTPOINT_INVENTORY_INTERVAL_S="3600", CUTPOINT_BOOTER="agent",
                   CUTPOINT_DEFINITION_SIGNING_KEY=lv["signing_key"],
                   CUTPOINT_DEFINITION_TARGETS=json.dumps(targets)) as p:
        # the in-process API (a failover request's preconditions) reads these too
        p.settings = p.settings.model_copy(update={
            "definition_signing_key": Path(lv["signing_key"]),
            "definition_targets": {k: DefinitionTarget(**v) for k, v in targets.items()}})
        yield p


def primaries(lab: dict[str, Any]) -> list[dict[str, Any]]:
    vms = sorted((v for v in lab["vms"] if v["site"] == "primary"), key=lambda v: v["index"])
    assert [v["driver"] for v in vms] == ["libvirt", "libvirt"], vms
    assert len({v["host"] for v in vms}) == 2
    return vms


def test_libvirt_group_snapshots_restore_and_leave_no_taint(
        lab: dict[str, Any], plane: Plane, client: TestClient) -> None:
    c = client
    prim = primaries(lab)
    offsets = domains.log_offsets(prim)
    plane.start("worker")
    register(c, lab, plane)
    first = snapshot_and_replicate(c, plane)
    second = snapshot_and_replicate(c, plane)
    disks = sorted(m["disk"] for m in second["members"])
    assert disks == sorted(f"{v['name']}/{d}" for v in prim for d in ("vda", "vdb")), second
    print(f"\nreplicated: {first['txn']} ({first['bytes_shipped']} B), "
          f"{second['txn']} ({second['bytes_shipped']} B); members {disks}")

    r = c.post("/v1/groups/app/restore/clone", json={"snapshot": str(second["snapshot_id"])})
    assert r.status_code == 202, r.text
    job = finish(c, r.json()["id"], "restore as clones", plane, 300)
    assert job["state"] == "succeeded", (job["error_code"], job["error"], plane.tail())
    clones = sorted(d["clone"].split("/", 1)[1] for d in job["result"]["disks"])
    assert len(clones) == 4, job["result"]
    v = writer_verdict(lab_site(lab, "primary"), clones, None)
    assert v.ok and v.p > 0, v.summary()
    print(f"restored as clones {clones}: writer {v.summary()}")

    for vm in prim:
        assert domains.tainted(vm, offsets[vm["name"]]) == [], vm["domain_log"]
    # Negative control: raw QMP through libvirt taints the domain, and the
    # same check sees it.
    vm = prim[0]
    at = domains.log_offsets([vm])[vm["name"]]
    subprocess.run(["virsh", "-c", vm["uri"], "qemu-monitor-command", vm["name"],
                    '{"execute":"query-status"}'], check=True, capture_output=True)
    got = domains.tainted(vm, at)
    assert got and "custom-monitor" in got[0], got
    print(f"negative control: {got[0].strip()}")


def _captured(plane: Plane, names: list[str]) -> bool:
    """One round of the product's inventory watch (what beat runs every
    inventory_watch_s); whether every VM in `names` has a definition."""
    from cutpoint.api.models import Vm, VmDefinition
    from cutpoint.api.services.inventory_watch import watch_round
    from sqlalchemy import select

    watch_round(plane.sf, plane.settings)
    with plane.sf() as s:
        have = set(s.scalars(select(Vm.name).join(VmDefinition, VmDefinition.vm_id == Vm.id)))
    return set(names) <= have


def test_libvirt_vm_fails_over_from_its_captured_definition(
        lab: dict[str, Any], plane: Plane, client: TestClient) -> None:
    c = client
    prim = primaries(lab)
    names = [v["name"] for v in prim]
    dr_host = lab["libvirt"]["definition_targets"]["dr"]["host"]
    dr = domains.host_of(lab, dr_host)
    dr_secret = lab["libvirt"]["secrets"]["dr"]["uuid"]
    plane.start("worker")
    register(c, lab, plane)
    wait_for(lambda: _captured(plane, names), 60, "the members' captured definitions", plane)
    point = snapshot_and_replicate(c, plane)
    t0 = time.monotonic()
    r = c.post("/v1/groups/app/failover", json={"mode": "planned"})
    assert r.status_code == 202, r.text
    try:
        job = finish(c, r.json()["id"], "the failover job", plane, 480, follow=True)
        res = job["result"] or {}
        assert job["state"] == "succeeded", (job["error_code"], job["error"], plane.tail())
        print(f"\nplanned failover from captured definitions: RTO {res['rto_s']:.1f} s "
              f"(test saw {time.monotonic() - t0:.1f} s); breakdown {res['breakdown']}")
        assert sorted(g["vm"] for g in res["guests"]) == names, res["guests"]
        assert res["recovery_point"] != point["txn"]  # the stopped disks' snapshot
        # Fenced: the primary domains are off on their own libvirtds.
        for vm in prim:
            assert (domains.host_of(lab, vm["host"]).virsh("domstate", vm["name"]) or ""
                    ).strip() == "shut off"
        # At DR: the same domains (name, UUID, MAC), on the DR images through
        # the DR monitors and the DR secret.
        mon = lab["libvirt"]["definition_targets"]["dr"]["mon_hosts"][0]
        for vm in prim:
            assert (dr.virsh("domstate", vm["name"]) or "").strip() == "running"
            assert dr.domain_pid(vm["name"]) > 0
            xml = dr.virsh("dumpxml", vm["name"]) or ""
            assert f"<uuid>{vm['uuid']}</uuid>" in xml and vm["mac"] in xml
            assert f"uuid='{dr_secret}'" in xml and f"name='{mon.split(':')[0]}'" in xml
            for d in vm["disks"]:
                assert f"name='rbd/{d['image']}'" in xml
            # only host files the DR site allows (vmdef_policy, the agent's
            # definition_paths): its console directory, not the primary's file
            assert vm["console"] not in xml
            assert f"file='{domains.dr_console(lab, vm['name'])}'" in xml, xml

        def ready(v: dict[str, Any]) -> bool:
            p = domains.dr_console(lab, v["name"])
            return p.exists() and "cp-init: ready" in p.read_text(errors="replace")

        wait_for(lambda: all(ready(v) for v in prim), 120, "the DR guests' ready line", plane)
        # The writer checker on the DR copy of the recovery point the guests
        # booted from (the DR images were rolled back to it), against the
        # primary's stopped disks.
        images = [d["image"] for v in prim for d in v["disks"]]
        snap = f"cp.app.{res['recovery_point']}"
        at_dr = writer_verdict(lab_site(lab, "dr"), images, snap)
        stopped = writer_verdict(lab_site(lab, "primary"), images, snap)
        assert at_dr.ok and at_dr.p > 0 and at_dr.p == stopped.p, \
            (at_dr.summary(), stopped.summary())
        print(f"writer at DR ({snap}): {at_dr.summary()}")
    finally:
        gone = domains.destroy(lab, dr_host, names)
        print(f"DR domains destroyed: {gone}")


def test_failover_follows_the_plans_boot_order_and_network_map(
        lab: dict[str, Any], plane: Plane, client: TestClient) -> None:
    """The group's recovery plan drives its failover: two boot groups in the
    reverse of the VMs' order (vm2's group first), and a failover network
    map that puts the primary's `br0` onto `cpfo0` at DR (a bridge of the
    DR host made here, not the site's default map br0 -> br0).  The job's
    timeline has the groups ready in the plan's order, vm1 started only
    after vm2's group was ready, and both DR domains on cpfo0."""
    c = client
    prim = primaries(lab)
    names = [v["name"] for v in prim]
    dr_host = lab["libvirt"]["definition_targets"]["dr"]["host"]
    dr = domains.host_of(lab, dr_host)
    netns = next(h["netns"] for h in lab["hosts"] if h["name"] == dr_host)
    subprocess.run(["ip", "-n", netns, "link", "del", "cpfo0"], check=False,
                   capture_output=True)
    subprocess.run(["ip", "-n", netns, "link", "add", "cpfo0", "type", "bridge"], check=True)
    subprocess.run(["ip", "-n", netns, "link", "set", "cpfo0", "up"], check=True)
    plane.start("worker")
    register(c, lab, plane)
    wait_for(lambda: _captured(plane, names), 60, "the members' captured definitions", plane)
    r = c.put("/v1/groups/app/plan", json={
        "boot_groups": [{"name": "first", "vms": [names[1]]},
                        {"name": "second", "vms": [names[0]]}],
        "networks": {"failover": {"br0": "cpfo0"}}})
    assert r.status_code in (200, 201), r.text
    snapshot_and_replicate(c, plane)
    r = c.post("/v1/groups/app/failover", json={"mode": "planned"})
    assert r.status_code == 202, r.text
    try:
        job = finish(c, r.json()["id"], "the failover job", plane, 480, follow=True)
        res = job["result"] or {}
        assert job["state"] == "succeeded", (job["error_code"], job["error"], plane.tail())
        tl = res["timeline"]
        for e in tl:
            if e["step"] in ("boot_group", "vm_start", "ready", "boot", "running"):
                print(f"  {e['t_s']:7.2f} {e['step']} {e.get('status', '')} "
                      f"{e.get('group') or e.get('vm') or e.get('vms') or ''}")
        assert res["plan_version"] == 1, res
        done = [e for e in tl if e["step"] == "boot_group" and e.get("status") == "ok"]
        assert [e["group"] for e in done] == ["first", "second"], done
        vm1_start = next(e["t_s"] for e in tl if e["step"] == "vm_start"
                         and e.get("vm") == names[0])
        assert done[0]["t_s"] <= vm1_start, (done, vm1_start)
        for vm in prim:
            xml = dr.virsh("dumpxml", vm["name"]) or ""
            assert "<source bridge='cpfo0'/>" in xml, xml
        print(f"\nfailover by the plan: RTO {res['rto_s']:.1f} s; groups ready at "
              f"{[(e['group'], e['t_s']) for e in done]}; {names[0]} started at {vm1_start}")
    finally:
        gone = domains.destroy(lab, dr_host, names)
        print(f"DR domains destroyed: {gone}")
        subprocess.run(["ip", "-n", netns, "link", "del", "cpfo0"], check=False,
                       capture_output=True)
