"""Ceph site access against the lab's real clusters (cephx on, no VMs).

The control plane's client is `client.cutpoint` (rbd profiles on the pool);
`client.cutpoint-ro` may only read.  Each test starts from a fresh image,
does one thing, and checks the result with an independent reader where
there is one: the `rbd` CLI as client.admin (`rbd export | sha256sum`,
`rbd snap ls`).  Fault tests stop one daemon with SIGSTOP (as a wedged or
partitioned daemon looks to a client), expect exactly one typed error
within the deadline, and restore the daemon.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import rados
import rbd
from cutpoint.coordinator.dr import ceph_errors as CE
from cutpoint.coordinator.dr.site import CephConnection, CephSite
from cutpoint.coordinator.dr.site_check import SCRATCH_PREFIX, check_site

pytestmark = [pytest.mark.lab, pytest.mark.lab_config(hosts=1, vms_per_host=0)]

MiB = 1 << 20
OP_TIMEOUT = 5  # seconds, for the fault tests


def ceph_site(lab: dict[str, Any], name: str = "dr", role: str = "cutpoint",
              **kw: Any) -> CephSite:
    s = lab["sites"][name]
    c = s["clients"][role]
    return CephSite(name, pools={"rbd": s["pool"]}, ceph_conf=s["ceph_conf"],
                    client_id=c["client_id"], keyring=c["keyring"], **kw)


def admin_rbd(lab: dict[str, Any], *args: str, site: str = "dr") -> str:
    s = lab["sites"][site]
    cp = subprocess.run(["rbd", "-c", s["ceph_conf"], "--id", "admin", "--keyring",
                         s["keyring"], *args], capture_output=True, text=True, timeout=120,
                        check=True)
    return cp.stdout


def export_sha256(lab: dict[str, Any], spec: str) -> str:
    s = lab["sites"]["dr"]
    cp = subprocess.run(["rbd", "-c", s["ceph_conf"], "--id", "admin", "--keyring",
                         s["keyring"], "export", "--no-progress", spec, "-"],
                        capture_output=True, timeout=300, check=True)
    return hashlib.sha256(cp.stdout).hexdigest()


@pytest.fixture
def ceph(lab: dict[str, Any]) -> Iterator[CephConnection]:
    with CephConnection(ceph_site(lab)) as c:
        yield c


@pytest.fixture
def image(lab: dict[str, Any]) -> Iterator[str]:
    """A fresh image name at DR; it and its clones and snapshots go afterwards."""
    name = f"site-{uuid.uuid4().hex[:8]}"
    yield name
    s = lab["sites"]["dr"]
    out = admin_rbd(lab, "ls", "--format", "json", s["pool"])
    for img in sorted(json.loads(out), key=len, reverse=True):  # clones first
        if img.startswith(name):
            spec = f"{s['pool']}/{img}"
            for snap in json.loads(admin_rbd(lab, "snap", "ls", "--format", "json", spec)):
                if snap.get("protected") == "true":
                    admin_rbd(lab, "snap", "unprotect", f"{spec}@{snap['name']}")
            admin_rbd(lab, "snap", "purge", "--no-progress", spec)
            admin_rbd(lab, "rm", "--no-progress", spec)


# Block table: (pattern byte, offset, length), QEMU iotests style.
BEFORE = [(0x11, 0, 64 * 1024), (0x22, 5 * MiB, 4096), (0x33, 12 * MiB - 512, 512)]
AFTER = [(0x44, 4096, 8192), (0x55, 9 * MiB, 1 * MiB)]


def write_table(ceph: CephConnection, image: str, table: list[tuple[int, int, int]]) -> None:
    for byte, off, n in table:
        ceph.write("rbd", image, off, bytes([byte]) * n)


# -- images -------------------------------------------------------------------------
def test_create_list_info_and_remove_an_image(ceph: CephConnection, image: str,
                                               lab: dict[str, Any]) -> None:
    assert not ceph.image_exists("rbd", image)
    ceph.create_image("rbd", image, 12 * MiB)
    assert image in ceph.list_images("rbd")
    assert image in json.loads(admin_rbd(lab, "ls", "--format", "json", "rbd"))
    info = ceph.image_info("rbd", image)
    assert (info.size, info.object_size, info.parent) == (12 * MiB, 4 * MiB, None)
    assert info.features & rbd.RBD_FEATURE_EXCLUSIVE_LOCK
    assert ceph.image_exists("rbd", image)
    ceph.remove_image("rbd", image)
    assert not ceph.image_exists("rbd", image)
    assert image not in ceph.list_images("rbd")


def test_a_missing_image_is_not_found(ceph: CephConnection) -> None:
    for call in (lambda: ceph.image_info("rbd", "no-such-image"),
                 lambda: ceph.snapshots("rbd", "no-such-image"),
                 lambda: ceph.remove_image("rbd", "no-such-image"),
                 lambda: ceph.metadata_get("rbd", "no-such-image", "k")):
        with pytest.raises(CE.CephNotFound) as ei:
            call()
        assert ei.value.errno == errno.ENOENT and "rbd/no-such-image" in ei.value.obj
        assert ei.value.code == "ceph_not_found"


def test_an_existing_image_or_snapshot_is_exists(ceph: CephConnection, image: str) -> None:
    ceph.create_image("rbd", image, 4 * MiB)
    with pytest.raises(CE.CephExists) as ei:
        ceph.create_image("rbd", image, 4 * MiB)
    assert ei.value.op == "create image" and ei.value.errno == errno.EEXIST
    ceph.create_snapshot("rbd", image, "s1")
    with pytest.raises(CE.CephExists) as ei:
        ceph.create_snapshot("rbd", image, "s1")
    assert ei.value.obj == f"rbd/{image}@s1" and ei.value.code == "ceph_exists"
    assert [s.name for s in ceph.snapshots("rbd", image)] == ["s1"]


def test_a_missing_pool_is_not_found(lab: dict[str, Any]) -> None:
    s = ceph_site(lab)
    gone = CephSite("dr", pools={"gone": "no-such-pool"}, ceph_conf=s.ceph_conf,
                    client_id=s.client_id, keyring=s.keyring)
    with CephConnection(gone) as c, pytest.raises(CE.CephNotFound) as ei:
        c.list_images("gone")
    assert (ei.value.op, ei.value.obj) == ("open pool", "no-such-pool")


# -- snapshots ----------------------------------------------------------------------
def test_snapshots_list_in_creation_order_with_ids(ceph: CephConnection, image: str,
                                                   lab: dict[str, Any]) -> None:
    ceph.create_image("rbd", image, 4 * MiB)
    made = [ceph.create_snapshot("rbd", image, n) for n in ("cp.g.c", "cp.g.a", "cp.g.b")]
    got = ceph.snapshots("rbd", image)
    assert [s.name for s in got] == ["cp.g.c", "cp.g.a", "cp.g.b"]  # not by name
    assert [s.id for s in got] == [m.id for m in made] == sorted(m.id for m in made)
    cli = json.loads(admin_rbd(lab, "snap", "ls", "--format", "json", f"rbd/{image}"))
    assert {s["name"]: s["id"] for s in cli} == {s.name: s.id for s in got}
    ceph.remove_snapshot("rbd", image, "cp.g.a")
    ceph.remove_snapshot_by_id("rbd", image, made[0].id)
    assert [s.name for s in ceph.snapshots("rbd", image)] == ["cp.g.b"]
    with pytest.raises(CE.CephNotFound):
        ceph.remove_snapshot("rbd", image, "cp.g.a")


def test_snapshot_data_diff_rollback_and_sha256(ceph: CephConnection, image: str,
                                                lab: dict[str, Any]) -> None:
    """Write, snapshot, overwrite; the snapshot keeps the old data, the head has
    the new; the diff is the overwrite; rollback brings the old data back."""
    ceph.create_image("rbd", image, 12 * MiB)
    write_table(ceph, image, BEFORE)
    ceph.create_snapshot("rbd", image, "s1")
    assert not ceph.changed_since("rbd", image, "s1")
    write_table(ceph, image, AFTER)
    assert ceph.changed_since("rbd", image, "s1")
    for byte, off, n in BEFORE:
        want = bytes([byte]) * n
        for b2, o2, n2 in AFTER:  # the head shows AFTER where they overlap
            lo, hi = max(off, o2), min(off + n, o2 + n2)
            if lo < hi:
                want = want[:lo - off] + bytes([b2]) * (hi - lo) + want[hi - off:]
        assert ceph.read("rbd", image, off, n, snap="s1") == bytes([byte]) * n
        assert ceph.read("rbd", image, off, n) == want
    extents = [e for e in ceph.diff("rbd", image, "s1") if e.exists]
    for _b, off, n in AFTER:
        assert any(e.offset <= off and off + n <= e.offset + e.length for e in extents), extents
    assert not any(e.offset <= 5 * MiB < e.offset + e.length for e in extents), extents
    s1, head = ceph.sha256("rbd", image, "s1"), ceph.sha256("rbd", image)
    assert s1 == export_sha256(lab, f"rbd/{image}@s1")
    assert head == export_sha256(lab, f"rbd/{image}")
    assert s1 != head
    ceph.rollback("rbd", image, "s1")
    assert ceph.sha256("rbd", image) == s1 == export_sha256(lab, f"rbd/{image}")


def test_protect_clone_and_unprotect(ceph: CephConnection, image: str) -> None:
    ceph.create_image("rbd", image, 8 * MiB)
    write_table(ceph, image, BEFORE[:2])
    ceph.create_snapshot("rbd", image, "rp")
    assert not ceph.is_protected("rbd", image, "rp")
    ceph.protect("rbd", image, "rp")
    assert ceph.is_protected("rbd", image, "rp")
    clone = f"{image}-clone"
    ceph.clone("rbd", image, "rp", clone)
    assert ceph.image_info("rbd", clone).parent == f"rbd/{image}@rp"
    assert ceph.sha256("rbd", clone) == ceph.sha256("rbd", image, "rp")
    ceph.write("rbd", clone, 0, b"\x99" * 4096)  # copy-on-write: the parent keeps its data
    assert ceph.read("rbd", image, 0, 4096, snap="rp") == b"\x11" * 4096
    with pytest.raises(CE.CephError) as ei:  # a protected snapshot with a child
        ceph.unprotect("rbd", image, "rp")
    assert ei.value.errno == errno.EBUSY
    ceph.remove_image("rbd", clone)
    ceph.unprotect("rbd", image, "rp")
    assert not ceph.is_protected("rbd", image, "rp")


# -- locks and metadata -----------------------------------------------------------------
def test_an_open_writer_is_listed_as_locker_until_it_closes(ceph: CephConnection, image: str,
                                                            lab: dict[str, Any]) -> None:
    ceph.create_image("rbd", image, 4 * MiB)
    assert ceph.lockers("rbd", image) == []
    s = lab["sites"]["dr"]
    with rados.Rados(conffile=s["ceph_conf"], rados_id="admin",
                     conf={"keyring": s["keyring"]}) as cluster, \
            cluster.open_ioctx(s["pool"]) as io, rbd.Image(io, image) as writer:
        writer.write(b"w" * 4096, 0)  # takes the exclusive lock
        held = ceph.lockers("rbd", image)
        assert len(held) == 1 and held[0].cookie.startswith("auto ") and held[0].exclusive
    assert ceph.lockers("rbd", image) == []


def test_image_metadata(ceph: CephConnection, image: str, lab: dict[str, Any]) -> None:
    ceph.create_image("rbd", image, 4 * MiB)
    assert ceph.metadata_get("rbd", image, "cutpoint.txn") is None
    ceph.metadata_set("rbd", image, "cutpoint.txn", "0190abcd")
    assert ceph.metadata_get("rbd", image, "cutpoint.txn") == "0190abcd"
    assert admin_rbd(lab, "image-meta", "get", f"rbd/{image}", "cutpoint.txn").strip() \
        == "0190abcd"


# -- caps -------------------------------------------------------------------------------
def test_a_read_only_client_writing_is_permission_denied(lab: dict[str, Any], image: str,
                                                         ceph: CephConnection) -> None:
    ceph.create_image("rbd", image, 4 * MiB)
    ceph.write("rbd", image, 0, b"\x42" * 4096)
    before = ceph.sha256("rbd", image)
    with CephConnection(ceph_site(lab, role="readonly")) as ro:
        assert image in ro.list_images("rbd")  # reading is allowed
        assert ro.sha256("rbd", image) == before
        for op, call in (("create image", lambda: ro.create_image("rbd", f"{image}-x", MiB)),
                         ("create snapshot", lambda: ro.create_snapshot("rbd", image, "s")),
                         ("write", lambda: ro.write("rbd", image, 0, b"\x00" * 4096)),
                         ("set metadata", lambda: ro.metadata_set("rbd", image, "k", "v"))):
            with pytest.raises(CE.CephPermissionDenied) as ei:
                call()
            assert ei.value.op == op and ei.value.errno in (errno.EPERM, errno.EACCES)
            assert ei.value.code == "ceph_permission_denied"
    assert ceph.sha256("rbd", image) == before
    assert ceph.snapshots("rbd", image) == []
    assert not ceph.image_exists("rbd", f"{image}-x")


def test_no_key_in_errors_or_check_results(lab: dict[str, Any]) -> None:
    """The site holds the keyring's path; the key appears in nothing it returns."""
    s = lab["sites"]["dr"]
    keys = [line.split("=", 1)[1].strip()
            for role in ("cutpoint", "readonly")
            for line in Path(s["clients"][role]["keyring"]).read_text().splitlines()
            if line.strip().startswith("key")]
    assert len(keys) == 2
    texts = [repr(ceph_site(lab)), json.dumps(ceph_site(lab).librados_conf())]
    for role in ("cutpoint", "readonly"):
        texts.append(json.dumps(check_site(ceph_site(lab, role=role),
                                           replication_target=True).as_dict()))
    with CephConnection(ceph_site(lab, role="readonly")) as ro:
        try:
            ro.create_image("rbd", "never", MiB)
        except CE.CephError as exc:
            texts += [str(exc), json.dumps(exc.as_dict())]
    for key in keys:
        assert not any(key in t for t in texts)


