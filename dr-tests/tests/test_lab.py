"""The lab itself, on real parts: Ceph x2 (cephx), netns hosts, QEMU guests.

2 hosts x 2 VMs x 2 disks, workload `labcheck`: every guest writes a known
pattern (its name and the disk index) to each disk and pings every peer.
The test reads every pattern back from the host through the `rbd` CLI,
checks that pings between guests on *different* hosts succeeded (and that
the traffic went through the hosts' veths), then tears the lab down and
lists processes, namespaces and links to show nothing is left.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from cutpoint.lab import net
from cutpoint.lab.ceph import rbd_cmd
from cutpoint.lab.errors import LabError
from cutpoint.lab.labcheck import PATTERN_BYTES, expected_pattern, wait_done
from cutpoint.lab.proc import lab_processes
from cutpoint.lab.status import load_status, vm_pid


def wait_labcheck(status: dict[str, Any]) -> dict[str, list[dict[str, str]]]:
    try:
        return wait_done(status, timeout=240)
    except LabError as exc:
        pytest.fail(str(exc))


def veth_packets(veth: str) -> int:
    base = Path("/sys/class/net") / veth / "statistics"
    return int((base / "rx_packets").read_text()) + int((base / "tx_packets").read_text())


def rbd_read(site: dict[str, Any], pool: str, image: str, n: int) -> bytes:
    argv = rbd_cmd(site, "export", "--no-progress", f"{pool}/{image}", "-")
    cp = subprocess.run(argv, capture_output=True, timeout=120, check=False)
    assert cp.returncode == 0, f"{argv} failed: {cp.stderr.decode(errors='replace')}"
    return cp.stdout[:n]


@pytest.mark.lab
@pytest.mark.lab_config(hosts=2, vms_per_host=2, disks=2, workload="labcheck", fresh=True)
def test_lab_guests_write_disks_and_talk_across_hosts(lab: dict[str, Any], lab_session: Any) -> None:
    # The status the fixture got is the one other code reads.
    assert load_status() == lab
    assert set(lab["sites"]) == {"primary", "dr"}
    assert [h["name"] for h in lab["hosts"]] == ["primary-h1", "primary-h2", "dr-h1"]
    assert len(lab["vms"]) == 4
    # The shared status contract (contract.md "Lab") that other code reads.
    assert lab["bridge"] == "cpbr0" and lab["accel"] in ("tcg", "kvm")
    for site in lab["sites"].values():
        assert {"ceph_conf", "keyring", "client_id", "pool", "mon_addr"} <= set(site)
        assert site["pool"] == "rbd" and site["mon_addr"].startswith("10.77.0.")
    for h in lab["hosts"]:
        assert {"name", "site", "netns", "address"} <= set(h)
    for vm in lab["vms"]:
        assert {"name", "host", "site", "index", "address", "driver", "pid", "pidfile",
                "console", "backend", "disks"} <= set(vm)
        assert {"qmp"} <= set(vm) if vm["driver"] == "qemu" else \
            {"uri", "uuid", "domain_log"} <= set(vm)
        for d in vm["disks"]:
            assert {"node", "device", "backend", "pool", "image", "size_mb"} <= set(d)
    assert {"kernel", "initrd", "hash"} <= set(lab["image"])
    for vm in lab["vms"]:
        assert vm_pid(vm) == vm["pid"] > 0
        if vm["driver"] == "qemu":
            assert Path(vm["qmp"]).is_socket()
            assert [d["node"] for d in vm["disks"]] == ["disk0", "disk1"]
        else:  # a libvirt domain: its host's libvirtd runs it, disks by target dev
            state = subprocess.run(["virsh", "-c", vm["uri"], "domstate", vm["name"]],
                                   capture_output=True, text=True, check=True).stdout
            assert state.strip() == "running"
            assert [d["node"] for d in vm["disks"]] == ["vda", "vdb"]
    assert set(net.netns_list()) >= {"primary-h1", "primary-h2", "dr-h1"}

    lines = wait_labcheck(lab)

    # 1. Every guest wrote its pattern to each disk (guest side) ...
    primary = lab["sites"]["primary"]
    for vm in lab["vms"]:
        disks = [r for r in lines[vm["name"]] if r["kind"] == "disk"]
        assert [r["index"] for r in disks] == ["0", "1"], lines[vm["name"]]
        assert all(r["result"] == "ok" for r in disks), disks
        # ... and the host reads exactly that pattern through librbd (rbd CLI).
        for k, disk in enumerate(vm["disks"]):
            got = rbd_read(primary, disk["pool"], disk["image"], PATTERN_BYTES)
            assert got == expected_pattern(vm["name"], k), (
                f"{disk['image']}: read {got[:60]!r}, expected {expected_pattern(vm['name'], k)[:60]!r}")

    # 2. Every guest reached every guest on the *other* host.
    host_of = {vm["address"]: vm["host"] for vm in lab["vms"]}
    crossed = 0
    for vm in lab["vms"]:
        pings = {r["to"]: r for r in lines[vm["name"]] if r["kind"] == "ping"}
        others = [a for a, h in host_of.items() if h != vm["host"]]
        assert others
        for addr in others:
            assert addr in pings, f"{vm['name']} never pinged {addr}: {lines[vm['name']]}"
            assert pings[addr]["result"] == "ok", pings[addr]
            crossed += 1
    assert crossed == 8
    # The host veths carried traffic (guest frames leave through their host).
    for h in lab["hosts"][:2]:
        assert veth_packets(h["veth"]) > 0, h

    # 3. lab down leaves nothing: processes, namespaces, links, mounts.
    lab_session.down()
    assert lab_processes() == []
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True).stdout
    ours = [ln for ln in ps.splitlines()
            if "process=cplab-" in ln or "guest=primary-h" in ln
            or "/libvirt/primary-h" in ln or "/libvirt/dr-h" in ln
            or (" ceph-" in ln and "/ceph/primary/ceph.conf" in ln)
            or (" ceph-" in ln and "/ceph/dr/ceph.conf" in ln)]
    assert ours == []
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert not any(n in ns for n in ("primary-h1", "primary-h2", "dr-h1")), ns
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    assert "cpbr0" not in links and "cpvp" not in links and "cpvd" not in links, links
    assert "/run/netns/primary-h" not in Path("/proc/mounts").read_text()
    assert not Path(lab["state_dir"], "status.json").exists()
