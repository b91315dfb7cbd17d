"""The runner of `cutpoint-lab bench replication`: on the same snapshots it
times cutpoint-sync against `rbd export-diff | rbd import-diff` and, with
`--baseline export-diff,rbd-mirror`, against rbd-mirror in snapshot mode
(replication_mirror.py), and measures the memstore OSD's write ceiling at
DR in the same run (replication_cluster.write_ceiling).  The bookkeeping
and the table are in replication_report.py.  It prints a table and writes
JSON; it is never a timed test.

Every round is measured as `repeats` interleaved turns, each turn one copy
by each method of the same change set, the first method rotating from turn
to turn.  A round reports the median and the spread of each method; the
verdict compares medians.  Before every turn the bench waits until neither
cluster is doing background work left over from the bench itself
(snapshot trimming of removed snapshots and images, PGs not active+clean):
see docs/benchmarks.md "Replication" for the run where the trimming of the
256 MiB images overlapped the 1 GiB full copies.

cutpoint-sync is measured twice: one process per copy (the one-shot
command line, timed as a whole process) and through a `--serve` session
(the control plane's path since coordinator/dr/replicate.py uses it: one
session per image size, connected before the rounds, timed from the
request to its done event); the session writes into its own DR pool
(`bench-serve`), since both copy the same image name.  rbd-mirror mirrors
an image to the same name at DR too; it gets its own primary image
(`bench-rm-N`), kept identical to cutpoint-sync's source by replaying
each change set into it (`rbd export-diff | rbd import-diff` inside the
primary, untimed) before the turn.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from cutpoint.bench.replication import (
    MiB,
    ReplicationError,
    SyncRun,
    bench_write,
    create_image,
    diff_bytes,
    rbd,
    remove_image,
    run_sync,
    snap_create,
    snap_sha256,
    spec,
    sync_binary,
)
from cutpoint.bench.replication_cluster import (
    TRIM_SLEEP,
    both_sites,
    ceph,
    dead_osds,
    load,
    osd_cpu,
    settle,
    trim_sleep,
    write_ceiling,
)
from cutpoint.bench.replication_mirror import Mirror
from cutpoint.bench.replication_report import Pair, Round, fmt, summarize
from cutpoint.bench.replication_serve import SyncSession
from cutpoint.lab.ceph import rbd_cmd

BASELINES = ("export-diff", "rbd-mirror")
# The DR memstore OSD holds 4 GiB: each size has a copy there per method
# (cutpoint-sync's, the serve session's, the pipeline's, rbd-mirror's) plus
# memstore's clones of written objects; keep the copies under this.
DR_BUDGET_MIB = 3072
SERVE_POOL = "bench-serve"

@dataclass
class BenchConfig:
    sizes_mib: list[int] = field(default_factory=lambda: [256, 512])
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
    # export-diff always runs (the pipeline); rbd-mirror on request.
    baselines: list[str] = field(default_factory=lambda: ["export-diff"])
    # Write sizes (KiB) whose ceiling is measured; empty: the rounds' sizes
    # and 4 MiB.  ceiling False: not measured.
    ceiling: bool = True
    # cutpoint-sync --serve measured beside the one-shot runs.
    serve: bool = True

    @property
    def mirror(self) -> bool:
        return "rbd-mirror" in self.baselines

    @property
    def dr_copies(self) -> int:
        """Copies of each size the DR OSD holds at once."""
        return 2 + int(self.serve) + int(self.mirror)

    def validate(self) -> None:
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")
        bad = [b for b in self.baselines if b not in BASELINES]
        if bad or "export-diff" not in self.baselines:
            raise ValueError(f"--baseline takes export-diff (always) and rbd-mirror, got "
                             f"{','.join(self.baselines)}")
        if self.dr_copies * sum(self.sizes_mib) > DR_BUDGET_MIB:
            raise ValueError(f"every size is held {self.dr_copies} times at DR (a copy per "
                             f"method): {self.dr_copies} x {sum(self.sizes_mib)} MiB is over "
                             f"the lab's {DR_BUDGET_MIB} MiB budget (4 GiB memstore OSD); "
                             "use smaller --sizes-mib (256,512 fits)")


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


def _warm_up(status: dict[str, Any], cfg: BenchConfig, log: Any,
             mirror: Mirror | None = None) -> None:
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
    img, ed, rm = "bench-warm", "bench-warm-ed", "bench-warm-rm"
    for site, name in ((p, img), (d, img), (d, ed), (d, "bench-warm-x"), (p, rm)):
        remove_image(site, name)
    try:
        create_image(p, img, size)
        create_image(d, img, size)
        create_image(d, ed, size)
        bench_write(p, img, size, io_size=4 * MiB, pattern_kind="seq")
        snap_create(p, img, "w0")
        run_sync(status, img, "w0", None, ["--jobs", str(cfg.jobs)], cfg.state_dir)
        _pipeline(status, img, ed, "w0", None)
        if cfg.serve:
            with SyncSession(status, ["--jobs", str(cfg.jobs)], cfg.state_dir) as sess:
                sess.copy(img, "w0", dst_pool=SERVE_POOL)
        if mirror is not None:
            # rbd-mirror's first image (its first sessions to both sites).
            # An image of its own: rbd-mirror creates its DR copy and
            # refuses a DR image of that name made by another method
            # ("failed to create local image: (17) File exists").
            create_image(p, rm, size)
            bench_write(p, rm, size, io_size=4 * MiB, pattern_kind="seq")
            log(f"warm-up: rbd-mirror full copy {mirror.enable(rm):.2f} s (untimed)")
            mirror.snapshot(rm)
            mirror.disable(rm)
        # The DR OSD must also have held as much as the run's peak: the
        # smaller sizes' images stay until the end, so the largest size's
        # full copies come on top of them.  In the run of 08:44 the second
        # copy of the first 1 GiB pair (cutpoint-sync) took 4.50 s with
        # 6.6 s of OSD CPU against 1.84 s and 1.8 s in the next pair.
        held = (2 + int(cfg.serve)) * size
        extra = max(cfg.dr_copies * sum(cfg.sizes_mib) * MiB - held, 64 * MiB)
        create_image(d, "bench-warm-x", extra)
        bench_write(d, "bench-warm-x", extra, io_size=4 * MiB, pattern_kind="seq")
        log(f"warm-up copy of {size // MiB} MiB done (untimed), DR held "
            f"{(held + extra) // MiB} MiB")
    finally:
        ds = {**d, "pool": SERVE_POOL}
        for site, name in ((p, img), (d, img), (d, ed), (d, "bench-warm-x"), (ds, img),
                           (p, rm)):
            try:
                remove_image(site, name)
            except ReplicationError as exc:
                log(f"cleanup: {exc}")


class _Bench:
    """The state of one benchmark run: the turn counter that rotates the
    first method over all turns, the settle policy, and rbd-mirror's setup
    when it is a baseline."""

    def __init__(self, status: dict[str, Any], cfg: BenchConfig, log: Any,
                 mirror: Mirror | None = None):
        self.status, self.cfg, self.log, self.mirror = status, cfg, log, mirror
        self.turn = 0
        self.extra = ["--jobs", str(cfg.jobs)]
        self.session: SyncSession | None = None   # the size's serve session

    def pair(self, img: str, ed: str, snap: str, prev: str | None,
             rm: str | None = None) -> Pair:
        """Replicate one snapshot by every method, once the clusters are
        idle; which goes first rotates from turn to turn so that none always
        meets another's leftovers or a cold start.  rbd-mirror (if `rm`, its
        primary image holding the same change set) copies at its own mirror
        snapshot, taken at its turn."""
        p = self.status["sites"]["primary"]
        data, zero = diff_bytes(p, img, snap, prev)
        settle_s, busy = 0.0, []
        if self.cfg.settle:
            settle_s, busy = settle(self.status, self.cfg.settle_timeout, self.log)
        else:
            busy = both_sites(self.status)
        methods = ["sync", "pipe"] + (["serve"] if self.session is not None else []) \
            + (["mirror"] if rm and self.mirror else [])
        k = self.turn % len(methods)
        order = methods[k:] + methods[:k]
        self.turn += 1
        load0 = load()
        run: SyncRun | None = None
        served: SyncRun | None = None
        pipe_s = sync_cpu = pipe_cpu = mirror_cpu = serve_cpu = 0.0
        mirror_s = mirror_ms = None
        for method in order:
            c0 = osd_cpu(self.status)
            if method == "sync":
                run = run_sync(self.status, img, snap, prev, self.extra, self.cfg.state_dir)
                sync_cpu = osd_cpu(self.status) - c0
            elif method == "pipe":
                pipe_s = _pipeline(self.status, img, ed, snap, prev)
                pipe_cpu = osd_cpu(self.status) - c0
            elif method == "serve":
                assert self.session is not None
                served = self.session.copy(img, snap, prev, dst_pool=SERVE_POOL)
                serve_cpu = osd_cpu(self.status) - c0
            else:
                assert self.mirror is not None and rm is not None
                if prev is None:
                    mirror_s = self.mirror.enable(rm)
                else:
                    mirror_ms, mirror_s = self.mirror.snapshot(rm)
                mirror_cpu = osd_cpu(self.status) - c0
        assert run is not None
        first = {"sync": "sync", "pipe": "pipeline", "serve": "serve",
                 "mirror": "rbd-mirror"}[order[0]]
        # cutpoint-sync and the pipeline are timed as whole processes
        # (start, connect, copy); rbd-mirror from its snapshot to arrival.
        return Pair(data + zero, int(run.done["bytes_shipped"]), run.seconds, pipe_s,
                    first, run.done.get("phase_ms", {}),
                    round(settle_s, 3), busy, round(sync_cpu, 3), round(pipe_cpu, 3),
                    round(load0, 2), mirror_s,
                    round(mirror_ms, 2) if mirror_ms is not None else None,
                    round(mirror_cpu, 3),
                    served.seconds if served is not None else None,
                    served.done.get("phase_ms", {}) if served is not None else {},
                    round(serve_cpu, 3))

    def quiesce(self) -> None:
        """Wait out the trimming of what was just removed before anything
        writes again.  Why: at 08:30 on 2026-11-22 the DR OSD died of a
        segfault in the snapshot trimmer (MemStore::OmapIteratorImpl::value
        under SnapMapper::get_next_objects_to_trim) while trimming a removed
        snapshot as the next round's copies wrote to the pool; trimming
        and writes no longer overlap."""
        if self.cfg.settle:
            settle(self.status, self.cfg.settle_timeout, self.log)

    def _replay(self, img: str, rm: str, snap: str, prev: str | None) -> None:
        """Give rbd-mirror's image the change set of img@snap (untimed)."""
        p = self.status["sites"]["primary"]
        exp = ["export-diff", "--no-progress"] + (["--from-snap", prev] if prev else [])
        data = subprocess.run(rbd_cmd(p, *exp, spec(p, img, snap), "-"), capture_output=True,
                              check=True, timeout=900).stdout
        rbd(p, "import-diff", "--no-progress", "-", spec(p, rm), input=data, timeout=900)

    def size(self, size_mib: int, rounds: list[Round]) -> None:
        """Every round of one image size; the serve session (if measured)
        is connected before them and closed after."""
        if self.cfg.serve:
            self.session = SyncSession(self.status, self.extra, self.cfg.state_dir)
            self.log(f"cutpoint-sync --serve session connected in "
                     f"{self.session.ready['connect_ms']:.1f} ms")
        try:
            self._size(size_mib, rounds)
        finally:
            if self.session is not None:
                self.session.close()
                self.session = None

    def _size(self, size_mib: int, rounds: list[Round]) -> None:
        p, d = self.status["sites"]["primary"], self.status["sites"]["dr"]
        cfg, log = self.cfg, self.log
        size = size_mib * MiB
        img, ed = f"bench-sync-{size_mib}", f"bench-ed-{size_mib}"
        rm = f"bench-rm-{size_mib}" if self.mirror else None
        ds = {**d, "pool": SERVE_POOL}
        for site, name in ((p, img), (d, img), (d, ed), (ds, img)):
            remove_image(site, name)
        create_image(p, img, size)
        log(f"size {size_mib} MiB: filling the image")
        bench_write(p, img, size, io_size=4 * MiB, pattern_kind="seq")
        snap_create(p, img, "b0")
        if rm:
            remove_image(p, rm)
            create_image(p, rm, size)
            self._replay(img, rm, "b0", None)
        full = Round(size_mib, "full")
        for k in range(cfg.repeats):
            # Both DR images exist, empty, before every full copy:
            # import-diff needs one, and cutpoint-sync (which would create
            # its own) then does the same work, timed the same way.  The
            # previous pair's copies are removed first; settle() waits for
            # their removal to finish in the OSD.  rbd-mirror's full copy
            # (enabling mirroring: it creates its DR image) is timed once.
            if k:
                for name in (img, ed):
                    remove_image(d, name)
                if cfg.serve:
                    remove_image(ds, img)
                self.quiesce()
            create_image(d, img, size)
            create_image(d, ed, size)
            if cfg.serve:
                create_image(ds, img, size)
            full.pairs.append(self.pair(img, ed, "b0", None, rm if k == 0 else None))
            log(fmt(full, full.pairs[-1]))
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
                if rm:
                    self._replay(img, rm, snap, prev)
                r.pairs.append(self.pair(img, ed, snap, prev, rm))
                log(fmt(r, r.pairs[-1]))
                # The old base is no longer needed by anyone: dropping it
                # bounds memstore's clones (4 GiB per OSD).  Its trimming is
                # waited out at once, before the next writes (see quiesce).
                # rbd-mirror prunes its own mirror snapshots.
                for site, name in ((p, img), (d, img), (d, ed)) + (((p, rm),) if rm else ()) \
                        + (((ds, img),) if cfg.serve else ()):
                    rbd(site, "snap", "rm", "--no-progress", spec(site, name, prev))
                self.quiesce()
                prev = snap
            rounds.append(r)
            mine.append(r)
        # Every copy must be right, or its speed means nothing.
        want = snap_sha256(p, img, prev)
        got = [snap_sha256(d, img, prev), snap_sha256(d, ed, prev)]
        if cfg.serve:
            got.append(snap_sha256(ds, img, prev))
        if rm and self.mirror:
            got.append(self.mirror.dr_sha256(rm))
        ok = all(g == want for g in got)
        if not ok:
            log(f"  NOT identical at DR: primary {want[:12]}, copies "
                f"{', '.join(g[:12] for g in got)}")
        for r in mine:
            r.identical = ok


