"""PostgreSQL recovery drill at DR on the lab (issue 8 item 2).

Real parts only: the lab's two Ceph clusters, the mmdebstrap image (built
once, cached by recipe hash), QEMU, PostgreSQL 15, pgbench and the ledger
client inside the guest, the real cutpointd and coordinator (group
snapshots as librbd snapshots of the three RBD images), cutpoint-sync for
the replication, and a drill VM booted on the DR host from clones of the DR
snapshots.  The lab is the one of test_sync.py (one host per site, no tiny
guests), so `make test` reuses it where the order allows.

The unit tests at the end check the argv and config the drill builds,
without QEMU or Ceph.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cutpoint.checkers import pgcoord, pgdrill
from cutpoint.checkers.guestvm import DebianVM, GuestDisk, RbdImage
from cutpoint.lab.debian_image import Image

ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")


def _summary(rep: dict[str, Any]) -> str:
    return json.dumps([{k: d[k] for k in ("passed", "reasons",
                                         "rto_pg_ready_s", "dr_clones")}
                       | {"snap": d["snapshot"]["name"],
                          "pause_ms": d["snapshot"]["pause_ms"],
                          "spread_ms": d["snapshot"]["spread_ms"],
                          "amcheck_rc": d["check"]["amcheck_rc"],
                          "redo_done": d["check"]["redo_done"],
                          "journal_last": d["check"]["journal_last"],
                          "missing": d["check"]["missing"],
                          "replication": {
                              "bytes_shipped": d["replication"]["bytes_shipped"],
                              "seconds": d["replication"]["seconds"],
                              "members": [(m["disk"], m["full"], m["bytes_shipped"],
                                           m["state"], m["verified_full"])
                                          for m in d["replication"]["members"]]},
                          "recovery_log": d["check"]["recovery_log"]}
                       for d in rep["drills"]]
                      + [{"primary": rep["primary"], "cleanup": rep["cleanup"]}],
                      indent=1)


def _replicated_ok(d: dict[str, Any]) -> None:
    """Invariant 5 as the report shows it: every member verified at DR."""
    rep = d["replication"]
    assert rep["recovery_point"] and rep["state"] == "verified", rep
    assert len(rep["members"]) == len(pgdrill.GROUP), rep
    for m in rep["members"]:
        assert m["state"] == "verified" and m["verified_full"], m
    assert rep["bytes_shipped"] > 0, rep


@pytest.mark.lab
@ROOT
@pytest.mark.lab_config(**pgdrill.LAB)
def test_coordinated_group_snapshot_recovers(lab: dict[str, Any], tmp_path: Path) -> None:
    """One real group snapshot of the three RBD images (cutpointd, method
    rbd: pause, librbd snapshots, resume) under pgbench + ledger load,
    replicated to the DR cluster with full verification, cloned there and
    booted on the DR host: PostgreSQL logs 'redo done', pg_amcheck passes,
    every journaled ledger number is in the table; afterwards nothing the
    drill made is left on either cluster."""
    rep = pgdrill.run(lab, tmp_path / "drill", coordinated=1, uncoordinated=0,
                      interval=6, delay=0, rate=20)
    print(_summary(rep))
    d = rep["drills"][0]
    assert d["passed"], _summary(rep)
    c = d["check"]
    assert c["redo_done"] and c["amcheck_rc"] == 0
    # The load really ran: acknowledged ledger transactions were captured.
    assert c["journal_last"] > 0 and c["missing"] == 0
    assert any("redo done at" in line for line in c["recovery_log"])
    assert d["snapshot"]["name"].startswith("cp.pg.")
    assert d["snapshot"]["members"] == {s: "crash" for s, _ in pgdrill.GROUP}
    _replicated_ok(d)
    assert all(m["full"] for m in d["replication"]["members"])  # first copy
    assert d["dr_netns"] != rep["primary"]["netns"]
    assert all(c.endswith("-d0") for c in d["dr_clones"]), d["dr_clones"]
    assert rep["cleanup"]["left"] == {"primary": [], "dr": []}, rep["cleanup"]
    assert rep["cleanup"]["errors"] == [] and d["clone_errors"] == []
    html = (tmp_path / "drill" / "report.html").read_text()
    assert html.count("PASS") == 1 and "Replication to DR" in html


@pytest.mark.lab
@pytest.mark.slow
@ROOT
@pytest.mark.lab_config(**pgdrill.LAB)
def test_negative_control_wal_first_snapshots_fail(lab: dict[str, Any],
                                                   tmp_path: Path) -> None:
    """Negative control (issue 8 item 5): the WAL image is snapshotted
    first and the data + journal images 3 s later (rbd snapshots, no
    coordinator, no pause), while the ledger commits; each is replicated
    and drilled at DR.  The journal then shows acknowledgements whose WAL
    records are not in the WAL snapshot, so at least one of N trials must
    fail the check."""
    n = int(os.environ.get("CP_NEG_TRIALS", "3"))
    rep = pgdrill.run(lab, tmp_path / "neg", coordinated=0, uncoordinated=n,
                      interval=5, delay=3, rate=20)
    print(_summary(rep))    # the figures quoted in docs/drills.md (-s)
    for k, d in enumerate(rep["drills"]):
        _replicated_ok(d)
        # The first copy is full, the next ones incremental from the previous.
        assert all(m["full"] == (k == 0) for m in d["replication"]["members"]), d
    assert rep["cleanup"]["left"] == {"primary": [], "dr": []}, rep["cleanup"]
    failed = [d for d in rep["drills"] if not d["passed"]]
    assert failed, "every uncoordinated trial passed:\n" + _summary(rep)


# -- unit: what the drill hands QEMU and cutpointd (no QEMU, no Ceph) --

SITE = {"ceph_conf": "/lab/ceph/dr/ceph.conf", "keyring": "/lab/ceph/dr/k",
        "client_id": "admin", "pool": "rbd"}


def _image(tmp: Path) -> Image:
    return Image("debian-pg", "h", tmp, tmp / "root.raw", "raw", tmp / "vmlinuz",
                 tmp / "initrd.img", "console=ttyS0", {})


def test_rbd_disk_argv_uses_the_labs_blockdev(tmp_path: Path) -> None:
    disks = pgdrill.rbd_disks(SITE, {s: f"img-{s}" for s, _ in pgdrill.GROUP})
    vm = DebianVM(_image(tmp_path), tmp_path, disks, "cp.mode=check",
                  netns="dr-h1")
    argv = vm.argv()
    assert argv[:4] == ["ip", "netns", "exec", "dr-h1"]
    bds = [argv[i + 1] for i, a in enumerate(argv) if a == "-blockdev"]
    # root: local qcow2 overlay; then the three RBD images, nodes disk1..3
    assert bds[0].startswith("driver=file,filename=") and "node-name=disk0" in bds[1]
    assert bds[2:] == [f"driver=rbd,node-name=disk{i + 1},pool=rbd,image=img-{s},"
                       f"conf={SITE['ceph_conf']},user=admin"
                       for i, (s, _) in enumerate(pgdrill.GROUP)]
    assert vm.node_of == {"cproot": "disk0", "cpwal": "disk1", "cpdata": "disk2",
                          "cpjournal": "disk3"}
    assert "virtio-blk-pci,drive=disk2,serial=cpdata" in argv


def test_qcow2_disks_unchanged(tmp_path: Path) -> None:
    vm = DebianVM(_image(tmp_path), tmp_path, pgdrill.group_disks(tmp_path))
    argv = vm.argv()
    assert argv[0] == "qemu-system-x86_64"
    assert f"driver=file,filename={tmp_path / 'cpwal.qcow2'},node-name=file1," \
           "cache.direct=off" in argv
    assert "driver=qcow2,file=file1,node-name=disk1" in argv


def test_guest_disk_needs_exactly_one_backend(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="exactly one"):
        GuestDisk("cpwal")
    with pytest.raises(ValueError, match="exactly one"):
        GuestDisk("cpwal", tmp_path / "x", rbd=RbdImage(SITE, "x"))


def test_agent_config_for_rbd_disks(tmp_path: Path) -> None:
    """The cutpointd config of the drill: [ceph], method rbd, rbd: disks,
    the guest-agent socket; accepted by `cutpointd -n` (the agent's own
    config check, which does not touch the network)."""
    if not pgcoord.CUTPOINTD.exists():
        pytest.skip("cutpointd not built")
    certs = tmp_path / "certs"
    pgcoord.make_certs(certs)
    text = pgcoord.agent_config(
        tmp_path, certs, 7999, {"cp-pg": (tmp_path / "qmp.sock", {
            "disk1": "rbd:rbd/a-cpwal", "disk2": "rbd:rbd/a-cpdata"})},
        ceph=SITE, qga={"cp-pg": tmp_path / "qga.sock"})
    assert "[ceph]\nconf = /lab/ceph/dr/ceph.conf\nid = admin\nkeyring = /lab/ceph/dr/k" in text
    assert "method = rbd" in text and f"qga = {tmp_path / 'qga.sock'}" in text
    assert "disk.disk1 = rbd:rbd/a-cpwal\ndisk.disk2 = rbd:rbd/a-cpdata" in text
    conf = tmp_path / "cutpointd.conf"
    conf.write_text(text)
    chk = subprocess.run([str(pgcoord.CUTPOINTD), "-n", "-c", str(conf)],
                         capture_output=True, text=True, check=False)
    assert chk.returncode == 0, chk.stdout + chk.stderr
    # qcow2 files keep method qmp (the Cassandra drill)
    q = pgcoord.agent_config(tmp_path, certs, 7999, {"v": (tmp_path / "q", {
        "disk1": tmp_path / "a.qcow2"})})
    assert "method = qmp" in q and f"disk.disk1 = qcow2:{tmp_path / 'a.qcow2'}" in q
    assert "[ceph]" not in q


def test_agent_config_rejects_bad_disks(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not rbd:pool/image"):
        pgcoord.start(tmp_path, "cp-pg", tmp_path / "q", {"disk1": "rbd-a"}, ceph=SITE)
    with pytest.raises(ValueError, match="need the ceph site"):
        pgcoord.start(tmp_path, "cp-pg", tmp_path / "q", {"disk1": "rbd:rbd/a"})
    with pytest.raises(ValueError, match="guest-agent"):
        pgcoord.start(tmp_path, "cp-pg", tmp_path / "q", {"disk1": "rbd:rbd/a"},
                      ceph=SITE, quiesce="fs-freeze")


def test_report_html_shows_recovery_check_rto_and_replication() -> None:
    """render_html on the recorded console of a real passing drill VM
    (dr-tests/tests/data/pg_drill_console.log) and a replication record in
    the shape DrillImages.replicate returns."""
    from cutpoint.checkers.postgres import check_console
    console = (Path(__file__).parent / "data" / "pg_drill_console.log").read_text()
    c = check_console(console)
    rep = {"snapshot": "cp.pg.t1", "base": None, "state": "verified",
           "recovery_point": True, "bytes_shipped": 123456789, "seconds": 9.5,
           "members": [{"disk": f"cp-pg/disk{i + 1}", "image": f"p-{s}", "full": True,
                        "state": "verified", "verified_full": True,
                        "bytes_shipped": 1000 * (i + 1), "bytes_changed": 0,
                        "seconds": 3.0} for i, (s, _) in enumerate(pgdrill.GROUP)]}
    report = {"primary": {"boot_to_ledger_s": 70.0}, "cleanup": {"left": {}},
              "drills": [{"passed": c.passed, "reasons": c.reasons,
                          "rto_pg_ready_s": 61.2, "rto_check_done_s": 90.0,
                          "check": c.as_dict(), "replication": rep,
                          "dr_clones": ["rbd/p-cpwal-d0"],
                          "snapshot": pgdrill.Snap("cp.pg.t1", "coordinator", 0.0, 25.0,
                                                   12.0, 40).__dict__}]}
    page = pgdrill.render_html(report)
    assert c.passed and "PASS" in page
    assert "redo done at" in page and "61.2 s" in page
    assert "123,456,789 B" in page and "(full SHA-256)" in page
    assert page.count("<td>full</td>") == len(pgdrill.GROUP)
    assert "rbd/p-cpwal-d0" in page
