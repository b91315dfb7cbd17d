"""Cassandra recovery drill at DR, through the product (issue 8 item 3,
issue 18 item 4).  The drill runs under ``make drills`` (marker ``slow``):
two Cassandra 5.0 VMs under TCG take minutes to start, twice (primary and
restored at DR).

Real parts only: the lab in libvirt mode (``cassproduct.LAB``: two primary
hosts and a DR host, a libvirtd and a cutpointd on each), the mmdebstrap
image with Cassandra's jars from Maven Central (built once, cached by
recipe hash), node 1 a libvirt domain on primary-h1 and node 2 on
primary-h2 with RBD disks, on the lab network; Cassandra at RF 2 with the
commit log on its own disk, the CL=ALL writer and its operation log; one
group snapshot of both VMs through the product, replicated by the product;
`cutpoint drill run` against the product's server, whose worker boots both copies from their captured
definitions on the DR agent, on the isolated drill bridge, and runs the
`cassandra` check (nodetool status all UN, a CQL query) and the operation
log check in the guest (cp-check through guest-exec).
cutpoint.checkers.cassproduct says what runs.

The unit tests at the end check the names, argv and report of the older
QEMU-launcher drill helpers, read an operation log out of a real ext4 image
with debugfs, and parse a real `nodetool status`, without QEMU or Ceph.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cutpoint.checkers import cassdrill, cassproduct
from cutpoint.checkers.cassandra import check_cluster
from cutpoint.checkers.guestvm import DebianVM
from cutpoint.lab.debian_image import Image

ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
DATA = Path(__file__).parent / "data"


def _summary(rep: dict[str, Any]) -> str:
    return json.dumps({"primary": rep["primary"], "cleanup": rep["cleanup"],
                       "drills": [{k: d[k] for k in ("verdict", "error", "rto_s",
                                                     "point_age_s", "breakdown", "checks",
                                                     "left", "snapshot", "cleanup")}
                                  | {"replicated": {k: d["replication"][k] for k in
                                                    ("bytes_shipped", "seconds")}}
                                  for d in rep["drills"]]}, indent=1, default=str)


@pytest.mark.lab
@pytest.mark.slow
@ROOT
@pytest.mark.lab_config(**cassproduct.LAB)
def test_group_snapshot_of_two_cassandra_nodes_recovers_at_dr(
        lab: dict[str, Any], tmp_path: Path) -> None:
    """One group snapshot of both nodes (six RBD images: roots, commit logs,
    data) under CL=ALL load, replicated with full verification, drilled by
    the control plane's job: both copies come up on the drill bridge, every
    node UN, the CQL query answers, the snapshot's operation log is 1..M and
    every logged write reads back at ALL with its value; nothing left."""
    rep = cassproduct.run(lab, tmp_path / "drill",
                          interval=float(os.environ.get("CP_CASS_INTERVAL", "20")))
    print(_summary(rep))     # the figures quoted in docs/drills.md (-s)
    d = rep["drills"][0]
    out = tmp_path / "drill" / "nodetool-status.txt"
    out.write_text(d["outputs"][0] if d["outputs"] else "")
    print(f"the cassandra check's output: {out}")
    assert d["verdict"] == "passed", _summary(rep)
    assert [c["ok"] for c in d["checks"]] == [True, True], d["checks"]
    assert sorted(d["checks"][0]["nodes"].values()) == ["UN", "UN"], d["checks"][0]
    assert '"missing": 0' in d["outputs"][1] and '"wrong_value": 0' in d["outputs"][1]
    r = d["replication"]
    assert r["recovery_point"] and len(r["members"]) == 6, r
    assert all(m["state"] == "verified" and m["verified_full"] for m in r["members"]), r
    assert set(d["snapshot"]["paused_ms"]) == set(cassproduct.VMS)
    assert [b["group"] for b in d["boot_order"]] == ["cassandra"], d["boot_order"]
    assert d["cleanup"]["ok"] and d["left"] == {"domains": [], "clones": [], "taps": []}
    assert rep["cleanup"]["left"] == {"primary": [], "dr": []}, rep["cleanup"]


def test_drill_plan_and_checks_parse() -> None:
    import re

    from cutpoint.coordinator.dr.checks import CheckSpec, known
    from cutpoint.coordinator.dr.plan import RecoveryPlan

    plan = RecoveryPlan.parse(cassproduct.PLAN)
    assert [v.vm for v in plan.boot_groups[0].vms] == list(cassproduct.VMS)
    specs = [CheckSpec.parse(c) for c in cassproduct.CHECKS]
    assert [c.name for c in specs] == ["cassandra", "guest-exec"]
    assert all(c.name in known() for c in specs)
    # the cp-check regex on a passing line and on one with a missing write
    ok = ('CPSTATE cql-connected 88.1\nCPCHECK {"oplog": {"records": 812, "last": 812, '
          '"bad": 0, "torn_bytes": 0}, "peers": ["10.77.101.2"], "read_all": {"ok": true, '
          '"rows": 830, "max_id": 830, "missing": 0, "missing_first": [], "wrong_value": 0, '
          '"wrong_first": [], "waited_s": 3.1}}')
    rx = re.compile(cassproduct.CPCHECK_OK, re.MULTILINE)
    assert rx.search(ok)
    assert not rx.search(ok.replace('"missing": 0, "missing_first": []',
                                    '"missing": 2, "missing_first": [811, 812]'))
    assert not rx.search(ok.replace('"records": 812', '"records": 0'))
    assert not rx.search(ok.replace('"ok": true', '"ok": false'))


def test_image_has_nodetool_and_cqlsh() -> None:
    """The check's contract (`nodetool status`, `cqlsh -e`) is met by
    wrappers in the image recipe: NodeTool from cassandra-all's jars, and
    the Python driver's client."""
    base = Path(__file__).parents[1] / "images" / "debian" / "cassandra" / "overlay"
    nt = base / "usr" / "local" / "bin" / "nodetool"
    cq = base / "usr" / "local" / "bin" / "cqlsh"
    assert "org.apache.cassandra.tools.NodeTool" in nt.read_text()
    assert "-p 7199" in nt.read_text() and os.access(nt, os.X_OK)
    assert "cp-cqlclient.py" in cq.read_text() and os.access(cq, os.X_OK)


