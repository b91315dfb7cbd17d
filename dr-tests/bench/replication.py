"""Replication between the lab's two Ceph sites: driving `cutpoint-sync`
and the `cutpoint-lab bench replication` benchmark.

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
import statistics
import struct
import subprocess
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
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


# ---- the benchmark ------------------------------------------------------
#
# Every round is measured as `repeats` interleaved pairs, each pair one copy
# by each method of the same snapshots, the first method alternating from
# pair to pair (ABBA...).  A round reports the median and the spread of each
# method; the verdict compares medians.  Before every pair the bench waits
# until neither cluster is doing background work left over from the bench
# itself (snapshot trimming of removed snapshots and images, PGs not
# active+clean): see docs/benchmarks.md "Replication" for the run where the
# trimming of the 256 MiB images overlapped the 1 GiB full copies.


@dataclass
class Pair:
    """One copy by each method of the same snapshot (pair of timings)."""
    changed: int             # rbd diff sum (data + zero extents)
    shipped: int             # cutpoint-sync bytes_shipped
    sync_s: float
    pipe_s: float
    first: str = "sync"      # which method ran first in this pair
    # Where cutpoint-sync's time went (its done event's phase_ms).
    sync_phase_ms: dict[str, float] = field(default_factory=dict)
    # Waited before the pair for the clusters to be idle, and what they
    # were still doing when the wait began (empty: idle at once).
    settle_s: float = 0.0
    busy: list[str] = field(default_factory=list)
    # CPU seconds both OSDs spent while each method ran, and the 1-minute
    # load average when the pair began.
    sync_osd_cpu_s: float = 0.0
    pipe_osd_cpu_s: float = 0.0
    load: float = 0.0

    @property
    def ratio(self) -> float:
        return self.shipped / self.changed if self.changed else 0.0


def median(xs: Sequence[float]) -> float:
    if not xs:
        raise ValueError("median of no values")
    return float(statistics.median(xs))


def _rate(changed: int, seconds: float) -> float:
    return changed / MiB / seconds if seconds > 0 else 0.0


@dataclass
class Round:
    size_mib: int
    label: str
    pairs: list[Pair] = field(default_factory=list)
    identical: bool | None = None

    @property
    def changed(self) -> int:
        return sum(p.changed for p in self.pairs)

    @property
    def shipped(self) -> int:
        return sum(p.shipped for p in self.pairs)

    @property
    def ratio(self) -> float:
        return self.shipped / self.changed if self.changed else 0.0

    @property
    def sync_s(self) -> float:
        """Median over the pairs."""
        return median([p.sync_s for p in self.pairs])

    @property
    def pipe_s(self) -> float:
        return median([p.pipe_s for p in self.pairs])

    def row(self) -> dict[str, Any]:
        ps = self.pairs
        phase_keys = sorted({k for p in ps for k in p.sync_phase_ms})
        return {
            "size_mib": self.size_mib,
            "label": self.label,
            "n": len(ps),
            "changed": self.changed,
            "changed_median": int(median([p.changed for p in ps])),
            "shipped": self.shipped,
            "ratio": round(self.ratio, 4),
            "max_pair_ratio": round(max(p.ratio for p in ps), 4),
            "sync_s": round(self.sync_s, 4),
            "sync_min_s": round(min(p.sync_s for p in ps), 4),
            "sync_max_s": round(max(p.sync_s for p in ps), 4),
            "pipe_s": round(self.pipe_s, 4),
            "pipe_min_s": round(min(p.pipe_s for p in ps), 4),
            "pipe_max_s": round(max(p.pipe_s for p in ps), 4),
            # MiB/s: the median of the pairs' rates (changed / time).
            "sync_mbps": round(median([_rate(p.changed, p.sync_s) for p in ps]), 1),
            "pipe_mbps": round(median([_rate(p.changed, p.pipe_s) for p in ps]), 1),
            "speedup": round(self.pipe_s / self.sync_s, 3) if self.sync_s else 0.0,
            "sync_wins": sum(1 for p in ps if p.sync_s <= p.pipe_s),
            "identical": self.identical,
            "sync_phase_ms": {k: round(median([p.sync_phase_ms.get(k, 0.0) for p in ps]), 2)
                              for k in phase_keys},
            "pairs": [asdict(p) for p in ps],
        }


@dataclass
class BenchConfig:
    sizes_mib: list[int] = field(default_factory=lambda: [256, 1024])
    # Incremental rounds: (MiB changed by random writes, write size KiB).
    # 64 KiB writes give many small extents; 1 MiB writes fewer, larger
    # ones.  Memstore clones a whole 4 MiB object on the first write after
    # a snapshot, so these sizes keep the lab's 4 GiB OSDs from filling
    # (and the bench drops each snapshot once it is no longer a base).
    changes: list[tuple[int, int]] = field(
        default_factory=lambda: [(4, 64), (4, 1024), (16, 1024), (64, 1024)])
    jobs: int = 16
    # Interleaved pairs per round; the verdict compares the medians.
    repeats: int = 3
    # Wait before every pair until both clusters are idle (see settle()).
    settle: bool = True
    settle_timeout: float = 300.0
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


def ceph(site: dict[str, Any], *args: str, timeout: float = 60) -> str:
    argv = ["ceph", "-c", site["ceph_conf"], "--id", site.get("client_id", "admin"),
            "--keyring", site["keyring"], *args]
    return _checked(argv, timeout)


def dead_osds(status: dict[str, Any]) -> list[str]:
    """Names of the sites whose OSD process is gone (empty: all alive)."""
    dead = []
    for name in ("primary", "dr"):
        pid = status["sites"][name].get("pids", {}).get("osd.0")
        if pid and not os.path.exists(f"/proc/{pid}"):
            dead.append(name)
    return dead


def busy_reasons(pg_ls: Any) -> list[str]:
    """What a cluster is still doing in the background, from the JSON of
    `ceph pg ls`; empty when idle.  A PG that is not exactly active+clean
    (snaptrim, snaptrim_wait, peering, ...) or still has snapshots queued
    for trimming is busy."""
    stats = pg_ls.get("pg_stats", []) if isinstance(pg_ls, dict) else pg_ls
    states: dict[str, int] = {}
    queued = 0
    for pg in stats:
        st = str(pg.get("state", "?"))
        if st != "active+clean":
            states[st] = states.get(st, 0) + 1
        queued += int(pg.get("snaptrimq_len", 0) or 0)
    out = [f"{n} pg {st}" for st, n in sorted(states.items())]
    if queued:
        out.append(f"{queued} snapshots queued for trimming")
    return out


def _osd_ids(site: dict[str, Any]) -> list[int]:
    return [int(i) for i in json.loads(ceph(site, "osd", "ls", "--format", "json"))]


def cluster_busy(site: dict[str, Any]) -> list[str]:
    """busy_reasons() of one site, on PG stats the OSDs have just sent.

    The mgr hears from the OSDs only every few seconds, so right after a
    snapshot or image removal `ceph pg ls` can still say active+clean
    (seen: idle for 3 s after the 256 MiB images were removed, then
    snaptrim for minutes).  Each OSD is asked to flush its PG stats first,
    and the mgr's copy is read once it has that report (the way Ceph's own
    tests wait: flush_pg_stats, then `ceph osd last-stat-seq`)."""
    seqs = {i: int(ceph(site, "tell", f"osd.{i}", "flush_pg_stats").strip() or 0)
            for i in _osd_ids(site)}
    deadline = time.monotonic() + 30
    for i, seq in seqs.items():
        while int(ceph(site, "osd", "last-stat-seq", f"osd.{i}").strip()) < seq:
            if time.monotonic() > deadline:
                return [f"osd.{i} stats not reported within 30 s"]
            time.sleep(0.1)
    return busy_reasons(json.loads(ceph(site, "pg", "ls", "--format", "json")))


def _both_sites(status: dict[str, Any]) -> list[str]:
    names = ("primary", "dr")
    with ThreadPoolExecutor(2) as ex:
        got = list(ex.map(lambda n: cluster_busy(status["sites"][n]), names))
    return [f"{n}: {r}" for n, why in zip(names, got) for r in why]


def settle(status: dict[str, Any], timeout: float, log: Any = print,
           interval: float = 0.3) -> tuple[float, list[str]]:
    """Wait until both clusters have no background work; returns (seconds
    waited, what they were doing when the wait began)."""
    t0 = time.monotonic()
    if dead := dead_osds(status):
        raise ReplicationError(["settle"], -1, "", f"the OSD of {', '.join(dead)} is gone")
    first = why = _both_sites(status)
    while why:
        if time.monotonic() - t0 > timeout:
            log(f"  clusters still busy after {timeout:.0f} s, timing anyway: {why}")
            return time.monotonic() - t0, first + ["TIMEOUT"]
        time.sleep(interval)
        if dead := dead_osds(status):
            raise ReplicationError(["settle"], -1, "", f"the OSD of {', '.join(dead)} is gone")
        why = _both_sites(status)
    return time.monotonic() - t0, first


# osd_snap_trim_sleep while the bench runs.  0 would mean "the device
# class default", which is osd_snap_trim_sleep_hdd = 5 s per batch for
# memstore: the trimming of one removed 256 MiB image with 5 snapshots
# then lasted over 80 s (and the old bench timed its 1 GiB copies inside
# it); at 1 ms it took under 6 s.  Trimming is waited out before every
# timed pair either way; this only shortens the wait.
TRIM_SLEEP = "0.001"


def _trim_sleep(status: dict[str, Any],
                want: dict[str, str | None]) -> dict[str, str | None]:
    """Set osd_snap_trim_sleep per site (None: remove the setting);
    returns what each site's config database held before."""
    before: dict[str, str | None] = {}
    for name, value in want.items():
        site = status["sites"][name]
        dump = json.loads(ceph(site, "config", "dump", "--format", "json"))
        before[name] = next((str(e["value"]) for e in dump
                             if e.get("name") == "osd_snap_trim_sleep"
                             and e.get("section") == "osd"), None)
        if value is None:
            ceph(site, "config", "rm", "osd", "osd_snap_trim_sleep")
        else:
            ceph(site, "config", "set", "osd", "osd_snap_trim_sleep", value)
    return before