# -- deadlines ---------------------------------------------------------------------------
SERVE_AGAIN_S = 180  # after SIGCONT, the most a busy machine may take to serve again


def admin_ceph(lab: dict[str, Any], *args: str, timeout: float = 30) -> str:
    s = lab["sites"]["dr"]
    cp = subprocess.run(["ceph", "-c", s["ceph_conf"], "--id", "admin", "--keyring",
                         s["keyring"], "--connect-timeout", "10", *args],
                        check=False, capture_output=True, text=True, timeout=timeout)
    return (cp.stdout + cp.stderr).strip()


def cluster_state(lab: dict[str, Any]) -> str:
    """What the DR cluster says about itself, for an assertion message: health,
    the PG states and the OSD's blocked requests (via its admin socket)."""
    out = []
    for args in (("health", "detail"), ("pg", "stat"), ("osd", "stat"),
                 ("daemon", "osd.0", "dump_blocked_ops")):
        try:
            out.append(f"$ ceph {' '.join(args)}\n{admin_ceph(lab, *args)}")
        except subprocess.TimeoutExpired:
            out.append(f"$ ceph {' '.join(args)}: no answer in 30 s")
    return "\n".join(out)


def serves(lab: dict[str, Any], image: str | None) -> None:
    """One round of the serving check; raises CephError when it does not serve.
    A fresh session (mon) creates a probe image, writes it, reads it back
    (OSD) and removes it; then, if the test has an image, a fresh session
    reads it, because one PG can still be blocked while the probe's serves."""
    probe = f"site-probe-{uuid.uuid4().hex[:8]}"
    data = b"\x5a" * 4096
    with CephConnection(ceph_site(lab, connect_timeout_s=10, op_timeout_s=10)) as c:
        c.create_image("rbd", probe, MiB)
        try:
            c.write("rbd", probe, 0, data)
            got = c.read("rbd", probe, 0, len(data))
        finally:
            c.remove_image("rbd", probe)
        assert got == data, "the probe read back other data"
        if image is not None and c.image_exists("rbd", image):
            c.snapshots("rbd", image)
            c.read("rbd", image, 0, 4096)


