"""cutpoint-sync against the lab's two real Ceph clusters (cephx on).

Each test starts from a known state (an image written with a table of
(offset, pattern) extents or a real `rbd bench` writer), injects one thing
(a round of changes, a kill -9, a missing base, drift at DR), and checks
the DR snapshot byte for byte: SHA-256 of `rbd export` at both sites, which
is independent of the engine's own hashing.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cutpoint.bench.replication import (
    MiB,
    ReplicationError,
    create_image,
    diff_bytes,
    image_exists,
    parse_events,
    pattern,
    rbd,
    remove_image,
    run_sync,
    snap_create,
    snap_sha256,
    snaps,
    spec,
    sync_argv,
    write_extents,
)

pytestmark = [pytest.mark.lab, pytest.mark.lab_config(hosts=1, vms_per_host=0)]

# Exit codes of cutpoint-sync (docs/replication.md).
EXIT_NOBASE, EXIT_VERIFY, EXIT_FENCED = 3, 4, 6
FENCE_KEY = "cutpoint.fencing_epoch"  # storage/sync/sync_fence.h


@pytest.fixture
def image(lab: dict[str, Any]) -> Iterator[str]:
    """A fresh image name, removed from both sites afterwards (memstore is RAM)."""
    name = f"sync-{uuid.uuid4().hex[:8]}"
    yield name
    for site in ("primary", "dr"):
        remove_image(lab["sites"][site], name)


def sites(lab: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    return lab["sites"]["primary"], lab["sites"]["dr"]


def assert_identical(lab: dict[str, Any], image: str, snap: str) -> str:
    p, d = sites(lab)
    want, got = snap_sha256(p, image, snap), snap_sha256(d, image, snap)
    assert want == got, f"{image}@{snap}: primary {want} != dr {got}"
    return want


def read_range(site: dict[str, Any], image: str, snap: str, off: int, n: int) -> bytes:
    out = subprocess.run(
        [*rbd_argv(site, "export", "--no-progress", spec(site, image, snap), "-")],
        capture_output=True, check=True, timeout=300).stdout
    return out[off:off + n]


def rbd_argv(site: dict[str, Any], *args: str) -> list[str]:
    from cutpoint.lab.ceph import rbd_cmd
    return rbd_cmd(site, *args)


# (offset, length, seed): unaligned, object-straddling and tail extents.
TABLE = [
    (0, 4096, 1),
    (5000, 3000, 2),
    (4 * MiB - 512, 1024, 3),          # straddles two 4 MiB objects
    (9 * MiB, 2 * MiB + 17, 4),
    (63 * MiB, MiB, 5),                # last MiB of the first size
]


def test_three_rounds_under_writer_load(lab: dict[str, Any], image: str, tmp_path: Path) -> None:
    p, d = sites(lab)
    size = 64 * MiB
    create_image(p, image, size)
    write_extents(p, image, size, [(off, pattern(seed, n)) for off, n, seed in TABLE])
    snap_create(p, image, "r0")
    run = run_sync(lab, image, "r0", None, ["--verify-full"], str(tmp_path))
    done = run.done
    assert done["full"] is True and done["verified_full"] is True
    assert done["primary_sha256"] == assert_identical(lab, image, "r0")
    assert sorted(snaps(d, image)) == ["r0"]

    prev = "r0"
    for rnd in (1, 2, 3):
        snap = f"r{rnd}"
        if rnd == 2:
            # The primary grows; DR must follow.  A whole object is
            # discarded and a partial range zeroed, so the diff has zero
            # extents that must arrive as zeroes.
            size = 80 * MiB
            rbd(p, "resize", "--no-progress", "--size", "80M", spec(p, image))
            write_extents(p, image, size, [(8 * MiB, 4 * MiB), (5000, 1000),
                                           (75 * MiB, pattern(20, 12345))])
        # A real writer runs while the snapshot is taken.
        writer = subprocess.Popen(
            rbd_argv(p, "bench", "--io-type", "write", "--io-size", "4K", "--io-threads", "4",
                     "--io-total", "1G", "--io-pattern", "rand", spec(p, image)),
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            time.sleep(1.5)
            assert writer.poll() is None, "the writer ended before the snapshot"
            snap_create(p, image, snap)
            time.sleep(0.5)
        finally:
            writer.send_signal(signal.SIGINT)
            writer.wait(timeout=60)
        data, zero = diff_bytes(p, image, snap, prev)
        assert data > 0
        run = run_sync(lab, image, snap, prev, ["--verify-full"], str(tmp_path))
        done = run.done
        assert done["full"] is False and done["verified_full"] is True
        # Only what changed crosses the wire, byte for byte (less any 4 KiB
        # block of it that reads as zeroes: that is zeroed, not shipped).
        assert done["bytes_changed"] == data + zero
        assert done["bytes_shipped"] + done["bytes_zero_data"] == data, \
            f"round {rnd}: shipped {done['bytes_shipped']} + zero data " \
            f"{done['bytes_zero_data']} != rbd diff data {data}"
        assert done["bytes_zeroed"] == zero
        assert done["bytes_repaired"] == 0
        assert done["primary_sha256"] == assert_identical(lab, image, snap)
        info = json.loads(rbd(d, "info", "--format", "json", spec(d, image, snap)))
        assert info["size"] == size
        prev = snap
    assert sorted(snaps(d, image)) == ["r0", "r1", "r2", "r3"]
    # Old recovery points at DR still hold their old data (block-test
    # style: written, overwritten since, read through the snapshot).
    for off, n, seed in TABLE:
        assert read_range(d, image, "r0", off, n) == pattern(seed, n), f"r0 at {off}"


# Two workers, not the default 16: each worker reads its object, then
# waits for the rate limiter, and 16 of them hold 64 MiB at once, granted
# in whatever order they reached the limiter.  The done prefix waits for
# the lowest object, so on a loaded machine it could stay below the kill
# point until the whole copy was over (CI: "killed at 67108864").
KILL_OPTS = ["--rate-mbps", "8", "--progress-ms", "100", "--jobs", "2"]


def test_kill9_mid_transfer_resumes_identical(lab: dict[str, Any], image: str,
                                              tmp_path: Path) -> None:
    p, d = sites(lab)
    size = 96 * MiB
    create_image(p, image, size)
    # Non-zero everywhere: zero blocks are not rate-limited (nothing is
    # sent), so an all-zero image would be copied before the kill.
    write_extents(p, image, size, [(0, pattern(9, size))])
    snap_create(p, image, "k1")
    argv = sync_argv(lab, image, "k1", None, KILL_OPTS,
                     str(tmp_path))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = 0
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            ev = json.loads(line)
            if ev["event"] == "progress":
                seen = ev["offset"]
                if seen >= 24 * MiB:
                    break
            assert ev["event"] in ("start", "progress"), ev
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert 24 * MiB <= seen < size
    # A partly copied target is never mistaken for complete.
    assert "k1" not in snaps(d, image)
    records = list(tmp_path.glob("*.progress"))
    assert len(records) == 1
    rec = dict(line.split("=", 1) for line in records[0].read_text().splitlines()[1:])
    assert int(rec["done_offset"]) >= seen and rec["target"] == "k1"

    run = run_sync(lab, image, "k1", None, ["--verify-full"], str(tmp_path))
    done = run.done
    assert done["resumed_from"] == int(rec["done_offset"])
    assert done["bytes_shipped"] + done["bytes_zero_data"] == size - done["resumed_from"]
    assert done["bytes_shipped"] <= done["bytes_shipped_total"] <= size
    assert done["verified_full"] is True
    assert done["primary_sha256"] == assert_identical(lab, image, "k1")
    assert not list(tmp_path.glob("*.progress")), "the record outlived the copy"
    # Rerunning a finished copy is a no-op.
    again = run_sync(lab, image, "k1", None, [], str(tmp_path)).done
    assert again["already"] is True and again["bytes_shipped"] == 0


def remove_after_crash(site: dict[str, Any], image: str) -> None:
    """Remove an image whose last writer was killed: Ceph refuses while the
    dead client's watch lingers (about 30 s), so retry until it is gone."""
    deadline = time.monotonic() + 120
    while True:
        try:
            remove_image(site, image)
            return
        except ReplicationError as exc:
            if "watchers" not in exc.stderr or time.monotonic() > deadline:
                raise
        time.sleep(2)


