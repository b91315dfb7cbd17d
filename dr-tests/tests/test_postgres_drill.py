"""PostgreSQL recovery drill at DR, through the product (issue 8 item 2,
issue 18 item 4; `make drills`).

Real parts only: the lab in libvirt mode (its two Ceph clusters, a
libvirtd and a cutpointd per host), the mmdebstrap image (built once,
cached by recipe hash), PostgreSQL 15 with pgbench and the ledger client
in the guest.  The PostgreSQL VM is a libvirt domain at the primary with
RBD disks; its definition is captured by the control plane; the group
snapshot is the product's (`cutpoint snapshot`, the agent's librbd
snapshots), replicated by the product with a full verification; the drill
is asked for as an operator asks for one, `cutpoint drill run` against the
product's server (`cutpoint server --embedded`), and run by its worker
(clones at DR, the captured definition rewritten onto the isolated drill bridge
and signed, started by the DR agent, ready by guest-ping) with the
`postgres` check (pg_isready, pg_amcheck, and the ledger query: every
journaled acknowledgement is a row).  cutpoint.checkers.pgproduct says
what runs.  The negative control takes the snapshots without the
coordinator, the WAL disk 3 s before the others, and must fail the same
drill.

The unit tests at the end check the ledger query on a real PostgreSQL (no
lab), and the argv and config of the qcow2/QMP drill helpers that the
quiesce bench still uses, without QEMU or Ceph.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from cutpoint.checkers import dbdrill, pgcoord, pgdrill, pgproduct
from cutpoint.checkers.guestvm import DebianVM, GuestDisk, RbdImage
from cutpoint.lab.debian_image import Image

ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
PG_BIN = Path("/usr/lib/postgresql/15/bin")


def _summary(rep: dict[str, Any]) -> str:
    return json.dumps({"primary": {k: v for k, v in rep["primary"].items()
                                   if k != "definition_captured"},
                       "drills": [{k: d[k] for k in ("verdict", "error", "rto_s", "point_age_s",
                                                     "breakdown", "checks", "left", "cleanup")}
                                  | {"snapshot": d["snapshot"],
                                     "replicated": {k: d["replication"][k] for k in
                                                    ("bytes_shipped", "seconds", "base")}}
                                  for d in rep["drills"]],
                       "cleanup": rep["cleanup"]}, indent=1, default=str)


def _common(rep: dict[str, Any], d: dict[str, Any]) -> None:
    """What every drill of a run must show, passed or not: a DR recovery
    point (every member verified in full), nothing of the drill left at DR."""
    r = d["replication"]
    assert r["recovery_point"] and r["state"] == "verified", r
    assert len(r["members"]) == len(pgdrill.GROUP) + 1, r  # + the root
    assert all(m["state"] == "verified" and m["verified_full"] for m in r["members"]), r
    assert d["cleanup"]["ok"], d["cleanup"]
    assert d["left"] == {"domains": [], "clones": [], "taps": []}, d["left"]


@pytest.fixture(scope="module")
def pg_run(lab_session: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run for both tests below (one primary boot, one lab): a
    coordinated group snapshot, then CP_NEG_TRIALS (2) uncoordinated ones,
    each replicated and drilled through the control plane."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    lab = lab_session.get(dict(dbdrill.LAB))
    n = int(os.environ.get("CP_NEG_TRIALS", "2"))
    rep = pgproduct.run(lab, tmp_path_factory.mktemp("pgdrill"), coordinated=1,
                        uncoordinated=n, interval=6, delay=3, rate=20)
    print(_summary(rep))    # the figures quoted in docs/drills.md (-s)
    return rep


@pytest.mark.lab
@pytest.mark.slow
@ROOT
def test_coordinated_group_snapshot_recovers(pg_run: dict[str, Any]) -> None:
    """A group snapshot through the product under pgbench + ledger load,
    replicated (the first copy: full), drilled by the control plane's job:
    PostgreSQL recovers (its log in the report), pg_amcheck is clean, every
    journaled ledger number is a row, the journal is not empty; nothing
    left anywhere."""
    rep = pg_run
    d = rep["drills"][0]
    _common(rep, d)
    assert d["verdict"] == "passed" and d["error"] is None, _summary(rep)
    assert [b["group"] for b in d["boot_order"]] == ["db"], d["boot_order"]
    assert [c["ok"] for c in d["checks"]] == [True, True, True], d["checks"]
    assert "ledger-prefix-ok" in d["outputs"][0] and "pg_amcheck" in d["outputs"][0]
    assert "redo done at" in d["outputs"][2], d["outputs"][2]
    assert d["snapshot"]["name"].startswith("cp.pg.") and d["snapshot"]["mode"] == "coordinated"
    assert all(m["full"] for m in d["replication"]["members"])  # the first copy
    assert d["rto_s"] is not None and d["breakdown"]["boot_to_guest_ping_s"] is not None
    assert rep["primary"]["definition_captured"].startswith("<domain")
    assert rep["cleanup"]["left"] == {"primary": [], "dr": []}, rep["cleanup"]


@pytest.mark.lab
@pytest.mark.slow
@ROOT
def test_negative_control_wal_first_snapshots_fail(pg_run: dict[str, Any]) -> None:
    """Negative control (issue 8 item 5) through the same path: the WAL
    image is snapshotted first and the others 3 s later (rbd snapshots, no
    coordinator, no pause) while the ledger commits; each is recorded,
    replicated (incrementally) and drilled like a recovery point.
    PostgreSQL still recovers, but the ledger query finds journaled
    acknowledgements that are not rows, so at least one of N trials must
    fail the drill, and each failure must be the ledger query's."""
    rep = pg_run
    neg = [d for d in rep["drills"] if d["snapshot"]["mode"] == "uncoordinated"]
    assert neg, rep
    for d in neg:
        _common(rep, d)
        assert not any(m["full"] for m in d["replication"]["members"]), d  # incremental
    failed = [d for d in neg if d["verdict"] != "passed"]
    assert failed, "every uncoordinated trial passed:\n" + _summary(rep)
    assert all(d["verdict"] == "failed" for d in failed)
    for d in failed:
        # the ledger query's failure, or PostgreSQL refused to start (a
        # checkpoint in the gap: its control file names WAL the WAL
        # snapshot lacks), which fails the plan's post hook
        if d["error"] is None:
            assert d["checks"][0]["ok"] is False, d["checks"]
            assert "ledger-prefix-bad" in d["checks"][0]["summary"], d["checks"][0]
        else:
            assert "boot group db" in d["error"], d["error"]
    assert rep["cleanup"]["left"] == {"primary": [], "dr": []}, rep["cleanup"]