def wait_serving(lab: dict[str, Any], image: str | None = None,
                 timeout_s: float = SERVE_AGAIN_S) -> float:
    """Until the DR cluster serves again, twice in a row (`serves`).  A daemon
    resumed from SIGSTOP first works off what queued up meanwhile (timed-out
    requests, heartbeats, a mon session to renew); on a loaded machine that
    can take longer than a fault test's short timeout, and the next test must
    not start before.  Returns the seconds it took; on a timeout the
    assertion carries the cluster's own account (`cluster_state`)."""
    t0 = time.monotonic()
    last: Exception | None = None
    good = 0
    while True:
        try:
            serves(lab, image)
            good += 1
            if good == 2:
                return time.monotonic() - t0
            continue
        except CE.CephError as exc:
            last, good = exc, 0
        if time.monotonic() - t0 > timeout_s:
            raise AssertionError(f"the DR cluster does not serve {timeout_s:.0f} s after "
                                 f"SIGCONT: {last}\n{cluster_state(lab)}")
        time.sleep(1)


def stopped(lab: dict[str, Any], daemon: str, image: str | None = None) -> Any:
    """Context: the DR daemon under SIGSTOP; on the way out, whatever happens,
    SIGCONT and then wait until the cluster serves again (wait_serving),
    the test's `image` included."""
    import contextlib

    pid = lab["sites"]["dr"]["pids"][daemon]

    @contextlib.contextmanager
    def cm() -> Iterator[None]:
        os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(pid, signal.SIGCONT)
            took = wait_serving(lab, image)
            print(f"{daemon} resumed: the DR cluster serves again after {took:.1f} s")

    return cm()