def kill_mid_copy(lab: dict[str, Any], image: str, snap: str, size: int,
                  state_dir: Path, at: int) -> dict[str, str]:
    """Start a rate-limited full copy, SIGKILL it once `at` bytes are done,
    and return its progress record (key -> value)."""
    argv = sync_argv(lab, image, snap, None, KILL_OPTS,
                     str(state_dir))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = 0
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            ev = json.loads(line)
            if ev["event"] == "progress" and ev["offset"] >= at:
                seen = ev["offset"]
                break
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert at <= seen < size, f"killed at {seen}"
    records = list(state_dir.glob("*.progress"))
    assert len(records) == 1
    lines = records[0].read_text().splitlines()
    assert lines[0] == "cutpoint-sync-progress 2"
    return dict(line.split("=", 1) for line in lines[1:])


@pytest.mark.parametrize("recreate_by", ["operator", "cutpoint-sync"])
def test_a_recreated_dr_image_is_copied_from_the_start(lab: dict[str, Any], image: str,
                                                       tmp_path: Path,
                                                       recreate_by: str) -> None:
    """The DR image is removed (and recreated under the same name) between a
    killed copy and its rerun: the record's done prefix describes the old
    image, so the rerun must copy everything, not resume onto empty space."""
    p, d = sites(lab)
    size = 64 * MiB
    create_image(p, image, size)
    write_extents(p, image, size, [(0, pattern(11, size))])
    snap_create(p, image, "k1")
    rec = kill_mid_copy(lab, image, "k1", size, tmp_path, 16 * MiB)
    assert int(rec["done_offset"]) >= 16 * MiB
    # The record names the image it was written into.
    info = json.loads(rbd(d, "info", "--format", "json", spec(d, image)))
    assert rec["image_id"] == info["id"]
    assert rec["marker"] == rbd(d, "image-meta", "get", spec(d, image),
                                "cutpoint.sync.marker").strip()

    remove_after_crash(d, image)
    if recreate_by == "operator":
        create_image(d, image, size)
    # Without --verify-full (the coordinator's default), as a resumed copy
    # that skipped the old prefix would also end: with a DR snapshot.
    run = run_sync(lab, image, "k1", None, [], str(tmp_path))
    done = run.done
    # The point is what it claims: `rbd export` hashes at both sites...
    want = assert_identical(lab, image, "k1")
    # ...because the rerun copied everything, and said why.
    assert done["resumed_from"] == 0
    assert done["bytes_shipped"] + done["bytes_zero_data"] == size
    assert "progress record discarded" in run.stderr
    assert "image id changed" in run.stderr
    assert not list(tmp_path.glob("*.progress")), "the record outlived the copy"
    # ...and the engine's own full verification of the finished snapshot.
    check = run_sync(lab, image, "k1", None, ["--verify-only"], str(tmp_path)).done
    assert check["verified_full"] is True
    assert check["primary_sha256"] == check["dr_sha256"] == want
    # The hashing is the run's time, and its done event says so.
    assert check["phase_ms"]["verify"] > 0, check["phase_ms"]