# -- unit: what the drill hands ip, QEMU, rbd and debugfs (no QEMU, no Ceph) --

SITE = {"ceph_conf": "/lab/ceph/dr/ceph.conf", "keyring": "/lab/ceph/dr/k",
        "client_id": "admin", "pool": "rbd"}
STATUS = {"sites": {"primary": SITE, "dr": SITE}}


def _image(tmp: Path) -> Image:
    return Image("debian-cassandra", "h", tmp, tmp / "root.raw", "raw",
                 tmp / "vmlinuz", tmp / "initrd.img", "console=ttyS0", {})


def test_four_images_one_group_two_vms(tmp_path: Path) -> None:
    imgs = cassdrill.drill_images(STATUS, "cp-cassdrill-x", tmp_path)
    assert imgs.disks == {"node1-cpclog": 512, "node1-cpdata": 512,
                          "node2-cpclog": 512, "node2-cpdata": 512}
    assert imgs.image("node2-cpdata") == "cp-cassdrill-x-node2-cpdata"
    # the member disk ids name each VM (the group spans two VMs)
    assert [imgs.disk_id(k) for k in imgs.disks] == [
        "cass-node1/disk1", "cass-node1/disk2", "cass-node2/disk1",
        "cass-node2/disk2"]


def test_node_vm_on_rbd_in_a_netns(tmp_path: Path) -> None:
    """The guest sees its disks by serial cpclog/cpdata on the node's RBD
    images, and its NIC on the drill's tap inside the host namespace."""
    disks = cassdrill.node_disks(
        SITE, {k: f"p-{k}" for k in ("node2-cpclog", "node2-cpdata")}, "node2")
    vm = cassdrill.node_vm(_image(tmp_path), tmp_path, 1, "check", disks, 1536,
                           "384m", "dr-h1", {"CUTPOINT_LAB_MARK": "/lab"})
    assert isinstance(vm, DebianVM) and vm.env == {"CUTPOINT_LAB_MARK": "/lab"}
    argv = vm.argv()
    assert argv[:4] == ["ip", "netns", "exec", "dr-h1"]
    bds = [argv[i + 1] for i, a in enumerate(argv) if a == "-blockdev"]
    assert bds[2:] == [f"driver=rbd,node-name=disk{i + 1},pool=rbd,"
                       f"image=p-node2-{s},conf={SITE['ceph_conf']},user=admin"
                       for i, s in enumerate(("cpclog", "cpdata"))]
    assert "virtio-blk-pci,drive=disk1,serial=cpclog" in argv
    assert "tap,id=n0,ifname=cpct2,script=no,downscript=no" in argv
    cmdline = argv[argv.index("-append") + 1]
    assert "cp.mode=check cp.role=replica cp.ip=10.77.101.2/16" in cmdline
    assert "cp.seeds=10.77.101.1,10.77.101.2" in cmdline
    assert "virtio-net-pci,netdev=n0,mac=52:54:00:77:01:02" in argv


def test_net_argv_puts_the_tap_on_the_host_bridge() -> None:
    cmds = cassdrill.net_up_argv("primary-h2", "cpct2")
    assert all(c[:3] == ["ip", "-n", "primary-h2"] for c in cmds)
    assert ["ip", "-n", "primary-h2", "tuntap", "add", "dev", "cpct2", "mode",
            "tap"] in cmds
    assert ["ip", "-n", "primary-h2", "link", "set", "cpct2", "master",
            "br0"] in cmds