def test_a_stopped_mon_times_out_within_the_deadline(lab: dict[str, Any], image: str) -> None:
    """Snapshot ids come from the mon: with the mon stopped, create_snapshot
    fails at rados_mon_op_timeout with CephTimeout; then the mon is back."""
    site = ceph_site(lab, op_timeout_s=OP_TIMEOUT)
    with CephConnection(site) as c:
        c.create_image("rbd", image, 4 * MiB)
        with stopped(lab, "mon.a"):
            t0 = time.monotonic()
            with pytest.raises(CE.CephTimeout) as ei:
                c.create_snapshot("rbd", image, "s1")
            took = time.monotonic() - t0
        print(f"stopped mon: create snapshot -> {ei.value.code} errno {ei.value.errno} "
              f"after {took:.2f} s (op_timeout_s {OP_TIMEOUT}, bound {site.call_bound_s()} s)")
        # librados's own timeout answered, not the runner's bound.
        assert ei.value.errno == errno.ETIMEDOUT
        assert OP_TIMEOUT - 0.5 <= took < OP_TIMEOUT + 3, took
        c.create_snapshot("rbd", image, "s2")  # the mon answers again
        assert "s2" in [s.name for s in c.snapshots("rbd", image)]


def test_connecting_while_the_mon_is_stopped_is_unreachable(lab: dict[str, Any]) -> None:
    site = ceph_site(lab, connect_timeout_s=OP_TIMEOUT)
    with stopped(lab, "mon.a"):
        t0 = time.monotonic()
        with pytest.raises(CE.CephUnreachable) as ei:
            CephConnection(site).connect()
        took = time.monotonic() - t0
    print(f"stopped mon: connect -> {ei.value.code} errno {ei.value.errno} after {took:.2f} s "
          f"(connect_timeout_s {OP_TIMEOUT})")
    assert ei.value.errno == errno.ETIMEDOUT
    assert OP_TIMEOUT - 0.5 <= took < OP_TIMEOUT + 3, took