def test_missing_base_at_dr_is_refused(lab: dict[str, Any], image: str, tmp_path: Path) -> None:
    p, d = sites(lab)
    size = 32 * MiB
    create_image(p, image, size)
    write_extents(p, image, size, [(0, pattern(1, MiB))])
    snap_create(p, image, "a")
    write_extents(p, image, size, [(MiB, pattern(2, MiB))])
    snap_create(p, image, "b")

    # No image at DR at all: refused, and nothing is created there.
    run = run_sync(lab, image, "b", "a", [], str(tmp_path), check=False)
    assert run.returncode == EXIT_NOBASE, run.stderr
    err = run.error
    assert err is not None and err["exit"] == EXIT_NOBASE
    assert "missing at DR" in err["message"] and "--full-resync" in err["message"]
    assert "missing at DR" in run.stderr
    assert not image_exists(d, image)

    # The image exists at DR but lacks the base: refused, DR untouched.
    run_sync(lab, image, "a", None, [], str(tmp_path))
    write_extents(p, image, size, [(2 * MiB, pattern(3, MiB))])
    snap_create(p, image, "c")
    run = run_sync(lab, image, "c", "b", [], str(tmp_path), check=False)
    assert run.returncode == EXIT_NOBASE
    assert snaps(d, image) == ["a"]

    # Asked for, a full resync repairs it.
    done = run_sync(lab, image, "c", "b", ["--full-resync", "--verify-full"], str(tmp_path)).done
    assert done["full"] is True and done["verified_full"] is True
    assert_identical(lab, image, "c")


