"""`cutpoint vm list` follows libvirt hosts live, and a VM keeps its
identity (and its group) when it moves host.

Two hypervisor hosts, each its own libvirtd (cutpoint.lab.libvirt) with one
cutpointd (`discover = yes`, `[ceph]` as client.cutpoint of the lab's
primary cluster), registered with a control plane started as an operator
does (`cutpoint server --embedded`: API, worker, beat, Redis).

- The event test: `virsh define` + `virsh start` of a new domain on a host;
  `cutpoint vm list --json` lists it running on that host within 5 s, with
  no restart of anything (libvirt event -> agent inventory generation ->
  the control plane's inventory watch).
- The move test: a domain with an RBD disk (libvirt cephx secret) in a
  group, snapshotted on host 1; it moves to host 2 (`virsh migrate --live`,
  or shut down / undefine / define / start where that fails); `cutpoint vm
  list` shows the same VM (id, uid) on host 2, and the next group snapshot
  commits with that member, taken by host 2's agent.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cutpoint.lab.libvirt import LibvirtHost
from libvirt_agent import GUEST_AGENT, LibvirtAgent, domain_xml, until

pytestmark = [pytest.mark.lab, pytest.mark.lab_config(hosts=1, vms_per_host=1, disks=1)]

PREFIX = "cp-vminv-"
NEW = PREFIX + "new"
MOVER = PREFIX + "mover"
IMAGE = PREFIX + "mover-d0"


class Plane:
    """`cutpoint server --embedded` in its own process group, and the CLI."""

    def __init__(self, d: Path, certs: Path) -> None:
        from cutpoint.api import services_local

        self.dir, self.port = d, services_local.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("cutpoint")), "server", "--embedded",
             "--state-dir", str(d), "--port", str(self.port), "--agent-certs", str(certs),
             "--admin-token-file", str(d / "token")],
            stdout=open(d / "server.log", "ab"), stderr=subprocess.STDOUT,  # noqa: SIM115
            start_new_session=True)
        t0 = time.monotonic()
        while True:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200 \
                        and (d / "token").exists():
                    break
            except httpx.HTTPError:
                pass
            assert self.proc.poll() is None, self.log()
            assert time.monotonic() - t0 < 60, self.log()
            time.sleep(0.2)
        self.token = (d / "token").read_text().strip()

    def log(self) -> str:
        return "".join(p.read_text(errors="replace")[-3000:]
                       for p in [self.dir / "server.log", *sorted(self.dir.glob("logs/*"))]
                       if p.exists())

    def cli(self, *args: str) -> str:
        from cutpoint.api.cli.main import app
        from typer.testing import CliRunner

        r = CliRunner().invoke(app, [*args, "--url", self.url, "--token", self.token])
        assert r.exit_code == 0, (args, r.output)
        return r.output

    def vms(self) -> list[dict[str, Any]]:
        return list(json.loads(self.cli("vm", "list", "--json")))

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(60)


def _rbd(site: dict[str, Any], *args: str, check: bool = True) -> str:
    return subprocess.run(["rbd", "--conf", site["ceph_conf"], "--id", site["client_id"],
                           "--keyring", site["keyring"], *args], check=check,
                          capture_output=True, text=True).stdout


@pytest.fixture
def two_hosts(lab: dict[str, Any], tmp_path: Path) \
        -> Iterator[tuple[Plane, list[LibvirtHost], list[LibvirtAgent], dict[str, Any]]]:
    site = dict(lab["sites"]["primary"])
    client = site["clients"]["cutpoint"]
    key = re.search(r"key\s*=\s*(\S+)", Path(client["keyring"]).read_text())
    assert key
    (tmp_path / "key").write_text(key.group(1))
    secret = str(uuid.uuid4())
    (tmp_path / "secret.xml").write_text(
        f"<secret ephemeral='no' private='yes'><uuid>{secret}</uuid><usage type='ceph'>"
        f"<name>client.{client['client_id']} {PREFIX}</name></usage></secret>")
    site["secret"] = secret
    hosts = [LibvirtHost(Path(f"/var/tmp/{PREFIX}h{i}")) for i in (1, 2)]
    agents: list[LibvirtAgent] = []
    plane = None
    _rbd(site, "rm", f"{site['pool']}/{IMAGE}", check=False)
    _rbd(site, "create", "--size", "64", f"{site['pool']}/{IMAGE}")
    certs = tmp_path / "certs"
    try:
        for i, h in enumerate(hosts, 1):
            h.start()
            h.virsh("secret-define", str(tmp_path / "secret.xml"))
            h.virsh("secret-set-value", "--secret", secret, "--file", str(tmp_path / "key"))
            (tmp_path / f"a{i}").mkdir()
            a = LibvirtAgent(
                tmp_path / f"a{i}", uri=h.uri, host=f"lv-h{i}", certs=certs, cert=f"lv-h{i}",
                extra=(f"[ceph]\nconf = {site['ceph_conf']}\nid = {client['client_id']}\n"
                       f"keyring = {client['keyring']}\n"))
            a.start()
            agents.append(a)
        (tmp_path / "cp").mkdir()
        plane = Plane(tmp_path / "cp", certs)
        plane.cli("site", "add", "primary")
        for i, a in enumerate(agents, 1):
            plane.cli("host", "add", f"lv-h{i}", "--site", "primary", "--address",
                      "127.0.0.1", "--port", str(a.port), "--cert", str(a.cert))
        yield plane, hosts, agents, site
    finally:
        if plane is not None:
            plane.stop()
        sanitizer = [a.stop() for a in agents]
        for h in hosts:
            h.stop()
        _rbd(site, "snap", "purge", f"{site['pool']}/{IMAGE}", check=False)
        _rbd(site, "rm", f"{site['pool']}/{IMAGE}", check=False)
        assert not any(sanitizer), sanitizer


def _move(hosts: list[LibvirtHost], xml: Path) -> str:
    """Moves MOVER from host 1 to host 2; says how."""
    r = subprocess.run(["virsh", "-c", hosts[0].uri, "migrate", "--live", "--persistent",
                        "--undefinesource", MOVER, hosts[1].uri], capture_output=True,
                       text=True, timeout=180, check=False)
    if r.returncode == 0:
        return "virsh migrate --live"
    hosts[0].virsh("destroy", MOVER, check=False)
    hosts[0].virsh("undefine", MOVER)
    hosts[1].virsh("define", str(xml))
    hosts[1].virsh("start", MOVER)
    return f"shut down/undefine/define/start (migrate failed: {r.stderr.strip()})"


def _one(vms: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    found = [v for v in vms if v["name"] == name]
    assert len(found) <= 1, found
    return found[0] if found else None


async def test_new_domain_in_vm_list_within_5s(two_hosts: Any, tmp_path: Path) -> None:
    plane, hosts, _, _ = two_hosts
    assert _one(plane.vms(), NEW) is None
    (tmp_path / "new.xml").write_text(domain_xml(NEW, GUEST_AGENT))
    t0 = time.monotonic()
    hosts[0].virsh("define", str(tmp_path / "new.xml"))
    hosts[0].virsh("start", NEW)
    started = time.monotonic()

    def listed() -> bool:
        v = _one(plane.vms(), NEW)
        return v is not None and v["state"] == "running"

    took = await until(listed, f"{NEW} running in `cutpoint vm list`", timeout=5)
    v = _one(plane.vms(), NEW)
    assert v is not None
    print(f"\nvirsh define+start {(started - t0) * 1000:.0f} ms; in `cutpoint vm list "
          f"--json` (running, host {v['host']}) {took:.2f} s after start returned")
    assert v["host"] == "lv-h1" and v["site"] == "primary" and v["driver"] == "libvirt"
    uid = hosts[0].virsh("domuuid", NEW)
    assert uid is not None and v["uid"] == uid.strip() and v["identity"] == "libvirt-uuid"


async def test_member_moves_host_and_next_snapshot_commits(two_hosts: Any,
                                                           tmp_path: Path) -> None:
    plane, hosts, agents, site = two_hosts
    client = site["clients"]["cutpoint"]
    mon = next(a for a in site["mon_addrs"] if a.startswith("v1:"))[3:].rpartition(":")[0]
    disk = (f"<disk type='network' device='disk'><driver name='qemu' type='raw'/>"
            f"<auth username='{client['client_id']}'>"
            f"<secret type='ceph' uuid='{site['secret']}'/></auth>"
            f"<source protocol='rbd' name='{site['pool']}/{IMAGE}'>"
            f"<host name='{mon}' port='6789'/></source>"
            f"<target dev='vda' bus='virtio'/></disk>")
    (tmp_path / "mover.xml").write_text(domain_xml(MOVER, disk))
    hosts[0].virsh("define", str(tmp_path / "mover.xml"))
    hosts[0].virsh("start", MOVER)

    async def ready_on(i: int) -> bool:
        async with agents[i].client() as c:
            inv = await c.inventory()
        v = next((v for v in inv["vms"] if v["name"] == MOVER), None)
        return v is not None and v["ready"] and v["state"] == "running" and not v["stale"]

    await until(lambda: ready_on(0), f"{MOVER} ready on lv-h1", 30)
    # Listed, with its disk's size: the agent learns it when it opens the
    # image, a generation after it first lists the domain.
    await until(lambda: (_one(plane.vms(), MOVER) or {}).get("host") == "lv-h1" and all(
        d["size_bytes"] for d in (_one(plane.vms(), MOVER) or {}).get("disks") or [{}]),
                f"{MOVER} listed on lv-h1 with its disk size", 10)
    before = _one(plane.vms(), MOVER)
    assert before is not None
    assert [(d["node"], d["pool"], d["image"], d["size_bytes"]) for d in before["disks"]] == \
        [("vda", site["pool"], IMAGE, 64 << 20)]
    plane.cli("group", "create", "mv")
    plane.cli("group", "add-vm", "mv", MOVER)
    first = json.loads(plane.cli("group", "snapshot", "mv", "--json"))["snapshot"]
    assert first["state"] == "committed", first
    assert [m["host"] for m in first["members"]] == ["lv-h1"]

    t0 = time.monotonic()
    how = _move(hosts, tmp_path / "mover.xml")
    moved = time.monotonic()
    # the same domain (UUID) on host 2, gone from host 1
    assert hosts[1].virsh("domuuid", MOVER).strip() == before["uid"]  # type: ignore[union-attr]
    assert hosts[0].virsh("domuuid", MOVER, check=False) is None

    def listed_on_h2() -> bool:
        v = _one(plane.vms(), MOVER)
        return v is not None and v["host"] == "lv-h2" and v["state"] == "running"

    took = await until(listed_on_h2, f"{MOVER} listed on lv-h2", 15)
    after = _one(plane.vms(), MOVER)
    assert after is not None
    assert (after["id"], after["uid"], after["groups"]) == (before["id"], before["uid"], ["mv"])
    assert [d["id"] for d in after["disks"]] == [d["id"] for d in before["disks"]]
    await until(lambda: ready_on(1), f"{MOVER} ready on lv-h2", 30)
    second = json.loads(plane.cli("group", "snapshot", "mv", "--json"))["snapshot"]
    print(f"\nmoved by {how} in {moved - t0:.1f} s; listed on lv-h2 {took:.2f} s later; "
          f"group snapshot after the move: {second['state']}, members on "
          f"{[m['host'] for m in second['members']]}")
    assert second["state"] == "committed", second
    assert [m["host"] for m in second["members"]] == ["lv-h2"]
    snaps = _rbd(site, "snap", "ls", f"{site['pool']}/{IMAGE}")
    assert f"cp.mv.{first['txn']}" in snaps and f"cp.mv.{second['txn']}" in snaps, snaps
    shown = json.loads(plane.cli("vm", "show", MOVER, "--json"))
    assert shown["last_snapshot"]["txn"] == second["txn"]