def test_a_stopped_osd_times_out_within_the_deadline(lab: dict[str, Any], image: str) -> None:
    """Each call meets a stopped OSD on its own: one stop per call keeps each
    stop near op_timeout_s, well under the OSD's own thread timeouts (15 s),
    so what is measured is the client's deadline and not an OSD that has
    declared itself unhealthy after a long stall."""
    site = ceph_site(lab, op_timeout_s=OP_TIMEOUT)
    took: dict[str, float] = {}
    with CephConnection(site) as c:
        c.create_image("rbd", image, 4 * MiB)
        c.write("rbd", image, 0, b"\x77" * 4096)
        for name, call in (("list images", lambda: c.list_images("rbd")),
                           ("list snapshots", lambda: c.snapshots("rbd", image)),
                           ("write", lambda: c.write("rbd", image, 0, b"\x00" * 4096)),
                           ("sha256", lambda: c.sha256("rbd", image))):
            with stopped(lab, "osd.0", image):
                t0 = time.monotonic()
                with pytest.raises(CE.CephTimeout) as ei:
                    call()
                took[name] = time.monotonic() - t0
            assert ei.value.errno == errno.ETIMEDOUT, (name, ei.value)
    print("stopped osd: " + ", ".join(f"{k} {v:.2f} s" for k, v in took.items())
          + f" (op_timeout_s {OP_TIMEOUT})")
    for name, t in took.items():
        assert OP_TIMEOUT - 0.5 <= t < OP_TIMEOUT + 3, (name, t)
    # The OSD is back: a new session reads the data, and the failed write
    # changed nothing.
    with CephConnection(ceph_site(lab)) as c:
        assert c.read("rbd", image, 0, 4096) == b"\x77" * 4096