def test_dr_drift_is_repaired_and_a_mismatch_is_detected(lab: dict[str, Any], image: str,
                                                        tmp_path: Path) -> None:
    p, d = sites(lab)
    size = 32 * MiB
    create_image(p, image, size)
    write_extents(p, image, size, [(0, pattern(1, 4 * MiB))])
    snap_create(p, image, "a")
    run_sync(lab, image, "a", None, [], str(tmp_path))

    # Someone writes to the DR image behind replication's back.
    write_extents(d, image, size, [(20 * MiB, pattern(99, 65536))])
    snap_create(d, image, "x")
    snap_create(p, image, "x")
    run = run_sync(lab, image, "x", None, ["--verify-only"], str(tmp_path), check=False)
    assert run.returncode == EXIT_VERIFY, run.stderr
    assert run.error is not None and "hash mismatch" in run.error["message"]

    # The next incremental copy puts the drifted range back.
    write_extents(p, image, size, [(MiB, pattern(2, 8192))])
    snap_create(p, image, "b")
    done = run_sync(lab, image, "b", "a", ["--verify-full"], str(tmp_path)).done
    assert done["bytes_repaired"] == 65536
    # The drifted range reads as zeroes at the primary: it is zeroed at DR
    # (and verified), not shipped.
    assert done["bytes_shipped"] == 8192 and done["bytes_zero_data"] == 65536
    assert_identical(lab, image, "b")


def test_a_fenced_dr_image_is_never_written(lab: dict[str, Any], image: str,
                                            tmp_path: Path) -> None:
    """A failover made the DR image the live copy at fencing epoch 1 (its
    metadata key) and the DR guest wrote to it.  The old primary comes back,
    writes, snapshots and replicates: under its old epoch, with no --epoch
    at all, even as a full resync or under epoch 1 itself, the copy is
    refused with exit 6 before anything is written, and the DR image's head
    and snapshots keep their bytes.  After a failback (epoch 2: the primary
    is the active site again) the same copy goes through and repairs DR."""
    p, d = sites(lab)
    size = 16 * MiB
    create_image(p, image, size)
    write_extents(p, image, size, [(0, pattern(1, 2 * MiB))])
    snap_create(p, image, "f0")
    run_sync(lab, image, "f0", None, [], str(tmp_path))
    rbd(d, "image-meta", "set", spec(d, image), FENCE_KEY, "1")
    write_extents(d, image, size, [(4 * MiB, pattern(50, 65536))])  # the DR guest

    def dr_state() -> tuple[str, str, list[str]]:
        return snap_sha256(d, image, None), snap_sha256(d, image, "f0"), snaps(d, image)

    before = dr_state()
    write_extents(p, image, size, [(0, pattern(9, MiB))])  # the old primary
    snap_create(p, image, "f1")
    messages = []
    for extra in (["--epoch", "0"], [], ["--full-resync", "--epoch", "0"], ["--epoch", "1"]):
        run = run_sync(lab, image, "f1", "f0", extra, str(tmp_path), check=False)
        assert run.returncode == EXIT_FENCED, (extra, run.stderr)
        err = run.error
        assert err is not None and err["exit"] == EXIT_FENCED, run.events
        assert err["message"].startswith(f"fenced: dr image {image} is the live copy since "
                                         "fencing epoch 1"), err
        assert "refusing to write" in err["message"]
        assert [e["event"] for e in run.events] == ["error"], run.events
        assert "exit=6" in run.stderr
        messages.append(err["message"])
    assert dr_state() == before, "a refused copy changed the DR image"
    assert not list(tmp_path.glob("*.progress")), "a refused copy left a progress record"
    print(f"\nrefused: {messages[0]}")

    # A failback made the primary active again at epoch 2: DR is a replica.
    done = run_sync(lab, image, "f1", "f0", ["--epoch", "2", "--verify-full"],
                    str(tmp_path)).done
    assert done["full"] is False and done["bytes_repaired"] == 65536, done
    assert_identical(lab, image, "f1")


def test_progress_events_are_json_lines(lab: dict[str, Any], image: str, tmp_path: Path) -> None:
    p, _ = sites(lab)
    create_image(p, image, 16 * MiB)
    write_extents(p, image, 16 * MiB, [(0, pattern(7, 8 * MiB))])
    snap_create(p, image, "e")
    argv = sync_argv(lab, image, "e", None, ["--progress-ms", "10"], str(tmp_path))
    cp = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=True)
    events = parse_events(cp.stdout)
    kinds = [e["event"] for e in events]
    assert kinds[0] == "start" and kinds[-1] == "done" and "progress" in kinds
    last = [e for e in events if e["event"] == "progress"][-1]
    assert last["bytes"] == last["total"] == 8 * MiB and last["offset"] == 8 * MiB
    for key in ("bytes_shipped", "bytes_changed", "seconds"):
        assert key in events[-1]
    # Every phase of the run is in the done event (docs/replication.md),
    # and together they are the run's time, up to their 0.1 ms rounding.
    phases = events[-1]["phase_ms"]
    assert list(phases) == ["start", "connect", "open", "plan", "copy", "snap",
                            "verify", "finish"]
    assert sum(phases.values()) <= events[-1]["seconds"] * 1000 + 0.05 * len(phases)
    # stderr is key=value logs.
    for line in cp.stderr.splitlines():
        assert line.startswith("ts=") and " level=" in line, line


