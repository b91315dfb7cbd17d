"""cp-writer --resume on the host, against regular files: a run continued
after a crash (kill -9, the state a failover boots from) is one run, records
1..p' each once, for the real checker; a copy that is not crash-consistent,
or holds two runs, is refused and left as it was; and the checker still
finds the gap when a resumed set of disks is assembled wrongly.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
from cutpoint.checkers import writer as wr
from test_writer_host import (  # dr-tests/tests/test_writer_host.py
    WRITER,
    disk_args,
    done_line,
    free_ports,
    make_disks,
    run,
    wait_for_records,
)


@pytest.fixture(scope="module")
def writer_bin() -> Path:
    if not WRITER.exists():
        pytest.fail(f"{WRITER} is not built: run `ninja -C build`")
    return WRITER


def start_line(out: str, what: str = "start") -> dict[str, str]:
    line = next(x for x in out.splitlines() if x.startswith(f"cp-writer: {what} "))
    return dict(kv.split("=", 1) for kv in line.split()[2:] if "=" in kv)


def test_single_resume_continues_the_run(writer_bin: Path, tmp_path: Path) -> None:
    paths = make_disks(tmp_path, "", 3)
    args = [str(writer_bin), *disk_args(paths), "--progress", "0"]
    first = run([*args, "--count", "100"])
    assert first.returncode == 0, first.stderr
    again = run([*args, "--count", "250", "--resume"])
    assert again.returncode == 0, again.stderr
    found = start_line(again.stdout, "resume")
    assert found == {"vm": "1", "run": done_line(first.stdout)["run"], "records": "100",
                     "last_seq": "100"}
    assert done_line(again.stdout) | {"run": "-"} == {
        "vm": "1", "last_seq": "250", "written": "150", "run": "-", "reason": "count"}
    v = wr.check_files(paths)
    assert v.ok, v.summary()
    assert v.p == 250 and list(v.runs) == [int(found["run"])]
    # Record 101 is the writer's 101st: disk 100 % 3 = 1, slot 100 // 3 = 33.
    assert paths[1].read_bytes()[33 * 512:34 * 512] == wr.encode_record(
        101, epoch=33, vm=1, disk=1, run=int(found["run"]))


def test_resume_on_empty_disks_starts_a_run(writer_bin: Path, tmp_path: Path) -> None:
    paths = make_disks(tmp_path, "", 2)
    res = run([str(writer_bin), *disk_args(paths), "--count", "40", "--resume"])
    assert res.returncode == 0, res.stderr
    assert start_line(res.stdout, "resume")["records"] == "0"
    v = wr.check_files(paths)
    assert v.ok and v.p == 40, v.summary()


def test_single_resume_after_kill9(writer_bin: Path, tmp_path: Path) -> None:
    paths = make_disks(tmp_path, "", 3, size=4 << 20)
    proc = subprocess.Popen([str(writer_bin), *disk_args(paths)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for_records(paths, 300, [proc])
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    p0 = wr.check_files(paths).p
    res = run([str(writer_bin), *disk_args(paths), "--resume", "--count", str(p0 + 500)])
    assert res.returncode == 0, res.stderr
    v = wr.check_files(paths)
    assert v.ok, v.summary()
    assert v.p == p0 + 500 and len(v.runs) == 1


def resumed_ring(writer_bin: Path, paths: list[Path], extra: list[str],
                 resume: tuple[bool, bool] = (True, True)) -> list[subprocess.Popen[str]]:
    """Two writers on a new ring: vm1 on paths[0:2], vm2 on paths[2:4]."""
    peers = ",".join(f"127.0.0.1:{p}" for p in free_ports(2))
    return [subprocess.Popen(
        [str(writer_bin), "--vm", str(i + 1), *disk_args(paths[2 * i:2 * i + 2]),
         "--peers", peers, "--ring-index", str(i), "--connect-timeout", "30",
         "--progress", "0", *(["--resume"] if resume[i] else []), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]


def ring_disks(tmp_path: Path) -> list[Path]:
    return make_disks(tmp_path, "vm1-", 2) + make_disks(tmp_path, "vm2-", 2)


def finished(procs: list[subprocess.Popen[str]]) -> list[tuple[int, str, str]]:
    outs = [p.communicate(timeout=120) for p in procs]
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outs)]


def test_ring_resume_after_kill9(writer_bin: Path, tmp_path: Path) -> None:
    paths = make_disks(tmp_path, "vm1-", 2, size=4 << 20) + \
        make_disks(tmp_path, "vm2-", 2, size=4 << 20)
    procs = resumed_ring(writer_bin, paths, [], resume=(False, False))
    try:
        wait_for_records(paths, 200, procs)
    finally:
        for p in procs:
            p.send_signal(signal.SIGKILL)
        for p in procs:
            p.communicate()
    before = wr.check_files(paths)
    assert before.ok, before.summary()
    ends = finished(resumed_ring(writer_bin, paths, ["--count", str(before.p + 400)]))
    assert [rc for rc, _, _ in ends] == [0, 0], ends
    run_id = next(iter(before.runs))
    assert f"ring resumes run={run_id} at seq={before.p + 1}" in ends[0][1]
    v = wr.check_files(paths)
    assert v.ok, v.summary()
    assert v.p == before.p + 400 and list(v.runs) == [run_id]
    assert sum(int(done_line(out)["written"]) for _, out, _ in ends) == 400


# -- what --resume refuses: the disks are left exactly as they were --

def refused(writer_bin: Path, paths: list[Path], why: str) -> None:
    before = [p.read_bytes() for p in paths]
    res = run([str(writer_bin), *disk_args(paths), "--resume", "--count", "1000"])
    assert res.returncode == 1 and why in res.stderr, (res.stdout, res.stderr)
    assert [p.read_bytes() for p in paths] == before


def test_resume_refuses_a_copy_with_a_gap(writer_bin: Path, tmp_path: Path) -> None:
    paths = make_disks(tmp_path, "", 3)
    assert run([str(writer_bin), *disk_args(paths), "--count", "100"]).returncode == 0
    with open(paths[1], "r+b") as f:  # record 50: the writer's k=49, disk 1 slot 16
        f.seek(16 * 512)
        f.write(bytes(512))
    assert wr.check_files(paths).gaps == [(50, 50)]
    refused(writer_bin, paths, "not a crash-consistent copy")


def test_resume_refuses_a_torn_record(writer_bin: Path, tmp_path: Path) -> None:
    paths = make_disks(tmp_path, "", 2)
    assert run([str(writer_bin), *disk_args(paths), "--count", "60"]).returncode == 0
    with open(paths[0], "r+b") as f:  # the tail of record 59 never landed
        f.seek(29 * 512 + 256)
        f.write(bytes(256))
    refused(writer_bin, paths, "not a valid record")


def test_resume_refuses_records_of_two_runs(writer_bin: Path, tmp_path: Path) -> None:
    paths = make_disks(tmp_path, "", 2)
    args = [str(writer_bin), *disk_args(paths), "--progress", "0"]
    assert run([*args, "--count", "300"]).returncode == 0
    assert run([*args, "--count", "100"]).returncode == 0  # a new run over the old
    refused(writer_bin, paths, "is of run")


def test_resume_refuses_another_writers_disks(writer_bin: Path, tmp_path: Path) -> None:
    paths = make_disks(tmp_path, "", 2)
    assert run([str(writer_bin), *disk_args(paths), "--vm", "2",
                "--count", "10"]).returncode == 0
    refused(writer_bin, paths, "expected vm 1")


def test_ring_resume_refuses_a_lost_record(writer_bin: Path, tmp_path: Path) -> None:
    """Each writer's own records are a prefix, but the ring lost record 100
    (vm2's last): only the census across the ring can tell."""
    paths = ring_disks(tmp_path)
    ends = finished(resumed_ring(writer_bin, paths, ["--count", "101"], resume=(False, False)))
    assert [rc for rc, _, _ in ends] == [0, 0], ends
    with open(paths[3], "r+b") as f:  # vm2's 50th record: disk 1, slot 24
        f.seek(24 * 512)
        f.write(bytes(512))
    assert wr.check_files(paths).gaps == [(100, 100)]
    before = [p.read_bytes() for p in paths]
    ends = finished(resumed_ring(writer_bin, paths, ["--count", "300"]))
    assert all(rc == 1 for rc, _, _ in ends), ends
    assert "hold 100 records but the highest seq is 101" in ends[0][2]
    assert [p.read_bytes() for p in paths] == before


def test_ring_resume_needs_every_writer_to_resume(writer_bin: Path, tmp_path: Path) -> None:
    paths = ring_disks(tmp_path)
    ends = finished(resumed_ring(writer_bin, paths, ["--count", "50"], resume=(True, False)))
    assert all(rc == 1 for rc, _, _ in ends), ends
    assert "does every writer of the ring have --resume?" in ends[1][2]


def test_resume_takes_no_run_and_no_zero(writer_bin: Path, tmp_path: Path) -> None:
    paths = make_disks(tmp_path, "", 1)
    for extra in (["--zero"], ["--run", "5"]):
        res = run([str(writer_bin), *disk_args(paths), "--resume", *extra])
        assert res.returncode == 2 and "--resume continues the run" in res.stderr


# -- the checker on resumed runs: still fails on a real gap --

def test_a_resumed_set_with_one_disk_from_before_has_a_gap(writer_bin: Path,
                                                          tmp_path: Path) -> None:
    """A failover that booted one disk from an older copy: the writer at DR
    resumes (its own records still look like a prefix) but the checker sees
    the records of that disk written between the two copies missing."""
    paths = make_disks(tmp_path, "", 3)
    args = [str(writer_bin), *disk_args(paths), "--progress", "0"]
    assert run([*args, "--count", "90"]).returncode == 0
    old0 = paths[0].read_bytes()
    assert run([*args, "--count", "150", "--resume"]).returncode == 0
    assert wr.check_files(paths).ok
    paths[0].write_bytes(old0)
    v = wr.check_files(paths)
    assert not v.ok
    assert v.gaps == [(s, s) for s in range(91, 151, 3)]
    assert (v.torn, v.corrupt, v.duplicates, len(v.runs)) == (0, 0, 0, 1)
