"""A libvirt domain with an RBD network disk, snapshotted through libvirt's
native API and librbd only: no `tainted` line in the domain's log.

The domain's disk is an image of the lab's primary Ceph cluster, reached
as `client.cutpoint` through a libvirt cephx secret (as a deployment does:
not admin).  The agent (root namespace, `[ceph]` the same client) names
the VM in a `[vm]` section without disks, so it takes them from the domain
XML (target `vda`, source `rbd/IMAGE`).  A group snapshot, prepare +
commit, first asks for fs-freeze: the domain has a guest agent channel but
no guest agent answers, so virDomainFSFreeze fails and the member is
crash-consistent, as recorded.  Then libvirt's log of the domain must not
say `tainted` (test_agent_libvirt.py shows that it does once raw QMP is
used, so the check can fail).
"""

from __future__ import annotations

import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from libvirt_agent import (
    GUEST_AGENT,
    LibvirtAgent,
    domain_xml,
    domstate,
    forget_domain,
    log_since,
    until,
    virsh,
)
from libvirt_env import libvirtd_running

pytestmark = [pytest.mark.lab, pytest.mark.lab_config(hosts=1, vms_per_host=2, disks=2,
                                                            driver="qemu")]

DOMAIN = "cp-lvrbd"
IMAGE = "cp-lvrbd-d0"
DISK = f"{DOMAIN}/vda"
LOG = Path(f"/var/log/libvirt/qemu/{DOMAIN}.log")


def _key(keyring: str) -> str:
    m = re.search(r"key\s*=\s*(\S+)", Path(keyring).read_text())
    assert m, f"no key in {keyring}"
    return m.group(1)


def _rbd(site: dict[str, Any], *args: str) -> str:
    return subprocess.run(["rbd", "--conf", site["ceph_conf"], "--id", site["client_id"],
                           "--keyring", site["keyring"], *args], check=True,
                          capture_output=True, text=True).stdout


@pytest.fixture
def rbd_domain(lab: dict[str, Any], tmp_path: Path) -> Iterator[tuple[LibvirtAgent, dict]]:
    site = dict(lab["sites"]["primary"])
    client = site["clients"]["cutpoint"]
    mon_host, _, _ = next(a for a in site["mon_addrs"] if a.startswith("v1:"))[3:] \
        .partition(":")
    secret = str(uuid.uuid4())
    with libvirtd_running():
        forget_domain(DOMAIN)
        subprocess.run(["rbd", "--conf", site["ceph_conf"], "--id", site["client_id"],
                        "--keyring", site["keyring"], "rm", f"{site['pool']}/{IMAGE}"],
                       check=False, capture_output=True)
        _rbd(site, "create", "--size", "64", f"{site['pool']}/{IMAGE}")
        (tmp_path / "secret.xml").write_text(
            f"<secret ephemeral='no' private='yes'><uuid>{secret}</uuid>"
            f"<usage type='ceph'><name>client.{client['client_id']} {DOMAIN}</name>"
            f"</usage></secret>")
        virsh("secret-define", str(tmp_path / "secret.xml"))
        agent = None
        try:
            (tmp_path / "key").write_text(_key(client["keyring"]))
            virsh("secret-set-value", "--secret", secret, "--file", str(tmp_path / "key"))
            disk = (f"<disk type='network' device='disk'><driver name='qemu' type='raw'/>"
                    f"<auth username='{client['client_id']}'>"
                    f"<secret type='ceph' uuid='{secret}'/></auth>"
                    f"<source protocol='rbd' name='{site['pool']}/{IMAGE}'>"
                    f"<host name='{mon_host}' port='6789'/></source>"
                    f"<target dev='vda' bus='virtio'/></disk>")
            (tmp_path / "dom.xml").write_text(domain_xml(DOMAIN, disk + GUEST_AGENT))
            # libvirt appends to the domain's log: read only this run's part
            site["log_offset"] = LOG.stat().st_size if LOG.exists() else 0
            virsh("create", str(tmp_path / "dom.xml"))
            agent = LibvirtAgent(
                tmp_path, discover=False,
                agent_extra="freeze_timeout_ms = 3000\n",
                extra=(f"[ceph]\nconf = {site['ceph_conf']}\nid = {client['client_id']}\n"
                       f"keyring = {client['keyring']}\n\n"
                       f"[vm {DOMAIN}]\ndriver = libvirt\n"))
            agent.start()
            yield agent, site
        finally:
            sanitizer = agent.stop() if agent else ""
            forget_domain(DOMAIN)
            virsh("secret-undefine", secret, check=False)
            subprocess.run(["rbd", "--conf", site["ceph_conf"], "--id", site["client_id"],
                            "--keyring", site["keyring"], "snap", "purge",
                            f"{site['pool']}/{IMAGE}"], check=False, capture_output=True)
            subprocess.run(["rbd", "--conf", site["ceph_conf"], "--id", site["client_id"],
                            "--keyring", site["keyring"], "rm", f"{site['pool']}/{IMAGE}"],
                           check=False, capture_output=True)
            assert not sanitizer, sanitizer


async def test_group_snapshot_of_rbd_domain_leaves_no_taint(
        rbd_domain: tuple[LibvirtAgent, dict]) -> None:
    agent, site = rbd_domain
    async with agent.client() as c:
        async def ready() -> bool:
            inv = await c.inventory()
            v = next((v for v in inv["vms"] if v["name"] == DOMAIN), None)
            return not inv["stale"] and v is not None and v["state"] == "running" \
                and v["ready"]

        await until(ready, "the domain with its disk in the inventory", 30)
        inv = await c.inventory()
        vm = next(v for v in inv["vms"] if v["name"] == DOMAIN)
        assert vm["method"] == "rbd"
        assert vm["disks"] == [{"id": DISK, "node": "vda", "backend": "rbd",
                                "pool": site["pool"], "image": IMAGE,
                                "size": 64 << 20}]  # rbd create --size 64 (MiB)
        assert vm["guest_agent"] is True
        # prepare + commit (fs-freeze asked, no guest agent: crash)
        prep = await c.prepare("lvrbd-t1", [DOMAIN], 5000, quiesce="fs-freeze",
                               freeze_timeout_ms=3000, timeout=20)
        assert domstate(DOMAIN) == "paused"
        assert prep["vms"][0]["consistency"] == "crash"
        assert "guest agent" in prep["vms"][0]["freeze_error"].lower()
        res = await c.commit("lvrbd-t1", {DISK: "cp.lvrbd.t1"}, 5000, timeout=20)
        v = res["vms"][0]
        assert v["method"] == "rbd" and v["disks"][0]["ok"] is True
        assert v["consistency"] == "crash"
        assert domstate(DOMAIN) == "running"
        assert "cp.lvrbd.t1" in await c.snapshot_list(DISK)
        assert "cp.lvrbd.t1" in _rbd(site, "snap", "ls", f"{site['pool']}/{IMAGE}")
        print(f"\nlibvirt rbd member: stop {v['stop_ms']:.1f} ms, snapshot "
              f"{v['snapshot_ms']:.1f} ms, cont {v['cont_ms']:.1f} ms, paused "
              f"{v['paused_ms']:.1f} ms")
        ab = await c.abort("lvrbd-t1")
        assert ab["deleted"] == [{"disk": DISK, "name": "cp.lvrbd.t1"}]
    text = log_since(LOG, site["log_offset"])
    assert "starting up" in text      # this run's start of the domain
    tainted = [ln for ln in text.splitlines() if "tainted" in ln]
    assert not tainted, tainted
    assert "virDomainQemuMonitorCommand" not in agent.log_text()
