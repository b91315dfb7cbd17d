"""Replication between the lab's two Ceph sites: a small toolkit the sync
tests and the benchmark share (run `cutpoint-sync`, write known extents,
sum `rbd diff`, hash a snapshot through `rbd export`).

The benchmark `cutpoint-lab bench replication` lives beside it:
replication_bench.py (the runner), replication_report.py (pairs, rounds,
verdicts, table), replication_cluster.py (the clusters' idle state and the
OSD's write ceiling) and replication_mirror.py (rbd-mirror as a baseline).
"""

from __future__ import annotations

import hashlib
import json
import struct
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cutpoint.coordinator.dr.replicate import site_args, sync_binary
from cutpoint.lab.ceph import rbd_cmd

MiB = 1 << 20
REPO = Path(__file__).resolve().parents[2]
SYNC_STATE_DIR = "/var/lib/cutpoint/sync"


class ReplicationError(Exception):
    """A command failed: carries what was run and what came back."""

    def __init__(self, argv: Sequence[str], returncode: int, stdout: str, stderr: str):
        self.argv = list(argv)
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        tail = " | ".join((stderr or stdout).strip().splitlines()[-3:])
        super().__init__(f"command failed (rc={returncode}): {' '.join(self.argv)}: {tail}")


def sync_argv(status: dict[str, Any], image: str, snap: str, base: str | None = None,
              extra: Sequence[str] = (), state_dir: str = SYNC_STATE_DIR,
              reverse: bool = False) -> list[str]:
    """argv of one cutpoint-sync run primary -> DR (DR -> primary if reverse), as
    the lab's admin client (the engine measured alone, as before sites were
    the control plane's)."""
    from cutpoint.lab.sites import ceph_site

    src, dst = ceph_site(status, "primary", "admin"), ceph_site(status, "dr", "admin")
    if reverse:
        src, dst = dst, src
    argv = [sync_binary(), *site_args("src", src, "rbd", state_dir),
            *site_args("dst", dst, "rbd", state_dir),
            "--image", image, "--snap", snap, "--state-dir", state_dir]
    if base:
        argv += ["--base", base]
    return argv + list(extra)


@dataclass
class SyncRun:
    argv: list[str]
    returncode: int
    events: list[dict[str, Any]]
    stderr: str
    seconds: float

    @property
    def done(self) -> dict[str, Any]:
        ev: dict[str, Any]
        for ev in reversed(self.events):
            if ev.get("event") == "done":
                return ev
        raise ReplicationError(self.argv, self.returncode, "", f"no done event: {self.stderr}")

    @property
    def error(self) -> dict[str, Any] | None:
        ev: dict[str, Any]
        for ev in reversed(self.events):
            if ev.get("event") == "error":
                return ev
        return None


