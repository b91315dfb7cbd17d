"""The real cp-writer binary on the host, against regular files, checked by
the real checker: single-VM and distributed (a ring of processes on
127.0.0.1) modes, crashes (kill -9) at arbitrary points, and a host-side
negative control (disks copied one after another while the writer runs).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import struct
import subprocess
import time
from pathlib import Path

import pytest
from cutpoint.checkers import writer as wr

ROOT = Path(__file__).resolve().parents[2]
WRITER = ROOT / "build" / "dr-tests" / "workloads" / "writer" / "cp-writer"
DISK_BYTES = 256 * 1024  # 512 slots per disk


@pytest.fixture(scope="module")
def writer_bin() -> Path:
    if not WRITER.exists():
        pytest.fail(f"{WRITER} is not built: run `ninja -C build`")
    return WRITER


def make_disks(d: Path, prefix: str, n: int, size: int = DISK_BYTES) -> list[Path]:
    paths = []
    for i in range(n):
        p = d / f"{prefix}disk{i}.raw"
        with open(p, "wb") as f:
            f.truncate(size)
        paths.append(p)
    return paths


def disk_args(paths: list[Path]) -> list[str]:
    return [a for p in paths for a in ("--disk", str(p))]


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def run(argv: list[str], env: dict[str, str] | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                          env=env, check=False)


def wait_for_records(paths: list[Path], at_least: int,
                     procs: list[subprocess.Popen[str]],
                     limit_s: float = 60) -> None:
    """Poll the files until the checker sees p >= at_least (not a timing
    assertion: it only waits for progress)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        for p in procs:
            assert p.poll() is None, f"writer exited early: {p.communicate()}"
        if wr.check_files(paths).p >= at_least:
            return
        time.sleep(0.05)
    raise AssertionError(f"the writer did not reach {at_least} records")


def done_line(out: str) -> dict[str, str]:
    line = next(x for x in out.splitlines() if x.startswith("cp-writer: done"))
    return dict(kv.split("=", 1) for kv in line.split()[2:])


def test_record_bytes_match_the_python_encoder(writer_bin: Path,
                                               tmp_path: Path) -> None:
    paths = make_disks(tmp_path, "", 2)
    res = run([str(writer_bin), *disk_args(paths), "--vm", "5",
               "--run", "77", "--count", "3"])
    assert res.returncode == 0, res.stderr
    d0 = paths[0].read_bytes()
    d1 = paths[1].read_bytes()
    assert d0[:512] == wr.encode_record(1, epoch=0, vm=5, disk=0, run=77)
    assert d1[:512] == wr.encode_record(2, epoch=0, vm=5, disk=1, run=77)
    assert d0[512:1024] == wr.encode_record(3, epoch=1, vm=5, disk=0, run=77)
    assert d0[1024:] == bytes(len(d0) - 1024)


def test_single_mode_stripes_and_checks(writer_bin: Path,
                                        tmp_path: Path) -> None:
    paths = make_disks(tmp_path, "", 3)
    res = run([str(writer_bin), *disk_args(paths), "--count", "1000"])
    assert res.returncode == 0, res.stderr
    assert "mode=single" in res.stdout
    assert done_line(res.stdout)["last_seq"] == "1000"
    v = wr.check_files(paths)
    assert v.ok, v.summary()
    assert v.p == 1000
    # GCVM Fig. 4.5: disk i holds 1+i, 4+i, 7+i, ...
    for i, p in enumerate(paths):
        data = p.read_bytes()
        seqs = [struct.unpack_from("<Q", data, off + 8)[0]
                for off in range(0, 512 * 5, 512)]
        assert seqs == [1 + i + 3 * k for k in range(5)]


def test_single_mode_until_full(writer_bin: Path, tmp_path: Path) -> None:
    paths = make_disks(tmp_path, "", 2, size=64 * 512)
    res = run([str(writer_bin), *disk_args(paths)])
    assert res.returncode == 0, res.stderr
    assert done_line(res.stdout) | {"run": "-"} == {
        "vm": "1", "last_seq": "128", "written": "128", "run": "-",
        "reason": "full"}
    v = wr.check_files(paths)
    assert v.ok and v.p == 128


def test_single_mode_from_guest_environment(writer_bin: Path,
                                            tmp_path: Path) -> None:
    """The tiny-guest contract: CP_DISKS, CP_VM, CP_ARGS and no flags."""
    paths = make_disks(tmp_path, "", 3)
    env = dict(os.environ, CP_DISKS=" ".join(map(str, paths)), CP_VM="4",
               CP_IP="10.77.101.4/16", CP_PEERS="10.77.101.4",
               CP_ARGS="--count=30,--progress=0")
    res = run([str(writer_bin)], env=env)
    assert res.returncode == 0, res.stderr
    v = wr.check_files(paths)
    assert v.ok and v.p == 30
    assert all(set(s.labels) == {(4, i)} for i, s in enumerate(v.sources))