def _osd_cpu(status: dict[str, Any]) -> float:
    """CPU seconds (user + system) used so far by both sites' OSDs."""
    tck = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for name in ("primary", "dr"):
        pid = status["sites"][name].get("pids", {}).get("osd.0")
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tck
        except (OSError, IndexError, ValueError):
            return float("nan")
    return total


def _load() -> float:
    return os.getloadavg()[0]


def _warm_up(status: dict[str, Any], cfg: BenchConfig, log: Any) -> None:
    """One untimed full copy by each method, of the largest image size,
    before the timed rounds; its images are removed and their removal
    waited out.

    Whatever runs first against a freshly started lab pays first-use costs
    (the pool's first images, the daemons' first sessions), and above all
    memstore's first growth: on 2026-11-22 at 07:57 the first 1 GiB full
    copies after `lab up` took 5.77 s (cutpoint-sync) and 5.24 s (the
    pipeline) with 8.6 and 7.0 s of OSD CPU, the next pair 1.57 s each with
    1.6 and 1.3 s, once the OSDs had held that much data before.  Neither
    method should pay that inside a timed pair."""
    p, d = status["sites"]["primary"], status["sites"]["dr"]
    size = max(cfg.sizes_mib) * MiB
    img, ed = "bench-warm", "bench-warm-ed"
    for site, name in ((p, img), (d, img), (d, ed), (d, "bench-warm-x")):
        remove_image(site, name)
    try:
        create_image(p, img, size)
        create_image(d, img, size)
        create_image(d, ed, size)
        bench_write(p, img, size, io_size=4 * MiB, pattern_kind="seq")
        snap_create(p, img, "w0")
        run_sync(status, img, "w0", None, ["--jobs", str(cfg.jobs)], cfg.state_dir)
        _pipeline(status, img, ed, "w0", None)
        # The DR OSD must also have held as much as the run's peak: the
        # smaller sizes' images stay until the end, so the largest size's
        # full copies come on top of them.  In the run of 08:44 the second
        # copy of the first 1 GiB pair (cutpoint-sync) took 4.50 s with
        # 6.6 s of OSD CPU against 1.84 s and 1.8 s in the next pair.
        extra = (sum(cfg.sizes_mib) - max(cfg.sizes_mib)) * 2 * MiB + 512 * MiB
        create_image(d, "bench-warm-x", extra)
        bench_write(d, "bench-warm-x", extra, io_size=4 * MiB, pattern_kind="seq")
        log(f"warm-up copy of {size // MiB} MiB done (untimed), DR held "
            f"{(2 * size + extra) // MiB} MiB")
    finally:
        for site, name in ((p, img), (d, img), (d, ed), (d, "bench-warm-x")):
            try:
                remove_image(site, name)
            except ReplicationError as exc:
                log(f"cleanup: {exc}")