# -- unit: the ledger query on a real PostgreSQL (no lab) --

@pytest.fixture
def pg(tmp_path: Path) -> Any:
    """A throw-away PostgreSQL 15 cluster on a unix socket; psql(sql) runs as
    postgres."""
    if os.geteuid() != 0 or not (PG_BIN / "initdb").exists():
        pytest.skip("needs root and PostgreSQL 15")
    d = Path(f"/tmp/cp-pgq-{os.getpid()}-{time.monotonic_ns()}")
    d.mkdir()
    shutil.chown(d, "postgres")
    as_pg = ["runuser", "-u", "postgres", "--"]
    port = str(40000 + os.getpid() % 20000)  # a unix socket only: the name, no TCP
    subprocess.run([*as_pg, str(PG_BIN / "initdb"), "-D", str(d / "data"), "-A", "trust",
                    "-U", "postgres"], check=True, capture_output=True)
    subprocess.run([*as_pg, str(PG_BIN / "pg_ctl"), "-D", str(d / "data"), "-w", "-l",
                    str(d / "log"), "-o", f"-k {d} -p {port} -c listen_addresses=''", "start"],
                   check=True, capture_output=True)

    def psql(sql: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*as_pg, "psql", "-h", str(d), "-p", port, "-AtX", "-v",
                               "ON_ERROR_STOP=1", "-c", sql], check=False, capture_output=True,
                              text=True)
    try:
        yield d, psql
    finally:
        subprocess.run([*as_pg, str(PG_BIN / "pg_ctl"), "-D", str(d / "data"), "-m",
                        "immediate", "stop"], check=False, capture_output=True)
        shutil.rmtree(d, ignore_errors=True)