def test_single_mode_kill9_leaves_a_prefix(writer_bin: Path,
                                           tmp_path: Path) -> None:
    paths = make_disks(tmp_path, "", 3, size=4 << 20)
    proc = subprocess.Popen([str(writer_bin), *disk_args(paths)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        wait_for_records(paths, 300, [proc])
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    v = wr.check_files(paths)
    assert v.ok, v.summary()
    assert v.p >= 300


def ring(writer_bin: Path, tmp_path: Path, nvms: int, ndisks: int,
         extra: list[str]) -> tuple[list[subprocess.Popen[str]], list[Path]]:
    ports = free_ports(nvms)
    peers = ",".join(f"127.0.0.1:{p}" for p in ports)
    procs, paths = [], []
    for i in range(nvms):
        disks = make_disks(tmp_path, f"vm{i + 1}-", ndisks)
        paths += disks
        procs.append(subprocess.Popen(
            [str(writer_bin), "--vm", str(i + 1), *disk_args(disks),
             "--peers", peers, "--ring-index", str(i),
             "--connect-timeout", "30", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs, paths


@pytest.mark.parametrize("nvms", [2, 3])
def test_distributed_mode_alternates_vms(writer_bin: Path, tmp_path: Path,
                                         nvms: int) -> None:
    count = 600
    procs, paths = ring(writer_bin, tmp_path, nvms, 3, ["--count", str(count)])
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, (out, err)
        assert "mode=distributed" in out
    # Everyone stops at the same point and agrees on the run id.
    lines = [done_line(out) for out, _ in outs]
    assert {d["last_seq"] for d in lines} == {str(count)}
    assert len({d["run"] for d in lines}) == 1
    assert sum(int(d["written"]) for d in lines) == count
    v = wr.check_files(paths)
    assert v.ok, v.summary()
    assert v.p == count
    # Record s was written by VM (s-1) % nvms + 1: consecutive records
    # alternate between the writers (GCVM Fig. 4.7).
    for s in v.sources:
        ((vm, _disk),) = s.labels
        data = Path(s.name).read_bytes()
        seqs = [struct.unpack_from("<Q", data, off + 8)[0]
                for off in range(0, len(data), 512)
                if data[off:off + 4] == wr.MAGIC]
        assert seqs and all((q - 1) % nvms == vm - 1 for q in seqs)
    data = paths[0].read_bytes()  # vm1 disk0
    assert struct.unpack_from("<Q", data, 8)[0] == 1
    assert struct.unpack_from("<Q", data, 512 + 8)[0] == 1 + 3 * nvms


def test_distributed_kill9_leaves_a_prefix(writer_bin: Path,
                                           tmp_path: Path) -> None:
    procs, paths = ring(writer_bin, tmp_path, 2, 3, [])
    try:
        wait_for_records(paths, 200, procs)
    finally:
        for p in procs:
            p.send_signal(signal.SIGKILL)
        for p in procs:
            p.communicate()
    v = wr.check_files(paths)
    assert v.ok, v.summary()
    assert v.p >= 200


def test_copies_taken_one_after_another_show_a_gap(writer_bin: Path,
                                                   tmp_path: Path) -> None:
    """Host analogue of GCVM's 'Necessity of Coordinated Pause': copy disk
    0, let the writer go on, then copy the others.  The copy set holds newer
    records of disks 1-2 but not those of disk 0 written in between, so the
    checker must report a gap."""
    paths = make_disks(tmp_path, "", 3, size=4 << 20)
    proc = subprocess.Popen([str(writer_bin), *disk_args(paths),
                             "--delay-us", "200"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    copies = [tmp_path / f"copy{i}.raw" for i in range(3)]
    try:
        wait_for_records(paths, 30, [proc])
        shutil.copyfile(paths[0], copies[0])
        p0 = wr.check_files([paths[0]]).p
        wait_for_records(paths, p0 + 30, [proc])
        for src, dst in zip(paths[1:], copies[1:]):
            shutil.copyfile(src, dst)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    v = wr.check_files(copies)
    assert not v.ok
    assert v.gaps and v.torn == 0 and v.corrupt == 0 and v.duplicates == 0


def test_configuration_errors(writer_bin: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CP_")}
    res = run([str(writer_bin)], env=env)
    assert res.returncode == 2 and "no disks" in res.stderr
    res = run([str(writer_bin), "--disk", str(tmp_path / "absent")], env=env)
    assert res.returncode == 1
    assert "open" in res.stderr and "absent" in res.stderr
    res = run([str(writer_bin), "--disk", "x", "--peers",
               "127.0.0.1:1,127.0.0.1:2"], env=env)
    assert res.returncode == 2 and "--ring-index" in res.stderr
    res = run([str(writer_bin), "--disk", "x", "--count", "-1"], env=env)
    assert res.returncode == 2 and "bad number" in res.stderr


def test_leftovers_of_an_earlier_run_are_caught_and_zero_clears_them(
        writer_bin: Path, tmp_path: Path) -> None:
    paths = make_disks(tmp_path, "", 2)
    args = [str(writer_bin), *disk_args(paths), "--progress", "0"]
    assert run([*args, "--count", "300"]).returncode == 0
    assert run([*args, "--count", "100"]).returncode == 0
    v = wr.check_files(paths)
    assert not v.ok and len(v.runs) == 2
    assert any(a.kind == "foreign-run" for a in v.anomalies)
    assert run([*args, "--count", "100", "--zero"]).returncode == 0
    v = wr.check_files(paths)
    assert v.ok and v.p == 100