class _Bench:
    """The state of one benchmark run: the turn counter that alternates
    the first method over all pairs, and the settle policy."""

    def __init__(self, status: dict[str, Any], cfg: BenchConfig, log: Any):
        self.status, self.cfg, self.log = status, cfg, log
        self.turn = 0
        self.extra = ["--jobs", str(cfg.jobs)]

    def pair(self, img: str, ed: str, snap: str, prev: str | None) -> Pair:
        """Replicate one snapshot by both methods, once the clusters are
        idle; which goes first alternates from pair to pair so neither
        always meets the other's leftovers or a cold start."""
        p = self.status["sites"]["primary"]
        data, zero = diff_bytes(p, img, snap, prev)
        settle_s, busy = 0.0, []
        if self.cfg.settle:
            settle_s, busy = settle(self.status, self.cfg.settle_timeout, self.log)
        else:
            busy = _both_sites(self.status)
        sync_first = self.turn % 2 == 0
        self.turn += 1
        load = _load()
        run: SyncRun | None = None
        pipe_s = sync_cpu = pipe_cpu = 0.0
        for method in (("sync", "pipe") if sync_first else ("pipe", "sync")):
            c0 = _osd_cpu(self.status)
            if method == "sync":
                run = run_sync(self.status, img, snap, prev, self.extra, self.cfg.state_dir)
                sync_cpu = _osd_cpu(self.status) - c0
            else:
                pipe_s = _pipeline(self.status, img, ed, snap, prev)
                pipe_cpu = _osd_cpu(self.status) - c0
        assert run is not None
        # Both sides are timed as whole processes (start, connect, copy).
        return Pair(data + zero, int(run.done["bytes_shipped"]), run.seconds, pipe_s,
                    "sync" if sync_first else "pipeline", run.done.get("phase_ms", {}),
                    round(settle_s, 3), busy, round(sync_cpu, 3), round(pipe_cpu, 3),
                    round(load, 2))

    def quiesce(self) -> None:
        """Wait out the trimming of what was just removed before anything
        writes again.  Why: at 08:30 on 2026-11-22 the DR OSD died of a
        segfault in the snapshot trimmer (MemStore::OmapIteratorImpl::value
        under SnapMapper::get_next_objects_to_trim) while trimming a removed
        snapshot as the next round's copies wrote to the pool; trimming
        and writes no longer overlap."""
        if self.cfg.settle:
            settle(self.status, self.cfg.settle_timeout, self.log)

    def size(self, size_mib: int, rounds: list[Round]) -> None:
        p, d = self.status["sites"]["primary"], self.status["sites"]["dr"]
        cfg, log = self.cfg, self.log
        size = size_mib * MiB
        img, ed = f"bench-sync-{size_mib}", f"bench-ed-{size_mib}"
        for site, name in ((p, img), (d, img), (d, ed)):
            remove_image(site, name)
        create_image(p, img, size)
        log(f"size {size_mib} MiB: filling the image")
        bench_write(p, img, size, io_size=4 * MiB, pattern_kind="seq")
        snap_create(p, img, "b0")
        full = Round(size_mib, "full")
        for k in range(cfg.repeats):
            # Both DR images exist, empty, before every full copy:
            # import-diff needs one, and cutpoint-sync (which would create
            # its own) then does the same work, timed the same way.  The
            # previous pair's copies are removed first; settle() waits for
            # their removal to finish in the OSD.
            if k:
                for name in (img, ed):
                    remove_image(d, name)
                self.quiesce()
            create_image(d, img, size)
            create_image(d, ed, size)
            full.pairs.append(self.pair(img, ed, "b0", None))
            log(_fmt(full, full.pairs[-1]))
        rounds.append(full)
        mine = [full]
        prev, n = "b0", 0
        for ch, io_kib in cfg.changes:
            r = Round(size_mib, f"+{ch} MiB/{io_kib}K")
            for _ in range(cfg.repeats):
                n += 1
                snap = f"b{n}"
                bench_write(p, img, ch * MiB, io_size=io_kib * 1024)
                snap_create(p, img, snap)
                r.pairs.append(self.pair(img, ed, snap, prev))
                log(_fmt(r, r.pairs[-1]))
                # The old base is no longer needed by anyone: dropping it
                # bounds memstore's clones (4 GiB per OSD).  Its trimming is
                # waited out at once, before the next writes (see quiesce).
                for site, name in ((p, img), (d, img), (d, ed)):
                    rbd(site, "snap", "rm", "--no-progress", spec(site, name, prev))
                self.quiesce()
                prev = snap
            rounds.append(r)
            mine.append(r)
        # Both copies must be right, or their speed means nothing.
        want = snap_sha256(p, img, prev)
        ok = want == snap_sha256(d, img, prev) == snap_sha256(d, ed, prev)
        for r in mine:
            r.identical = ok