def test_ledger_query_passes_on_a_prefix_and_fails_otherwise(pg: Any) -> None:
    """The operator query of the drill's `postgres` check, on a real
    PostgreSQL: a journal that is a prefix of the ledger passes (also with a
    torn, zero-filled last record); journaled numbers missing from the
    ledger, a gap in the journal and an empty journal each fail, saying
    which."""
    d, psql = pg
    journal = d / "ledger.journal"
    query = pgproduct.LEDGER_QUERY.replace(pgproduct.JOURNAL, str(journal))
    assert psql("CREATE TABLE ledger (id bigint PRIMARY KEY)").returncode == 0
    assert psql("INSERT INTO ledger SELECT generate_series(1, 100)").returncode == 0

    def run(data: bytes) -> str:
        journal.write_bytes(data)
        journal.chmod(0o644)
        r = psql(query)
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    recs = b"".join(b"%015d\n" % i for i in range(1, 101))
    assert run(recs) == "ledger-prefix-ok"
    assert run(recs + b"\0" * 16) == "ledger-prefix-ok"
    assert run(recs + b"".join(b"%015d\n" % i for i in range(101, 121))) == \
        "ledger-prefix-bad journal=120 in-order=t missing=20"
    assert run(b"".join(b"%015d\n" % i for i in (1, 2, 4))) == \
        "ledger-prefix-bad journal=3 in-order=f missing=0"
    assert run(b"") == "ledger-prefix-bad journal=0 in-order=f missing=0"


def test_drill_plan_and_checks_parse() -> None:
    from cutpoint.coordinator.dr.checks import CheckSpec, known
    from cutpoint.coordinator.dr.plan import RecoveryPlan

    plan = RecoveryPlan.parse(pgproduct.PLAN)
    assert [g.name for g in plan.boot_groups] == ["db"]
    assert plan.boot_groups[0].post[0].vm == pgproduct.VM
    specs = [CheckSpec.parse(c) for c in pgproduct.CHECKS]
    assert [c.name for c in specs] == ["postgres", "guest-exec", "guest-exec"]
    assert all(c.name in known() for c in specs)
    assert specs[0].params["expect"] == "ledger-prefix-ok"


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


def test_db_vm_domain_is_one_a_drill_can_start(tmp_path: Path) -> None:
    """The PostgreSQL VM's domain (dbdrill.domain_xml) is one the control
    plane signs for a drill: every disk RBD (the root too), each group disk
    with its serial; rewritten onto the drill bridge with the drill's clones."""
    from cutpoint.api.services.vmdef_policy import SitePolicy
    from cutpoint.api.services.vmdef_rewrite import DrTarget, rbd_images, rewrite

    vm = dbdrill.DbVM(pgproduct.VM, "primary-h1", dict(pgdrill.GROUP))
    vm.images = {s: f"p-{s}" for s in vm.targets()}
    site = {"mon_addrs": ["v2:10.77.0.1:3300", "v1:10.77.0.1:6789"]}
    xml = dbdrill.domain_xml(vm, _image(tmp_path), site, {"user": "cutpoint", "uuid":
                             "0b0e5b3c-0000-4000-8000-000000000001"}, "/lab/ceph.conf",
                             tmp_path / "console", "rbd")
    assert rbd_images(xml) == [f"rbd/p-{s}" for s in ("cproot", "cpwal", "cpdata",
                                                      "cpjournal")]
    assert "<serial>cpwal</serial>" in xml and "cp.mode=idle" in xml
    out = rewrite(xml, DrTarget(pool="rbd", mon_hosts=(("10.77.0.2", 6789),),
                                auth_user="cutpoint", secret_uuid="0b0e5b3c-0000-4000-8000-"
                                "000000000002", name="drill-1234abcd-cp-pg", uuid="",
                                images={f"rbd/p-{s}": f"rbd/drill-1234abcd-p-{s}"
                                        for s in vm.targets()},
                                isolate="cpdrill0", taps="d1234abcd00",
                                # the DR site lets it name the image's kernel
                                # and initrd (vmdef_policy; DbDrillBed's boot_paths)
                                policy=SitePolicy(boot_paths=(str(tmp_path),))))
    assert rbd_images(out) == [f"rbd/drill-1234abcd-p-{s}" for s in vm.targets()]
    assert "<source bridge=\"cpdrill0\"" in out or "<source bridge='cpdrill0'" in out
    assert "<serial>cpjournal</serial>" in out and vm.mac not in out
