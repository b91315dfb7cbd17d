"""Replication between the lab's two Ceph sites: driving `cutpoint-sync`
and the `cutpoint bench replication` benchmark.

The first half is a small toolkit the sync tests share (run the engine,
write known extents, sum `rbd diff`, hash a snapshot through `rbd export`).
The second half is the benchmark: on the same snapshots it times
`cutpoint-sync` against the `rbd export-diff | rbd import-diff` pipeline,
and reports bytes shipped against bytes changed.  It prints a table and
writes JSON; it is never a timed test.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

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


def sync_binary() -> str:
    """Path of cutpoint-sync: $CUTPOINT_SYNC, the build tree, or PATH."""
    env = os.environ.get("CUTPOINT_SYNC")
    if env:
        return env
    built = REPO / "build" / "storage" / "sync" / "cutpoint-sync"
    if built.is_file():
        return str(built)
    found = shutil.which("cutpoint-sync")
    if found:
        return found
    raise FileNotFoundError(f"cutpoint-sync not found: build it (ninja -C build) or set "
                            f"CUTPOINT_SYNC; looked at {built} and PATH")


def site_args(prefix: str, site: dict[str, Any]) -> list[str]:
    return [f"--{prefix}-conf", site["ceph_conf"], f"--{prefix}-id", site.get("client_id", "admin"),
            f"--{prefix}-keyring", site["keyring"], f"--{prefix}-pool", site.get("pool", "rbd")]


def sync_argv(status: dict[str, Any], image: str, snap: str, base: str | None = None,
              extra: Sequence[str] = (), state_dir: str = SYNC_STATE_DIR,
              reverse: bool = False) -> list[str]:
    """argv of one cutpoint-sync run primary -> DR (DR -> primary if reverse)."""
    src, dst = status["sites"]["primary"], status["sites"]["dr"]
    if reverse:
        src, dst = dst, src
    argv = [sync_binary(), *site_args("src", src), *site_args("dst", dst),
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


def rbd(site: dict[str, Any], *args: str, input: bytes | None = None,
        timeout: float = 600) -> str:
    argv = rbd_cmd(site, *args)
    cp = subprocess.run(argv, input=input, capture_output=True, timeout=timeout, check=False)
    if cp.returncode != 0:
        raise ReplicationError(argv, cp.returncode, cp.stdout.decode(errors="replace"),
                               cp.stderr.decode(errors="replace"))
    return cp.stdout.decode(errors="replace")


def pool_of(site: dict[str, Any]) -> str:
    return str(site.get("pool", "rbd"))


def spec(site: dict[str, Any], image: str, snap: str | None = None) -> str:
    return f"{pool_of(site)}/{image}" + (f"@{snap}" if snap else "")


def create_image(site: dict[str, Any], image: str, size: int) -> None:
    rbd(site, "create", "--size", f"{size // MiB}M", spec(site, image))


def remove_image(site: dict[str, Any], image: str) -> None:
    """Remove an image and its snapshots; absent is fine."""
    try:
        rbd(site, "snap", "purge", "--no-progress", spec(site, image))
    except ReplicationError as exc:
        if "No such file" in exc.stderr or "does not exist" in exc.stderr:
            return
        raise
    rbd(site, "rm", "--no-progress", spec(site, image))


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


# ---- the benchmark ------------------------------------------------------

@dataclass
class Round:
    size_mib: int
    label: str
    changed: int             # rbd diff sum (data + zero extents)
    shipped: int             # cutpoint-sync bytes_shipped
    sync_s: float
    pipe_s: float
    identical: bool | None = None
    first: str = "sync"      # which method ran first in this round
    # Where cutpoint-sync's time went (its done event's phase_ms).
    sync_phase_ms: dict[str, float] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return self.shipped / self.changed if self.changed else 0.0

    def row(self) -> dict[str, Any]:
        d = asdict(self)
        d["ratio"] = round(self.ratio, 4)
        d["sync_mbps"] = round(self.changed / MiB / self.sync_s, 1) if self.sync_s else 0.0
        d["pipe_mbps"] = round(self.changed / MiB / self.pipe_s, 1) if self.pipe_s else 0.0
        d["speedup"] = round(self.pipe_s / self.sync_s, 2) if self.sync_s else 0.0
        return d


@dataclass
class BenchConfig:
    sizes_mib: list[int] = field(default_factory=lambda: [256, 1024])
    # Incremental rounds: (MiB changed by random writes, write size KiB).
    # 64 KiB writes give many small extents; 1 MiB writes fewer, larger
    # ones.  Memstore clones a whole 4 MiB object on the first write after
    # a snapshot, so these sizes keep the lab's 4 GiB OSDs from filling.
    changes: list[tuple[int, int]] = field(
        default_factory=lambda: [(4, 64), (4, 1024), (16, 1024), (64, 1024)])
    jobs: int = 16
    state_dir: str = "/var/lib/cutpoint/bench-sync"


def _pipeline(status: dict[str, Any], image: str, dst_image: str, snap: str,
              from_snap: str | None) -> float:
    """Time `rbd export-diff ... | rbd import-diff ...` primary -> DR."""
    p, d = status["sites"]["primary"], status["sites"]["dr"]
    exp = ["export-diff", "--no-progress"]
    if from_snap:
        exp += ["--from-snap", from_snap]
    exp_argv = rbd_cmd(p, *exp, spec(p, image, snap), "-")
    imp_argv = rbd_cmd(d, "import-diff", "--no-progress", "-", spec(d, dst_image))
    t0 = time.monotonic()
    with subprocess.Popen(exp_argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as e, \
         subprocess.Popen(imp_argv, stdin=e.stdout, stderr=subprocess.PIPE) as i:
        assert e.stdout is not None
        e.stdout.close()   # import-diff owns the read end now
        ierr = i.stderr.read() if i.stderr else b""
        irc = i.wait()
        eerr = e.stderr.read() if e.stderr else b""
        erc = e.wait()
    dt = time.monotonic() - t0
    if erc != 0:
        raise ReplicationError(exp_argv, erc, "", eerr.decode(errors="replace"))
    if irc != 0:
        raise ReplicationError(imp_argv, irc, "", ierr.decode(errors="replace"))
    return dt


def _warm_up(status: dict[str, Any], cfg: BenchConfig, log: Any) -> None:
    """One untimed 16 MiB copy by each method before the timed rounds.

    Whatever runs first against a freshly started lab pays first-use costs
    (the pool's first images, the daemons' first sessions): in the runs of
    2026-11-22 the first full copy, always cutpoint-sync's, took 1.4 s where
    the same copy took 0.5 s later on.  Neither method should pay that."""
    p, d = status["sites"]["primary"], status["sites"]["dr"]
    img, ed = "bench-warm", "bench-warm-ed"
    for site, name in ((p, img), (d, img), (d, ed)):
        remove_image(site, name)
    try:
        create_image(p, img, 16 * MiB)
        create_image(d, img, 16 * MiB)
        create_image(d, ed, 16 * MiB)
        bench_write(p, img, 16 * MiB, io_size=4 * MiB, pattern_kind="seq")
        snap_create(p, img, "w0")
        run_sync(status, img, "w0", None, ["--jobs", str(cfg.jobs)], cfg.state_dir)
        _pipeline(status, img, ed, "w0", None)
        log("warm-up copy done (untimed)")
    finally:
        for site, name in ((p, img), (d, img), (d, ed)):
            try:
                remove_image(site, name)
            except ReplicationError as exc:
                log(f"cleanup: {exc}")


def _both(status: dict[str, Any], img: str, ed: str, snap: str, prev: str | None,
          extra: Sequence[str], state_dir: str, sync_first: bool) -> tuple[SyncRun, float]:
    """Replicate one round by both methods; which goes first alternates
    from round to round so neither always meets the other's leftovers
    (snapshot trimming, clones) or a cold start."""
    if sync_first:
        run = run_sync(status, img, snap, prev, extra, state_dir)
        return run, _pipeline(status, img, ed, snap, prev)
    pipe_s = _pipeline(status, img, ed, snap, prev)
    return run_sync(status, img, snap, prev, extra, state_dir), pipe_s


def run_benchmark(status: dict[str, Any], cfg: BenchConfig,
                  log: Any = print) -> dict[str, Any]:
    """Measure every (size, change) round; returns the JSON document."""
    p, d = status["sites"]["primary"], status["sites"]["dr"]
    os.makedirs(cfg.state_dir, exist_ok=True)
    rounds: list[Round] = []
    extra = ["--jobs", str(cfg.jobs)]
    _warm_up(status, cfg, log)
    turn = 0
    for size_mib in cfg.sizes_mib:
        size = size_mib * MiB
        img, ed = f"bench-sync-{size_mib}", f"bench-ed-{size_mib}"
        for site, name in ((p, img), (d, img), (d, ed)):
            remove_image(site, name)
        try:
            create_image(p, img, size)
            # Both DR images exist, empty, before the first copy:
            # import-diff needs one, and cutpoint-sync (which would create
            # its own) then does the same work, timed the same way.
            create_image(d, img, size)
            create_image(d, ed, size)
            log(f"size {size_mib} MiB: filling the image")
            bench_write(p, img, size, io_size=4 * MiB, pattern_kind="seq")
            snap_create(p, img, "b0")
            data, zero = diff_bytes(p, img, "b0")
            first = "sync" if turn % 2 == 0 else "pipeline"
            run, pipe_s = _both(status, img, ed, "b0", None, extra, cfg.state_dir,
                                first == "sync")
            turn += 1
            # Both sides are timed as whole processes (start, connect, copy).
            rounds.append(Round(size_mib, "full", data + zero, int(run.done["bytes_shipped"]),
                                run.seconds, pipe_s, first=first,
                                sync_phase_ms=run.done.get("phase_ms", {})))
            log(_fmt(rounds[-1]))
            prev = "b0"
            for k, (ch, io_kib) in enumerate(cfg.changes, start=1):
                snap = f"b{k}"
                bench_write(p, img, ch * MiB, io_size=io_kib * 1024)
                snap_create(p, img, snap)
                data, zero = diff_bytes(p, img, snap, prev)
                first = "sync" if turn % 2 == 0 else "pipeline"
                run, pipe_s = _both(status, img, ed, snap, prev, extra, cfg.state_dir,
                                    first == "sync")
                turn += 1
                rounds.append(Round(size_mib, f"+{ch} MiB/{io_kib}K", data + zero,
                                    int(run.done["bytes_shipped"]), run.seconds, pipe_s,
                                    first=first, sync_phase_ms=run.done.get("phase_ms", {})))
                prev = snap
                log(_fmt(rounds[-1]))
            # Both copies must be right, or their speed means nothing.
            want = snap_sha256(p, img, prev)
            ok = want == snap_sha256(d, img, prev) == snap_sha256(d, ed, prev)
            for r in rounds:
                if r.size_mib == size_mib:
                    r.identical = ok
        finally:
            for site, name in ((p, img), (d, img), (d, ed)):
                try:
                    remove_image(site, name)
                except ReplicationError as exc:
                    log(f"cleanup: {exc}")
    rows = [r.row() for r in rounds]
    incr = [r for r in rounds if r.label != "full"]
    tot_changed = sum(r.changed for r in incr)
    tot_shipped = sum(r.shipped for r in incr)
    tot_sync = sum(r.sync_s for r in rounds)
    tot_pipe = sum(r.pipe_s for r in rounds)
    summary = {
        "shipped_over_changed": round(tot_shipped / tot_changed, 4) if tot_changed else None,
        "max_round_ratio": round(max((r.ratio for r in incr), default=0.0), 4),
        "throughput_ratio_sync_over_pipeline": round(tot_pipe / tot_sync, 3) if tot_sync else None,
        "all_identical": all(r.identical for r in rounds),
        "target_ratio_met": bool(incr) and max(r.ratio for r in incr) <= 1.05,
        "target_throughput_met": tot_sync <= tot_pipe,
    }
    return {
        "benchmark": "replication",
        "config": asdict(cfg),
        "sync_binary": sync_binary(),
        "osd": "memstore (lab)",
        "rounds": rows,
        "summary": summary,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _fmt(r: Round) -> str:
    x = r.row()
    return (f"  {r.size_mib:>5} MiB {r.label:>9}: changed {r.changed / MiB:8.1f} MiB "
            f"shipped/changed {x['ratio']:.3f}  sync {r.sync_s:6.2f}s "
            f"pipeline {r.pipe_s:6.2f}s ({r.first} first)")


HEADER = ("| image MiB | round | changed MiB | shipped/changed | cutpoint-sync s | MiB/s "
          "| export-diff\\|import-diff s | MiB/s | speedup | first | identical |")


def table(doc: dict[str, Any]) -> str:
    lines = [HEADER, "|" + "---|" * 11]
    for r in doc["rounds"]:
        lines.append(
            f"| {r['size_mib']} | {r['label']} | {r['changed'] / MiB:.1f} | {r['ratio']:.3f} "
            f"| {r['sync_s']:.2f} | {r['sync_mbps']:.1f} | {r['pipe_s']:.2f} "
            f"| {r['pipe_mbps']:.1f} | {r['speedup']:.2f}x | {r.get('first', 'sync')} "
            f"| {r['identical']} |")
    s = doc["summary"]
    lines.append("")
    lines.append(f"shipped/changed over all incremental rounds: {s['shipped_over_changed']} "
                 f"(max per round {s['max_round_ratio']}; target <= 1.05: "
                 f"{'met' if s['target_ratio_met'] else 'NOT met'})")
    lines.append(f"throughput cutpoint-sync / pipeline (total time ratio): "
                 f"{s['throughput_ratio_sync_over_pipeline']} (target >= 1: "
                 f"{'met' if s['target_throughput_met'] else 'NOT met'})")
    lines.append(f"every DR snapshot identical to the primary by full hash: {s['all_identical']}")
    return "\n".join(lines)