def parse_events(text: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        if line.strip():
            ev = json.loads(line)
            if not isinstance(ev, dict):
                raise ValueError(f"cutpoint-sync printed a non-object event: {line!r}")
            out.append(ev)
    return out


def run_sync(status: dict[str, Any], image: str, snap: str, base: str | None = None,
             extra: Sequence[str] = (), state_dir: str = SYNC_STATE_DIR,
             check: bool = True, timeout: float = 900) -> SyncRun:
    argv = sync_argv(status, image, snap, base, extra, state_dir)
    t0 = time.monotonic()
    cp = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    run = SyncRun(argv, cp.returncode, parse_events(cp.stdout), cp.stderr,
                  time.monotonic() - t0)
    if check and cp.returncode != 0:
        raise ReplicationError(argv, cp.returncode, cp.stdout, cp.stderr)
    return run


def _checked(argv: list[str], timeout: float, input: bytes | None = None) -> str:
    """stdout of argv; a timeout or a non-zero exit raises ReplicationError."""
    try:
        cp = subprocess.run(argv, input=input, capture_output=True, timeout=timeout,
                            check=False)
    except subprocess.TimeoutExpired:
        raise ReplicationError(argv, -1, "", f"no answer within {timeout:.0f} s") from None
    if cp.returncode != 0:
        raise ReplicationError(argv, cp.returncode, cp.stdout.decode(errors="replace"),
                               cp.stderr.decode(errors="replace"))
    return cp.stdout.decode(errors="replace")


def rbd(site: dict[str, Any], *args: str, input: bytes | None = None,
        timeout: float = 600) -> str:
    return _checked(rbd_cmd(site, *args), timeout, input)


def pool_of(site: dict[str, Any]) -> str:
    return str(site.get("pool", "rbd"))


def spec(site: dict[str, Any], image: str, snap: str | None = None) -> str:
    return f"{pool_of(site)}/{image}" + (f"@{snap}" if snap else "")


def create_image(site: dict[str, Any], image: str, size: int) -> None:
    rbd(site, "create", "--size", f"{size // MiB}M", spec(site, image))


def remove_image(site: dict[str, Any], image: str, timeout: float = 600) -> None:
    """Remove an image and its snapshots; absent is fine."""
    try:
        rbd(site, "snap", "purge", "--no-progress", spec(site, image), timeout=timeout)
    except ReplicationError as exc:
        if "No such file" in exc.stderr or "does not exist" in exc.stderr:
            return
        raise
    rbd(site, "rm", "--no-progress", spec(site, image), timeout=timeout)


def snap_create(site: dict[str, Any], image: str, snap: str) -> None:
    rbd(site, "snap", "create", "--no-progress", spec(site, image, snap))


def snaps(site: dict[str, Any], image: str) -> list[str]:
    try:
        out = rbd(site, "snap", "ls", "--format", "json", spec(site, image))
    except ReplicationError as exc:
        if "No such file" in exc.stderr:
            return []
        raise
    return [s["name"] for s in json.loads(out)]


def image_exists(site: dict[str, Any], image: str) -> bool:
    out = rbd(site, "ls", "--format", "json", pool_of(site))
    return image in json.loads(out)


def diff_stream(size: int, extents: Sequence[tuple[int, bytes | int]]) -> bytes:
    """An `rbd diff v1` stream: (offset, data) writes or (offset, length) zeroes.

    Fed to `rbd import-diff`, it writes exact patterns and discards, which
    is how the tests lay down known content (see doc/dev/rbd-diff.rst in
    Ceph for the format: tag, little-endian u64 fields)."""
    out = bytearray(b"rbd diff v1\n")
    out += b"s" + struct.pack("<Q", size)
    for off, what in extents:
        if isinstance(what, int):
            out += b"z" + struct.pack("<QQ", off, what)
        else:
            out += b"w" + struct.pack("<QQ", off, len(what)) + what
    out += b"e"
    return bytes(out)


def write_extents(site: dict[str, Any], image: str, size: int,
                  extents: Sequence[tuple[int, bytes | int]]) -> None:
    rbd(site, "import-diff", "--no-progress", "-", spec(site, image),
        input=diff_stream(size, extents))


def pattern(seed: int, n: int) -> bytes:
    """n deterministic pseudo-random bytes (not compressible, not zero)."""
    out = bytearray()
    counter = 0
    while len(out) < n:
        out += hashlib.sha256(f"{seed}:{counter}".encode()).digest() * 128
        counter += 1
    return bytes(out[:n])


def diff_bytes(site: dict[str, Any], image: str, snap: str,
               from_snap: str | None = None) -> tuple[int, int]:
    """(data bytes, zero bytes) of `rbd diff [--from-snap] image@snap`."""
    args = ["diff", "--format", "json"]
    if from_snap:
        args += ["--from-snap", from_snap]
    rows = json.loads(rbd(site, *args, spec(site, image, snap)))
    # Pacific prints "exists" as the string "true"/"false".
    data = sum(r["length"] for r in rows if str(r.get("exists")).lower() == "true")
    zero = sum(r["length"] for r in rows) - data
    return data, zero


def snap_sha256(site: dict[str, Any], image: str, snap: str) -> str:
    """SHA-256 of a whole snapshot as `rbd export` streams it (independent
    of cutpoint-sync's own hashing)."""
    argv = rbd_cmd(site, "export", "--no-progress", spec(site, image, snap), "-")
    h = hashlib.sha256()
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as p:
        assert p.stdout is not None
        while chunk := p.stdout.read(4 * MiB):
            h.update(chunk)
        err = p.stderr.read() if p.stderr else b""
        rc = p.wait()
    if rc != 0:
        raise ReplicationError(argv, rc, "", err.decode(errors="replace"))
    return h.hexdigest()


def bench_write(site: dict[str, Any], image: str, total: int, io_size: int = 64 * 1024,
                pattern_kind: str = "rand") -> None:
    """Change `total` bytes of the image with `rbd bench` (a real writer)."""
    rbd(site, "bench", "--io-type", "write", "--io-size", str(io_size), "--io-total",
        str(total), "--io-pattern", pattern_kind, spec(site, image), timeout=1800)