def _serve_pool(d: dict[str, Any], create: bool) -> None:
    """The DR pool of the serve session's copies: created (if absent) or removed."""
    pools = json.loads(ceph(d, "osd", "pool", "ls", "--format", "json"))
    if create and SERVE_POOL not in pools:
        ceph(d, "osd", "pool", "create", SERVE_POOL, "8", "8")
        rbd(d, "pool", "init", SERVE_POOL)
    elif not create and SERVE_POOL in pools:
        ceph(d, "osd", "pool", "rm", SERVE_POOL, SERVE_POOL, "--yes-i-really-really-mean-it")


def _ceilings(status: dict[str, Any], cfg: BenchConfig, log: Any) -> dict[str, float]:
    """The DR OSD's write rate per write size of the run (MiB/s)."""
    d = status["sites"]["dr"]
    out: dict[str, float] = {}
    for kib in sorted({io for _, io in cfg.changes} | {4096}):
        out[str(kib)] = round(write_ceiling(d, kib), 1)
        log(f"DR OSD write ceiling, {kib} KiB writes: {out[str(kib)]} MiB/s")
    return out


def run_benchmark(status: dict[str, Any], cfg: BenchConfig,
                  log: Any = print) -> dict[str, Any]:
    """Measure every (size, change) round; returns the JSON document."""
    cfg.validate()
    p, d = status["sites"]["primary"], status["sites"]["dr"]
    os.makedirs(cfg.state_dir, exist_ok=True)
    rounds: list[Round] = []
    t0, load0 = time.monotonic(), load()
    mirror = Mirror(status, log) if cfg.mirror else None
    bench = _Bench(status, cfg, log, mirror)
    names: list[tuple[dict[str, Any], str]] = []
    ceiling: dict[str, float] = {}
    before = trim_sleep(status, {"primary": TRIM_SLEEP, "dr": TRIM_SLEEP})
    try:
        if cfg.serve:
            _serve_pool(d, create=True)
        if mirror is not None:
            mirror.start()
        _warm_up(status, cfg, log, mirror)
        bench.quiesce()
        if cfg.ceiling:
            ceiling = _ceilings(status, cfg, log)
            bench.quiesce()
        for size_mib in cfg.sizes_mib:
            names += [(p, f"bench-sync-{size_mib}"), (d, f"bench-sync-{size_mib}"),
                      (d, f"bench-ed-{size_mib}")]
            if mirror is not None:
                names.append((p, f"bench-rm-{size_mib}"))
            if cfg.serve:
                names.append(({**d, "pool": SERVE_POOL}, f"bench-sync-{size_mib}"))
            bench.size(size_mib, rounds)
    finally:
        # A size's images are removed only at the end, so their trimming
        # never overlaps a timed copy of this run.  With an OSD gone every
        # removal would hang; the lab is broken and `lab down` clears it.
        dead = dead_osds(status)
        if dead:
            log(f"cleanup skipped: the OSD of {', '.join(dead)} is gone")
        if mirror is not None and not dead:
            mirror.stop()
        for site, name in names if not dead else []:
            try:
                remove_image(site, name, timeout=120)
            except ReplicationError as exc:
                log(f"cleanup: {exc}")
        if cfg.serve and not dead:
            try:
                _serve_pool(d, create=False)
            except ReplicationError as exc:
                log(f"cleanup: {exc}")
        try:
            trim_sleep(status, before)
        except ReplicationError as exc:
            log(f"cleanup: osd_snap_trim_sleep not restored: {exc}")
    return {
        "benchmark": "replication",
        "config": asdict(cfg),
        "sync_binary": sync_binary(),
        "osd": "memstore (lab)",
        "ceiling_mbps": ceiling,
        "rounds": [r.row() for r in rounds],
        "summary": summarize(rounds),
        "wall_s": round(time.monotonic() - t0, 1),
        "load": [round(load0, 2), round(load(), 2)],
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