def test_site_hosts_two_hosts_or_one_twice() -> None:
    hs = [{"name": n, "site": s, "netns": n, "address": a}
          for n, s, a in (("primary-h1", "primary", "10.77.1.1"),
                          ("primary-h2", "primary", "10.77.1.2"),
                          ("dr-h1", "dr", "10.77.2.1"))]
    st = {"hosts": hs}
    assert [h["name"] for h in cassdrill.site_hosts(st, "primary")] == [
        "primary-h1", "primary-h2"]
    assert [h["name"] for h in cassdrill.site_hosts(st, "dr")] == [
        "dr-h1", "dr-h1"]
    with pytest.raises(ValueError, match="no dr host"):
        cassdrill.site_hosts({"hosts": hs[:2]}, "dr")
    assert cassdrill.LAB["hosts"] == 2 and cassdrill.LAB["vms_per_host"] == 0


def test_read_oplog_from_a_raw_ext4_image(tmp_path: Path) -> None:
    """The debugfs read on a real ext4 image made without mounting
    (mkfs.ext4 -d), as rbd export leaves it; a filesystem without the
    operation log is an error, not an empty log."""
    src = tmp_path / "root"
    src.mkdir()
    log = b"".join(b"%015d %016x\n" % (i, i * 7919) for i in range(1, 40))
    (src / "oplog").write_bytes(log)
    raw = tmp_path / "clog.raw"
    subprocess.run(["mkfs.ext4", "-q", "-F", "-d", str(src), str(raw), "8M"],
                   check=True, capture_output=True)
    assert cassdrill.read_oplog_raw(raw) == log
    (src / "oplog").unlink()
    empty = tmp_path / "empty.raw"
    subprocess.run(["mkfs.ext4", "-q", "-F", "-d", str(src), str(empty), "8M"],
                   check=True, capture_output=True)
    with pytest.raises(RuntimeError, match="debugfs cat /oplog"):
        cassdrill.read_oplog_raw(empty)


def test_report_html_shows_recovery_checks_rto_and_replication() -> None:
    """render_html on a check of Cassandra 5.0's own log lines and a
    replication record in the shape DrillImages.replicate returns."""
    from test_cassandra_checker import GOOD, IPS, _console, _oplog
    consoles = {"node1": _console(IPS["node2"], check=GOOD),
                "node2": _console(IPS["node1"])}
    c = check_cluster(consoles, IPS, _oplog(50), _oplog(80), "node1")
    rep = {"snapshot": "cp.cass.t1", "base": None, "state": "verified",
           "recovery_point": True, "bytes_shipped": 98765432, "seconds": 12.5,
           "members": [{"disk": f"cass-{n}/disk{j}", "image": f"p-{n}-{s}",
                        "full": True, "state": "verified",
                        "verified_full": True, "bytes_shipped": 1000,
                        "bytes_changed": 0, "seconds": 3.0}
                       for n in ("node1", "node2")
                       for j, s in ((1, "cpclog"), (2, "cpdata"))]}
    report = {"primary": {"boot_to_writer_s": 500.0}, "params": {},
              "cleanup": {"left": {"primary": [], "dr": []}},
              "drills": [{"passed": c.passed, "reasons": c.reasons,
                          "rto_startup_complete_s": 401.2,
                          "rto_read_all_s": 450.0, "rto_check_done_s": 470.0,
                          "check": c.as_dict(), "replication": rep,
                          "dr_clones": ["rbd/p-node1-cpclog-d0"],
                          "dr_netns": ["dr-h1", "dr-h2"],
                          "snapshot": {"name": "cp.cass.t1",
                                       "paused_ms": {"cass-node1": 30.0},
                                       "acked_before": 40}}]}
    page = cassdrill.render_html(report)
    assert c.passed and page.count("PASS") == 1
    assert "Log replay complete, 12 replayed mutations" in page
    assert "401.2 s" in page and "98,765,432 B" in page
    assert page.count("<td>full</td>") == 4 and "(full SHA-256)" in page
    assert "rbd/p-node1-cpclog-d0" in page and "dr-h1" in page


