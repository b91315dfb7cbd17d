"""A drill of libvirt VMs through the DR agents, from captured definitions
(api/tests/drill_agents.py sets the scene: the lab's Ceph sites, two DR
libvirtds with an agent each, the captured definitions in a database).

The product's path, with nothing of the lab's booter: `run_drill` with
`AgentBooter`, its definitions from `drill_boot.definitions` (the control
plane's rewrite, signature and agent choice).  Seen while the VMs run
(the drill's `boot started` event): each domain is `drill-<id>-<vm>` on
the agent failover would use (vm1 on dr-h1, the definition_targets host;
vm2 on dr-h2, whose inventory lists its standby), transient, with a new
UUID, its disk the drill's clone at DR and its one interface on the
isolated drill bridge.  Each is ready by guest-ping through its agent.
After: no domain on either libvirtd (defined or running), no clone, no
tap on the drill bridge.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from drill_agents import BRIDGE, RP, DrillBed, tiny_image

pytestmark = [pytest.mark.lab, pytest.mark.lab_config(hosts=1, vms_per_host=1, disks=1)]


@pytest.fixture
def bed(lab: dict[str, Any], tmp_path: Path) -> Any:
    b = DrillBed(lab, tmp_path)
    try:
        b.make_images()
        b.start()
        yield b
    finally:
        b.stop()


def test_drill_boots_captured_definitions_isolated_on_two_agents(bed: DrillBed,
                                                                  tmp_path: Path) -> None:
    from cutpoint.api.services import drill_boot
    from cutpoint.coordinator.dr.boot import AgentBooter, BootDisk, BootVM
    from cutpoint.coordinator.dr.drill import DrillSpec, leftovers, run_drill
    from cutpoint.lab.sites import ceph_site

    sf = bed.database(tiny_image())
    settings = bed.settings()
    site = ceph_site(bed.status, "dr")
    seen: dict[str, Any] = {}

    def on_event(ev: dict[str, Any]) -> None:
        print(f"  {ev['t_s']:7.2f} {ev['step']} {ev['status']} "
              f"{ {k: v for k, v in ev.items() if k not in ('t_s', 'at', 'step', 'status')} }")
        if ev["step"] == "boot" and ev["status"] == "started":
            seen["domains"] = bed.domains()
            seen["xml"] = {n: h.virsh("dumpxml", n) for h in bed.hosts
                           for n in (h.virsh("list", "--name") or "").split()}
            seen["persistent"] = {n: h.virsh("dominfo", n) for h in bed.hosts
                                  for n in (h.virsh("list", "--name") or "").split()}
            seen["taps"] = bed.taps()

    spec = DrillSpec(site=site, recovery_point=RP,
                     vms=[BootVM(vm, (BootDisk("vda", img, "rbd"),))
                          for vm, img in bed.images.items()],
                     checks=[], report_dir=str(tmp_path / "drills"),
                     definitions=drill_boot.definitions(sf, settings, "dr"),
                     agent_tls=(str(settings.agent_ca), str(settings.agent_cert),
                                str(settings.agent_key)),
                     boot_timeout_s=180)
    print()
    report = run_drill(spec, AgentBooter(), on_event)
    tag = f"drill-{report['drill_id']}"
    assert report["verdict"] == "passed", (report["error"], report["cleanup"])
    # where each VM ran: vm1 on dr-h1 (definition_targets), vm2 on dr-h2 (its standby)
    assert seen["domains"] == {"dr-h1": [f"{tag}-drl-vm1"], "dr-h2": [f"{tag}-drl-vm2"]}
    for vm, img in bed.images.items():
        root = ET.fromstring(seen["xml"][f"{tag}-{vm}"])
        src = root.find("devices/disk/source")
        assert src is not None and src.get("name") == f"{bed.dr['pool']}/{tag}-{img}"
        itfs = root.findall("devices/interface")
        assert [(i.get("type"), i.find("source").get("bridge")) for i in itfs] == \
            [("bridge", BRIDGE)]
        assert "52:54:00:aa:00:01" not in seen["xml"][f"{tag}-{vm}"]  # a MAC of its own
        assert "Persistent:     no" in seen["persistent"][f"{tag}-{vm}"]
    assert len(seen["taps"]) == 2
    ready = [e for e in report["timeline"] if e["step"] == "boot" and e["status"] == "ok"]
    assert sorted(e["vm"] for e in ready) == ["drl-vm1", "drl-vm2"]
    assert sorted(e["boot_name"] for e in ready) == [f"{tag}-drl-vm1", f"{tag}-drl-vm2"]
    assert all(e["rule"] == {"kind": "guest-ping"} for e in ready)
    print(f"ready (guest-ping) at {[e['ready_s'] for e in ready]} s; boot_s {report['boot_s']}")
    # nothing of the drill remains
    assert report["cleanup"]["ok"], report["cleanup"]
    assert bed.domains() == {"dr-h1": [], "dr-h2": []}
    assert bed.taps() == []
    assert not any(leftovers(site, tag, [bed.dr["pool"]]).values())
    assert "transient=yes" in bed.agent_log(0) and "transient=yes" in bed.agent_log(1)