# -- the site check -------------------------------------------------------------------------
@pytest.mark.parametrize("target", [True, False])
def test_the_site_check_passes_with_the_cutpoint_client(lab: dict[str, Any],
                                                        target: bool) -> None:
    r = check_site(ceph_site(lab), replication_target=target)
    print(json.dumps(r.as_dict(), indent=1))
    assert r.ok and r.failed is None
    names = [s.name for s in r.steps]
    want = ["connect", "pool_exists", "create_image", "create_snapshot", "snapshot_latency",
            "write", "diff", "remove_snapshot", "remove_image"]
    assert names == [n for n in want if target or n != "write"]
    assert all(s.status == "pass" for s in r.steps)
    with CephConnection(ceph_site(lab)) as c:
        assert not [i for i in c.list_images("rbd") if i.startswith(SCRATCH_PREFIX)]


def test_the_site_check_names_create_image_for_a_read_only_client(lab: dict[str, Any]) -> None:
    r = check_site(ceph_site(lab, role="readonly"), replication_target=True)
    assert not r.ok
    assert r.failed is not None
    assert (r.failed.name, r.failed.pool, r.failed.code) == \
        ("create_image", "rbd", "ceph_permission_denied")
    assert [s.status for s in r.steps[:3]] == ["pass", "pass", "fail"]
    assert all(s.status == "skip" for s in r.steps[3:])
    assert r.as_dict()["failed_check"] == "create_image"


def test_the_site_check_names_a_missing_pool(lab: dict[str, Any]) -> None:
    s = ceph_site(lab)
    site = CephSite("dr", pools={"rbd": "rbd", "db": "no-such-pool"}, ceph_conf=s.ceph_conf,
                    client_id=s.client_id, keyring=s.keyring)
    r = check_site(site, replication_target=True)
    assert not r.ok
    assert r.failed is not None
    assert (r.failed.name, r.failed.pool, r.failed.code) == \
        ("pool_exists", "db", "ceph_not_found")
    assert "no-such-pool" in r.failed.detail
    assert all(st.status == "pass" for st in r.steps if st.pool == "rbd")


# The mon settings of each recording: the lab's tuned paxos, then +500 ms
# of propose interval (cutpoint.lab.backend_latency), as production's
# default-ish mons.
LATENCY_CASES = [(0, "site_check_tuned.json"), (500, "site_check_paxos500.json")]


@pytest.mark.parametrize(("added_ms", "recording"), LATENCY_CASES)
def test_the_site_check_measures_snapshot_latency(lab: dict[str, Any], added_ms: int,
                                                  recording: str) -> None:
    """snapshot_latency times LATENCY_SAMPLES snapshots of the scratch image,
    removes them, and says what the in_pause path would pause.  With
    CUTPOINT_RECORD=1 the calls are saved for test_site_check_replay.py."""
    from cutpoint.lab.backend_latency import set_backend_latency
    from site_check_replay import Recorder

    set_backend_latency(lab["sites"]["dr"], added_ms)
    try:
        rec = Recorder(CephConnection(ceph_site(lab)))
        r = check_site(ceph_site(lab), replication_target=True, ceph=rec)  # type: ignore[arg-type]
    finally:
        set_backend_latency(lab["sites"]["dr"], 0)
    d = r.as_dict()
    print(json.dumps(d["snapshot_latency"], indent=1))
    print(next(st.detail for st in r.steps if st.name == "snapshot_latency"))
    assert r.ok, d
    (lat,) = d["snapshot_latency"]
    assert lat["pool"] == "rbd" and len(lat["samples_ms"]) == 5
    assert lat["p50_ms"] <= lat["p99_ms"] < lat["in_pause_pause_p99_ms"]
    # every timed snapshot was removed with the image
    assert [c["args"][2] for c in rec.records if c["call"] == "remove_snapshot"] == \
        [f"cutpoint-check-lat{i}" for i in range(5)] + ["cutpoint-check"]
    with CephConnection(ceph_site(lab)) as c:
        assert not [i for i in c.list_images("rbd") if i.startswith(SCRATCH_PREFIX)]
    if os.environ.get("CUTPOINT_RECORD") == "1":
        rec.save(Path(__file__).parent / "data" / recording,
                 f"check_site of the lab's DR site (client.cutpoint), mon paxos_propose_interval "
                 f"+{added_ms} ms, recorded by test_site_lab.py")