def run_benchmark(status: dict[str, Any], cfg: BenchConfig,
                  log: Any = print) -> dict[str, Any]:
    """Measure every (size, change) round; returns the JSON document."""
    if cfg.repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {cfg.repeats}")
    p, d = status["sites"]["primary"], status["sites"]["dr"]
    os.makedirs(cfg.state_dir, exist_ok=True)
    rounds: list[Round] = []
    t0, load0 = time.monotonic(), _load()
    bench = _Bench(status, cfg, log)
    names: list[tuple[dict[str, Any], str]] = []
    before = _trim_sleep(status, {"primary": TRIM_SLEEP, "dr": TRIM_SLEEP})
    try:
        _warm_up(status, cfg, log)
        bench.quiesce()
        for size_mib in cfg.sizes_mib:
            names += [(p, f"bench-sync-{size_mib}"), (d, f"bench-sync-{size_mib}"),
                      (d, f"bench-ed-{size_mib}")]
            bench.size(size_mib, rounds)
    finally:
        # A size's images are removed only at the end, so their trimming
        # never overlaps a timed copy of this run.  With an OSD gone every
        # removal would hang; the lab is broken and `lab down` clears it.
        dead = dead_osds(status)
        if dead:
            log(f"cleanup skipped: the OSD of {', '.join(dead)} is gone")
        for site, name in names if not dead else []:
            try:
                remove_image(site, name, timeout=120)
            except ReplicationError as exc:
                log(f"cleanup: {exc}")
        try:
            _trim_sleep(status, before)
        except ReplicationError as exc:
            log(f"cleanup: osd_snap_trim_sleep not restored: {exc}")
    return {
        "benchmark": "replication",
        "config": asdict(cfg),
        "sync_binary": sync_binary(),
        "osd": "memstore (lab)",
        "rounds": [r.row() for r in rounds],
        "summary": summarize(rounds),
        "wall_s": round(time.monotonic() - t0, 1),
        "load": [round(load0, 2), round(_load(), 2)],
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _ratio(rounds: Sequence[Round]) -> float | None:
    """Sum of the pipeline's medians over the sum of cutpoint-sync's."""
    s = sum(r.sync_s for r in rounds)
    return round(sum(r.pipe_s for r in rounds) / s, 3) if s else None


def summarize(rounds: Sequence[Round]) -> dict[str, Any]:
    """The verdicts, from the per-round medians (never from one sample)."""
    incr = [r for r in rounds if r.label != "full"]
    full = [r for r in rounds if r.label == "full"]
    pairs = [p for r in rounds for p in r.pairs]
    tot_changed = sum(r.changed for r in incr)
    max_pair = max((p.ratio for r in incr for p in r.pairs), default=0.0)
    ratio = _ratio(rounds)
    return {
        "shipped_over_changed": round(sum(r.shipped for r in incr) / tot_changed, 4)
        if tot_changed else None,
        "max_pair_ratio": round(max_pair, 4),
        # pipeline time / cutpoint-sync time, both sums of per-round medians
        "throughput_ratio_sync_over_pipeline": ratio,
        "full_ratio": _ratio(full),
        "incremental_ratio": _ratio(incr),
        "rounds_sync_not_slower": sum(1 for r in rounds if r.sync_s <= r.pipe_s),
        "rounds": len(rounds),
        "pairs_sync_not_slower": sum(1 for p in pairs if p.sync_s <= p.pipe_s),
        "pairs": len(pairs),
        "settle_s_total": round(sum(p.settle_s for p in pairs), 1),
        "pairs_busy_before": sum(1 for p in pairs if p.busy),
        "all_identical": bool(rounds) and all(r.identical for r in rounds),
        "target_ratio_met": bool(incr) and max_pair <= 1.05,
        "target_throughput_met": ratio is not None and ratio >= 1.0,
    }


def _fmt(r: Round, x: Pair) -> str:
    busy = f" (waited {x.settle_s:.1f} s for: {'; '.join(x.busy)})" if x.busy else ""
    return (f"  {r.size_mib:>5} MiB {r.label:>9} #{len(r.pairs)}: changed "
            f"{x.changed / MiB:8.1f} MiB shipped/changed {x.ratio:.3f}  sync "
            f"{x.sync_s:6.2f}s pipeline {x.pipe_s:6.2f}s ({x.first} first){busy}")


HEADER = ("| image MiB | round | n | changed MiB | shipped/changed | cutpoint-sync s "
          "median (min–max) | MiB/s | export-diff\\|import-diff s median (min–max) | MiB/s "
          "| speedup | sync not slower | identical |")


def table(doc: dict[str, Any]) -> str:
    lines = [HEADER, "|" + "---|" * 12]
    for r in doc["rounds"]:
        lines.append(
            f"| {r['size_mib']} | {r['label']} | {r['n']} | {r['changed_median'] / MiB:.1f} "
            f"| {r['ratio']:.3f} | {r['sync_s']:.2f} ({r['sync_min_s']:.2f}–{r['sync_max_s']:.2f}) "
            f"| {r['sync_mbps']:.1f} | {r['pipe_s']:.2f} ({r['pipe_min_s']:.2f}–"
            f"{r['pipe_max_s']:.2f}) | {r['pipe_mbps']:.1f} | {r['speedup']:.2f}x "
            f"| {r['sync_wins']}/{r['n']} | {r['identical']} |")
    s = doc["summary"]
    lines.append("")
    lines.append(f"shipped/changed over all incremental pairs: {s['shipped_over_changed']} "
                 f"(max per pair {s['max_pair_ratio']}; target <= 1.05: "
                 f"{'met' if s['target_ratio_met'] else 'NOT met'})")
    lines.append(f"throughput cutpoint-sync / pipeline (sum of per-round median times): "
                 f"{s['throughput_ratio_sync_over_pipeline']} (full copies "
                 f"{s['full_ratio']}, incremental {s['incremental_ratio']}; target >= 1: "
                 f"{'met' if s['target_throughput_met'] else 'NOT met'})")
    lines.append(f"rounds where cutpoint-sync's median is not slower: "
                 f"{s['rounds_sync_not_slower']}/{s['rounds']}; pairs: "
                 f"{s['pairs_sync_not_slower']}/{s['pairs']}")
    lines.append(f"waited for idle clusters: {s['settle_s_total']} s in all, "
                 f"{s['pairs_busy_before']} pairs found leftover work")
    lines.append(f"every DR snapshot identical to the primary by full hash: {s['all_identical']}")
    return "\n".join(lines)