def test_failback_ships_only_what_changed_on_either_side(lab: dict[str, Any], image: str,
                                                         tmp_path: Path) -> None:
    """Failback without VMs, on a sparse disk like a guest's: a common
    snapshot S at both sites, the primary writes a little after S (a guest
    running until it was fenced), DR writes 1 MiB of random 4 KiB blocks and
    snapshots F.  Copying F back from DR must ship about DR's writes plus the
    primary's drift, although `rbd diff` reports every object created after
    S as changed from its start to its end (holes included): that made the
    lab's failback ship 62 of 64 MB."""
    p, d = sites(lab)
    size = 64 * MiB
    create_image(p, image, size)
    write_extents(p, image, size, [(0, pattern(1, 256 * 1024))])
    snap_create(p, image, "s0")
    run_sync(lab, image, "s0", None, [], str(tmp_path))
    write_extents(p, image, size, [(256 * 1024, pattern(2, 4096))])
    snap_create(p, image, "s1")
    assert run_sync(lab, image, "s1", "s0", [], str(tmp_path)).done["full"] is False
    # After the common snapshot: the primary guest's last writes, then DR's.
    drift = 8192
    write_extents(p, image, size, [(260 * 1024, pattern(11, drift))])
    blocks = random.Random(5).sample(range(size // 4096), 256)
    write_extents(d, image, size, [(b * 4096, pattern(100 + b, 4096)) for b in blocks])
    snap_create(d, image, "f")
    dr_data, dr_zero = diff_bytes(d, image, "f", "s1")
    # Ceph's view: far more than the 1 MiB written (objects born after s1).
    assert dr_data > 8 * MiB, dr_data
    argv = sync_argv(lab, image, "f", "s1", ["--verify-full"], str(tmp_path), reverse=True)
    cp = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    assert cp.returncode == 0, cp.stderr[-2000:]
    done = parse_events(cp.stdout)[-1]
    assert done["event"] == "done" and done["full"] is False and done["verified_full"] is True
    assert done["bytes_changed"] == dr_data + dr_zero
    assert done["bytes_shipped"] + done["bytes_zero_data"] == dr_data + done["bytes_repaired"]
    assert done["bytes_shipped"] <= MiB + drift, done
    # The primary never had DR's new objects: their holes needed no write.
    assert done["bytes_zero_skipped"] > 4 * MiB, done
    assert snap_sha256(p, image, "f") == snap_sha256(d, image, "f")
    # For comparison: the stream `rbd export-diff` would send for the same pair.
    stream = subprocess.run(rbd_argv(d, "export-diff", "--no-progress", "--from-snap", "s1",
                                     spec(d, image, "f"), "-"),
                            capture_output=True, check=True, timeout=300).stdout
    print(f"failback without VMs: rbd diff {dr_data} B, shipped {done['bytes_shipped']} B, "
          f"zero blocks {done['bytes_zero_data']} B (not written "
          f"{done['bytes_zero_skipped']} B), rbd export-diff stream {len(stream)} B")


def test_a_hung_dr_osd_fails_the_run_then_it_resumes(lab: dict[str, Any], image: str,
                                                     tmp_path: Path) -> None:
    """A DR OSD that stops answering (SIGSTOP: as a full or wedged OSD looks
    to a client) fails the run with a clear error within --op-timeout,
    instead of hanging the group's replication; once the OSD is back the
    same command completes and the copy is identical."""
    p, d = sites(lab)
    size = 16 * MiB
    create_image(p, image, size)
    write_extents(p, image, size, [(0, pattern(7, 2 * MiB))])
    snap_create(p, image, "h1")
    pidfile = Path(d["ceph_conf"]).parent / "run" / "osd.0.pid"
    osd = int(pidfile.read_text().strip())
    os.kill(osd, signal.SIGSTOP)
    try:
        run = run_sync(lab, image, "h1", None, ["--op-timeout", "3"], str(tmp_path),
                       check=False, timeout=120)
    finally:
        os.kill(osd, signal.SIGCONT)
    print(f"hung DR OSD: exit {run.returncode} after {run.seconds:.1f} s: {run.error}")
    assert run.returncode == 1, run.stderr
    assert run.error is not None and "timed out" in run.error["message"], run.error
    done = run_sync(lab, image, "h1", None, ["--verify-full"], str(tmp_path)).done
    assert done["verified_full"] is True
    assert_identical(lab, image, "h1")