@ROOT
def test_read_oplog_replays_the_ext4_journal(tmp_path: Path) -> None:
    """A crash-consistent copy of a mounted ext4 (what a snapshot is): the
    O_DSYNC appends are in the journal, not yet in the inode.  debugfs alone
    does not see them; read_oplog_raw replays the journal first and reads
    every record."""
    raw, mnt = tmp_path / "clog.raw", tmp_path / "m"
    subprocess.run(["mkfs.ext4", "-q", "-F", str(raw), "16M"], check=True,
                   capture_output=True)
    mnt.mkdir()
    if subprocess.run(["mount", "-o", "loop", str(raw), str(mnt)],
                      capture_output=True, check=False).returncode != 0:
        pytest.skip("no loop mount here")
    copy = tmp_path / "copy.raw"
    try:
        log = b"".join(b"%015d %016x\n" % (i, i) for i in range(1, 200))
        fd = os.open(mnt / "oplog", os.O_WRONLY | os.O_CREAT | os.O_APPEND
                     | os.O_DSYNC)
        try:
            for i in range(0, len(log), 33):
                os.write(fd, log[i:i + 33])
        finally:
            os.close(fd)
        subprocess.run(["cp", "--sparse=always", str(raw), str(copy)],
                       check=True)
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
    plain = subprocess.run(["debugfs", "-R", "cat /oplog", str(copy)],
                           capture_output=True, check=False).stdout
    assert plain != log          # without the replay: stale or absent
    assert cassdrill.read_oplog_raw(copy) == log


STATUS_HEAD = ("Datacenter: datacenter1\n=======================\n"
               "Status=Up/Down\n|/ State=Normal/Leaving/Joining/Moving\n"
               "--  Address       Load        Tokens  Owns (effective)  Host ID  Rack\n")


@pytest.mark.parametrize("states,ok", [(("UN", "UN"), True), (("UN", "DN"), False),
                                       (("UN", "UJ"), False), ((), False)])
def test_both_nodes_un_check_runs_in_a_shell(tmp_path: Path, states: tuple[str, ...],
                                               ok: bool) -> None:
    """cassproduct.UN_BOTH_NOW in /bin/sh, with a `nodetool` on PATH that
    prints a status with those node states (or fails, for none): it exits
    0 only when both nodes are UN."""
    tool = tmp_path / "nodetool"
    if states:
        body = STATUS_HEAD + "".join(f"{s}  10.77.101.{i + 1}   1 KiB  16  100.0%  id{i}  rack1\n"
                                     for i, s in enumerate(states))
        tool.write_text(f"#!/bin/sh\ncat <<'X'\n{body}X\n")
    else:
        tool.write_text("#!/bin/sh\necho 'nodetool: Failed to connect' >&2\nexit 1\n")
    tool.chmod(0o755)
    r = subprocess.run(["/bin/sh", "-c", cassproduct.UN_BOTH_NOW],
                       env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, check=False)
    assert (r.returncode == 0) is ok


class _Bed:
    """What wait_both reads of a DbDrillBed: wait_guest, guest, console."""

    def __init__(self, times_out: bool, status_error: bool = False) -> None:
        self.times_out, self.status_error = times_out, status_error
        self.waits: list[tuple[str, float, str]] = []

    def wait_guest(self, vm: Any, script: str, timeout_s: float, what: str) -> None:
        self.waits.append((script, timeout_s, what))
        if self.times_out:
            raise TimeoutError(f"{vm.name}: {what} not after {timeout_s:.0f} s")

    def guest(self, vm: Any, script: str, timeout_s: float) -> Any:
        from cutpoint.coordinator.dr.guest import GuestError

        if self.status_error:
            raise GuestError("TIMEOUT", "qemu-ga did not answer")
        return subprocess.CompletedProcess([], 0, stdout="UN  10.77.101.1\nDN  10.77.101.2\n")

    def console(self, name: str) -> str:
        return "x" * 5000 + f"{name}: INFO Startup complete"


def test_wait_both_shows_node_2_when_it_times_out() -> None:
    vms = [cassproduct.node(0, "primary-h1"), cassproduct.node(1, "primary-h2")]
    bed = _Bed(times_out=False)
    cassproduct.wait_both(bed, vms, 900, "both UN")  # type: ignore[arg-type]
    assert bed.waits == [(cassproduct.UN_BOTH_NOW, 900, "both UN")]

    with pytest.raises(TimeoutError) as exc:
        cassproduct.wait_both(_Bed(times_out=True), vms, 300, "the first record",  # type: ignore[arg-type]
                              "test -s /srv/clog/oplog")
    msg = str(exc.value)
    assert msg.startswith("cass-node1: the first record not after 300 s")
    assert "nodetool status on cass-node1: UN  10.77.101.1\nDN  10.77.101.2" in msg
    assert msg.endswith("cass-node2: INFO Startup complete")
    assert "x" * 2600 not in msg      # the console's tail, not all of it

    with pytest.raises(TimeoutError) as exc:
        cassproduct.wait_both(_Bed(times_out=True, status_error=True), vms, 1, "w")  # type: ignore[arg-type]
    assert "(not read: TIMEOUT: qemu-ga did not answer)" in str(exc.value)
