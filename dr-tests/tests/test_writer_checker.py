"""Unit tests of the writer checker on synthesized disk images.

One known-good image set, then exactly one fault per negative test, each
expecting exactly one kind of finding (restic checker_test style).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from cutpoint.checkers import writer as wr
from cutpoint.lab.cli.check import app
from typer.testing import CliRunner

NDISKS = 3
N = 300
RUN = 4242


def synth(n: int = N, ndisks: int = NDISKS, nvms: int = 1,
          run: int = RUN) -> list[bytearray]:
    """Disk images exactly as the writer lays them out: record s goes to
    VM (s-1) % nvms, that VM's k-th record to disk k % ndisks, slot k //
    ndisks."""
    disks = [bytearray(64 * 1024) for _ in range(ndisks * nvms)]
    written = [0] * nvms
    for seq in range(1, n + 1):
        vm = (seq - 1) % nvms
        k = written[vm]
        written[vm] += 1
        d, slot = k % ndisks, k // ndisks
        rec = wr.encode_record(seq, epoch=slot, vm=vm + 1, disk=d, run=run)
        disks[vm * ndisks + d][slot * 512:(slot + 1) * 512] = rec
    return disks


def locate(disks: list[bytearray], seq: int) -> tuple[int, int]:
    """(disk index, offset) of record seq."""
    for i, img in enumerate(disks):
        for off in range(0, len(img), 512):
            if img[off:off + 4] == wr.MAGIC and \
                    struct.unpack_from("<Q", img, off + 8)[0] == seq:
                return i, off
    raise AssertionError(f"seq {seq} not found")


def write(tmp_path: Path, disks: list[bytearray]) -> list[Path]:
    paths = []
    for i, img in enumerate(disks):
        p = tmp_path / f"disk{i}.raw"
        p.write_bytes(bytes(img))
        paths.append(p)
    return paths


def test_record_layout_matches_docs() -> None:
    rec = wr.encode_record(0x0102030405060708, epoch=7, vm=3, disk=2, run=9)
    assert len(rec) == 512
    assert rec[:4] == b"CPWR"
    assert struct.unpack_from("<IQIIQ", rec, 4) == (7, 0x0102030405060708,
                                                     3, 2, 9)
    assert rec[32:508] == bytes(476)
    import zlib
    assert struct.unpack_from("<I", rec, 508)[0] == zlib.crc32(rec[:508])


def test_positive_single_vm(tmp_path: Path) -> None:
    v = wr.check_files(write(tmp_path, synth()))
    assert v.ok, v.summary()
    assert (v.p, v.prefix, v.records, v.gaps) == (N, N, N, [])
    assert [s.records for s in v.sources] == [100, 100, 100]


def test_positive_two_vms(tmp_path: Path) -> None:
    v = wr.check_files(write(tmp_path, synth(n=301, nvms=2)))
    assert v.ok, v.summary()
    assert v.p == 301
    labels = [sorted(s.labels) for s in v.sources]
    assert labels == [[(1, 0)], [(1, 1)], [(1, 2)], [(2, 0)], [(2, 1)],
                      [(2, 2)]]


def test_gap(tmp_path: Path) -> None:
    disks = synth()
    i, off = locate(disks, 150)
    disks[i][off:off + 512] = bytes(512)
    v = wr.check_files(write(tmp_path, disks))
    assert not v.ok
    assert v.gaps == [(150, 150)] and v.missing == 1
    assert (v.p, v.prefix) == (N, 149)
    assert (v.torn, v.corrupt, v.duplicates) == (0, 0, 0)
    assert "1 missing in 1 gaps: 150" in v.summary()


def test_missing_tail_is_a_shorter_prefix_not_a_gap(tmp_path: Path) -> None:
    """Losing the newest records is what a crash does: still consistent."""
    disks = synth()
    for seq in (N, N - 1):
        i, off = locate(disks, seq)
        disks[i][off:off + 512] = bytes(512)
    v = wr.check_files(write(tmp_path, disks))
    assert v.ok and v.p == N - 2


def test_torn_record_tail_missing(tmp_path: Path) -> None:
    disks = synth()
    i, off = locate(disks, N)  # the newest: no gap, only the tear
    disks[i][off + 256:off + 512] = bytes(256)
    v = wr.check_files(write(tmp_path, disks))
    assert not v.ok
    assert (v.torn, v.corrupt, v.duplicates, v.gaps) == (1, 0, 0, [])
    assert v.anomalies[0].kind == "torn"
    assert v.anomalies[0].offset == off


def test_torn_record_head_missing(tmp_path: Path) -> None:
    disks = synth()
    i, off = locate(disks, N)
    disks[i][off:off + 32] = bytes(32)
    v = wr.check_files(write(tmp_path, disks))
    assert (v.ok, v.torn, v.corrupt) == (False, 1, 0)


def test_corrupt_crc(tmp_path: Path) -> None:
    disks = synth()
    i, off = locate(disks, 10)
    disks[i][off + 100] ^= 0x40  # one flipped bit in the padding
    v = wr.check_files(write(tmp_path, disks))
    assert not v.ok
    assert (v.corrupt, v.torn, v.duplicates) == (1, 0, 0)
    # The corrupt record no longer counts, so 10 is also a gap.
    assert v.gaps == [(10, 10)]
    assert "header says seq 10" in v.anomalies[0].detail


def test_duplicate(tmp_path: Path) -> None:
    disks = synth()
    # Record 7 appears a second time, in a free slot at the end of disk 0.
    i, off = locate(disks, 7)
    rec = bytes(disks[i][off:off + 512])
    disks[0][len(disks[0]) - 512:] = rec
    v = wr.check_files(write(tmp_path, disks))
    assert not v.ok
    assert (v.duplicates, v.gaps, v.torn, v.corrupt) == (1, [], 0, 0)
    assert "seq 7 found 2 times" in v.anomalies[0].detail


def test_records_of_another_run(tmp_path: Path) -> None:
    disks = synth()
    stale = synth(n=N + 30, run=RUN + 1)  # an older, longer run's leftovers
    for d in range(NDISKS):
        disks[d][100 * 512:110 * 512] = stale[d][100 * 512:110 * 512]
    v = wr.check_files(write(tmp_path, disks))
    assert not v.ok
    assert set(v.runs) == {RUN, RUN + 1}
    assert any(a.kind == "foreign-run" for a in v.anomalies)


def test_same_image_twice_is_caught(tmp_path: Path) -> None:
    paths = write(tmp_path, synth())
    v = wr.check_files([paths[0], paths[1], paths[2], paths[0]])
    assert not v.ok and v.duplicates == 100


def test_no_records_at_all(tmp_path: Path) -> None:
    v = wr.check_files(write(tmp_path, [bytearray(8192)] * 2))
    assert not v.ok and v.p == 0
    assert "no valid record" in v.summary()


def test_foreign_data_is_corrupt(tmp_path: Path) -> None:
    disks = synth()
    disks[1][-1024:-512] = b"\x55" * 512
    v = wr.check_files(write(tmp_path, disks))
    assert (v.ok, v.corrupt) == (False, 1)
    assert v.anomalies[0].detail == "not a writer record"


def test_trailing_partial_slot(tmp_path: Path) -> None:
    paths = write(tmp_path, synth())
    with open(paths[0], "ab") as f:
        f.write(b"\x01" * 100)
    v = wr.check_files(paths)
    assert (v.ok, v.torn) == (False, 1)


def test_cli_ok_json_and_exit_codes(tmp_path: Path) -> None:
    runner = CliRunner()
    paths = [str(p) for p in write(tmp_path, synth())]
    res = runner.invoke(app, ["writer", "--files", *paths])
    assert res.exit_code == 0, res.output
    assert res.output.startswith(f"OK: records 1..{N} all present")
    res = runner.invoke(app, ["writer", "--json", "--files", *paths[:2]])
    assert res.exit_code == 1
    doc = json.loads(res.output)
    assert doc["ok"] is False and doc["p"] == N - 1 and doc["prefix"] == 2
    res = runner.invoke(app, ["writer", "--files", str(tmp_path / "nope")])
    assert res.exit_code == 2
    assert "nope" in res.output
    res = runner.invoke(app, ["writer", "--files", "--images", paths[0]])
    assert res.exit_code == 2
    assert "exactly one of" in res.output


@pytest.mark.parametrize("text,expected", [
    ("primary:rbd/vm1-disk0@cp.g.1",
     wr.RbdSpec("rbd", "vm1-disk0", "cp.g.1", "/s/p.conf", "admin", "/s/p.kr")),
    ("dr:rbd/img", wr.RbdSpec("rbd", "img", None, "/s/d.conf", "admin", None)),
    ("/etc/ceph/x.conf:rbd/img@s",
     wr.RbdSpec("rbd", "img", "s", "/etc/ceph/x.conf", "admin", None)),
    ("qcow2:/v/disk0.qcow2@snap", wr.Qcow2Spec("/v/disk0.qcow2", "snap")),
    ("/v/disk1.qcow2", wr.Qcow2Spec("/v/disk1.qcow2", None)),
])
def test_parse_image(text: str, expected: wr.Spec) -> None:
    sites = {"primary": {"ceph_conf": "/s/p.conf", "keyring": "/s/p.kr",
                         "client_id": "admin"},
             "dr": {"ceph_conf": "/s/d.conf"}}
    assert wr.parse_image(text, sites=sites) == expected


@pytest.mark.parametrize("text", ["", "rbd", "x:rbd/img", "rbd/a/b",
                                  "primary:rbd/img@"])
def test_parse_image_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        wr.parse_image(text, sites={"primary": {"ceph_conf": "c"}})


def test_rbd_export_argv() -> None:
    spec = wr.RbdSpec("rbd", "img", "s1", "/c.conf", "admin", "/k")
    assert spec.export_argv() == ["rbd", "-c", "/c.conf", "--id", "admin",
                                  "--keyring", "/k", "export", "--no-progress",
                                  "rbd/img@s1", "-"]


def test_failing_reader_is_reported(tmp_path: Path) -> None:
    spec = wr.RbdSpec("rbd", "img", "s1", str(tmp_path / "missing.conf"))
    with pytest.raises(wr.CheckerError) as e:
        wr.scan_specs([spec])
    assert "rbd" in str(e.value) and "exit" in str(e.value)


def test_group_snapshot_members_from_the_transaction_log(tmp_path: Path) -> None:
    """--group-snapshot: members come from a real (SQLite) transaction log,
    mapped to images through a lab status; only committed groups count."""
    from cutpoint.coordinator.txlog import COMMITTED, COMMITTING, TxLog
    url = f"sqlite:///{tmp_path / 'coord.db'}"
    log = TxLog(url)
    members = [{"disk": f"vm1/disk{i}", "vm": "vm1", "agent": "h1",
                "name": "cp.g.t1"} for i in range(2)]
    log.begin("t1", "g", {}, members, lease_ms=1000, budget_ms=1000)
    log.begin("t2", "g2", {}, members, lease_ms=1000, budget_ms=1000)
    log.transition("t1", COMMITTING)
    log.transition("t1", COMMITTED, snapshots={
        m["disk"]: {"state": "created"} for m in members})
    log.dispose()
    status = {"sites": {"primary": {"ceph_conf": "/c", "keyring": "/k",
                                    "client_id": "admin"}},
              "vms": [{"name": "vm1", "site": "primary", "disks": [
                  {"node": "disk0", "backend": "rbd", "pool": "rbd",
                   "image": "vm1-disk0"},
                  {"node": "disk1", "backend": "qcow2", "file": "/q/d1.qcow2"}]}]}
    specs = wr.specs_for_group_snapshot("t1", url, status)
    assert specs == [wr.RbdSpec("rbd", "vm1-disk0", "cp.g.t1", "/c", "admin", "/k"),
                     wr.Qcow2Spec("/q/d1.qcow2", "cp.g.t1")]
    with pytest.raises(ValueError, match="preparing, not committed"):
        wr.specs_for_group_snapshot("t2", url, status)
    with pytest.raises(ValueError, match="no group snapshot"):
        wr.specs_for_group_snapshot("t3", url, status)
    with pytest.raises(ValueError, match="not a disk of the lab"):
        wr.specs_for_group_snapshot("t1", url, {"sites": {}, "vms": []})


def continued(first: int, n: int = N) -> list[bytearray]:
    """synth()'s run, continued after a failover as `--resume` does: the
    writer's next slots, but the sequence numbers from `first` on."""
    disks = synth(n=N)
    for k in range(N, N + n):
        seq = first + (k - N)
        d, slot = k % NDISKS, k // NDISKS
        disks[d][slot * 512:(slot + 1) * 512] = wr.encode_record(
            seq, epoch=slot, vm=1, disk=d, run=RUN)
    return disks


def test_a_run_continued_after_a_failover_passes(tmp_path: Path) -> None:
    v = wr.check_files(write(tmp_path, continued(N + 1)))
    assert v.ok, v.summary()
    assert (v.p, v.records, list(v.runs)) == (2 * N, 2 * N, [RUN])


def test_a_continuation_from_a_stale_seq_is_a_duplicate(tmp_path: Path) -> None:
    """It started again from an older point than the disks hold."""
    v = wr.check_files(write(tmp_path, continued(N - 4)))
    assert not v.ok
    assert (v.duplicates, v.gaps, v.torn, v.corrupt) == (5, [], 0, 0)


def test_a_continuation_that_skips_seqs_is_a_gap(tmp_path: Path) -> None:
    """It started after records the disks do not hold (a lost tail)."""
    v = wr.check_files(write(tmp_path, continued(N + 3)))
    assert not v.ok
    assert (v.gaps, v.duplicates, v.torn, v.corrupt) == ([(N + 1, N + 2)], 0, 0, 0)
