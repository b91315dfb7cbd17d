"""The site check: can the control plane do its work at this Ceph site?

    result = check_site(site, replication_target=True)
    result.ok, result.failed          # the first failing step, or None
    result.as_dict()                  # every step: name, pool, status, why

Run when a site is registered and on demand.  It does what the control
plane will do, on a scratch image it creates and removes, so that missing
caps show now and not in the middle of a failover:

    connect                 the mons answer and accept the client's key
    per mapped pool (logical name in `pool`):
      pool_exists           the pool is there
      create_image          a scratch image `cutpoint-check-<random>`
      create_snapshot       a snapshot of it (a self-managed snapshot id from the mon)
      snapshot_latency      LATENCY_SAMPLES more snapshots, one after another, each
                            timed, then removed: the site's snapshot latency (p50,
                            p99) and what a VM's pause would be on the agents'
                            in_pause path (agent-protocol §5.1), which takes its
                            disks' snapshots inside the pause
      write                 replication targets only: data written after the snapshot
      diff                  the changes since the snapshot: the write, or nothing
      remove_snapshot       the snapshot again
      remove_image          the scratch image again

The latency is in `result.snapshot_latency` (one entry per pool) and in
`as_dict()["snapshot_latency"]`.  The redirect path (the agents' default)
does not wait for these snapshots: its pause holds a switch of the disks
onto overlays; the in_pause path is what VMs that cannot take it use
(libvirt domains, qcow2 disks, `pause_path = in_pause`).

A step that fails stops the steps after it for that pool, except the two
removals, which run whenever there is something to remove; a removal that
fails names what it left behind.  Every step has status `pass`, `fail` or
`skip`, and a failed one the error's `code` and errno.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from cutpoint.coordinator.dr.ceph_errors import CephError
from cutpoint.coordinator.dr.site import CephConnection, CephSite

SCRATCH_PREFIX = "cutpoint-check-"
# Snapshots timed by snapshot_latency: enough for a median, few enough that
# a mon at Ceph's default paxos interval (about 1 s each) keeps the check
# under ten seconds.  With n < 100, p99 is the largest (nearest rank).
LATENCY_SAMPLES = 5
# What the in_pause path adds to the snapshots in a VM's pause: stop, the
# coordinator's round (PREPARED, COMMITTING written, COMMIT) and cont.
# docs/benchmarks.md, the pause bench on the lab: overhead p50 4.6-5.4 ms,
# p99 9.4-14.3 ms at 4 VMs x 3 disks.
IN_PAUSE_OVERHEAD_MS = (5.0, 14.0)
SCRATCH_SIZE = 4 << 20
PATTERN = b"cutpoint site check\n" * 205  # 4100 bytes: more than one 4 KiB block
WRITE_AT = 1 << 20


@dataclass
class CheckStep:
    name: str
    status: str  # pass | fail | skip
    detail: str = ""
    pool: str | None = None  # logical pool, for per-pool steps
    code: str | None = None  # CephError.code of a failure
    errno: int | None = None
    ms: float = 0.0


def percentile(samples: list[float], q: float) -> float:
    """Nearest-rank percentile q (0-100) of samples (not empty)."""
    xs = sorted(samples)
    k = max(0, min(len(xs) - 1, -(-len(xs) * q // 100) - 1))
    return xs[int(k)]


@dataclass
class SnapshotLatency:
    """One pool's snapshot latency, and the in_pause pause it implies."""

    pool: str
    samples_ms: list[float]

    def as_dict(self) -> dict[str, Any]:
        p50 = percentile(self.samples_ms, 50)
        p99 = percentile(self.samples_ms, 99)
        # A VM's disks are snapshotted in parallel: its pause waits for about
        # one snapshot, plus the coordination.
        lo, hi = IN_PAUSE_OVERHEAD_MS
        return {"pool": self.pool, "samples_ms": self.samples_ms,
                "p50_ms": p50, "p99_ms": p99,
                "in_pause_pause_p50_ms": round(p50 + lo, 1),
                "in_pause_pause_p99_ms": round(p99 + hi, 1)}

    def summary(self) -> str:
        d = self.as_dict()
        return (f"snapshot p50 {d['p50_ms']:.1f} ms, p99 {d['p99_ms']:.1f} ms "
                f"(n={len(self.samples_ms)}): the in_pause path would pause each VM "
                f"about {d['in_pause_pause_p50_ms']:.0f} ms (p50) / "
                f"{d['in_pause_pause_p99_ms']:.0f} ms (p99); the redirect path does not "
                f"wait for snapshots")


@dataclass
class SiteCheck:
    site: str
    replication_target: bool
    steps: list[CheckStep] = field(default_factory=list)
    snapshot_latency: list[SnapshotLatency] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(s.status != "fail" for s in self.steps)

    @property
    def failed(self) -> CheckStep | None:
        return next((s for s in self.steps if s.status == "fail"), None)

    def as_dict(self) -> dict[str, Any]:
        f = self.failed
        return {"site": self.site, "ok": self.ok, "replication_target": self.replication_target,
                "failed_check": f.name if f else None, "failed_pool": f.pool if f else None,
                "steps": [asdict(s) for s in self.steps],
                "snapshot_latency": [x.as_dict() for x in self.snapshot_latency]}


class _Steps:
    """Runs the steps of one check, recording each."""

    def __init__(self, out: SiteCheck, clock: Callable[[], float]) -> None:
        self.out = out
        self.clock = clock

    def run(self, name: str, fn: Callable[[], str], pool: str | None = None) -> bool:
        t0 = self.clock()
        try:
            detail = fn()
        except CephError as exc:
            self.out.steps.append(CheckStep(name, "fail", str(exc), pool, exc.code, exc.errno,
                                            self._ms(t0)))
            return False
        except _Mismatch as exc:
            self.out.steps.append(CheckStep(name, "fail", str(exc), pool, "check_mismatch",
                                            None, self._ms(t0)))
            return False
        self.out.steps.append(CheckStep(name, "pass", detail, pool, ms=self._ms(t0)))
        return True

    def skip(self, names: list[str], why: str, pool: str | None = None) -> None:
        self.out.steps += [CheckStep(n, "skip", why, pool) for n in names]

    def _ms(self, t0: float) -> float:
        return round((self.clock() - t0) * 1000, 1)


class _Mismatch(Exception):
    """A call succeeded but its answer was not what the step expects."""


POOL_STEPS = ["pool_exists", "create_image", "create_snapshot", "snapshot_latency", "write",
              "diff", "remove_snapshot", "remove_image"]


def check_site(site: CephSite, *, replication_target: bool = False,
               ceph: CephConnection | None = None,
               clock: Callable[[], float] = time.monotonic) -> SiteCheck:
    """Every check of `site`; never raises for a Ceph failure (it is a failed step).
    `ceph` and `clock` are for replaying recorded replies in tests."""
    out = SiteCheck(site.name, replication_target)
    steps = _Steps(out, clock)
    ceph = ceph if ceph is not None else CephConnection(site)

    def connect() -> str:
        ceph.connect()
        return (f"client.{site.client_id} connected to "
                f"{','.join(site.mon_host) or site.ceph_conf}")

    if not steps.run("connect", connect):
        for logical in site.pools:
            steps.skip(_pool_steps(replication_target), "not run: connect failed", logical)
        return out
    try:
        for logical in site.pools:
            _check_pool(ceph, steps, logical, replication_target)
    finally:
        ceph.close()
    return out


def _pool_steps(target: bool) -> list[str]:
    return [s for s in POOL_STEPS if target or s != "write"]


def _check_pool(ceph: CephConnection, steps: _Steps, logical: str, target: bool) -> None:
    real = ceph.site.pool(logical)
    image = f"{SCRATCH_PREFIX}{uuid.uuid4().hex[:10]}"
    snap = "cutpoint-check"
    todo = _pool_steps(target)
    done: list[str] = []
    first = len(steps.out.steps)

    def step(name: str, fn: Callable[[], str]) -> bool:
        ok = steps.run(name, fn, logical)
        done.append(name)
        return ok

    def pool_exists() -> str:
        n = len(ceph.list_images(logical))
        return f"pool {real}: {n} images"

    def create_image() -> str:
        ceph.create_image(logical, image, SCRATCH_SIZE)
        return f"{real}/{image}, {SCRATCH_SIZE >> 20} MiB"

    def create_snapshot() -> str:
        s = ceph.create_snapshot(logical, image, snap)
        return f"{real}/{image}@{snap} (id {s.id})"

    def snapshot_latency() -> str:
        samples: list[float] = []
        made: list[str] = []
        try:
            for i in range(LATENCY_SAMPLES):
                name = f"cutpoint-check-lat{i}"
                t0 = steps.clock()
                ceph.create_snapshot(logical, image, name)
                samples.append(round((steps.clock() - t0) * 1000, 1))
                made.append(name)
        finally:
            left = []
            for name in made:
                try:
                    ceph.remove_snapshot(logical, image, name)
                except CephError:
                    left.append(name)
            if left:        # the image cannot go with them: say so
                raise _Mismatch(f"snapshots left behind: {', '.join(left)} "
                                f"of {real}/{image}")
        lat = SnapshotLatency(logical, samples)
        steps.out.snapshot_latency.append(lat)
        return lat.summary()

    def write() -> str:
        ceph.write(logical, image, WRITE_AT, PATTERN)
        return f"{len(PATTERN)} bytes at {WRITE_AT}"

    def diff() -> str:
        got = [e for e in ceph.diff(logical, image, snap) if e.exists]
        span = sum(e.length for e in got)
        if target and not any(e.offset <= WRITE_AT < e.offset + e.length for e in got):
            raise _Mismatch(f"the diff since {snap} misses the write at {WRITE_AT}: {got}")
        if not target and got:
            raise _Mismatch(f"the diff since {snap} of an unwritten image is not empty: {got}")
        return f"{len(got)} extents, {span} bytes since {snap}"

    ok = True
    created_image = created_snap = False
    for name, fn in (("pool_exists", pool_exists), ("create_image", create_image),
                     ("create_snapshot", create_snapshot),
                     ("snapshot_latency", snapshot_latency), ("write", write),
                     ("diff", diff)):
        if name not in todo:
            continue
        ok = step(name, fn)
        if not ok:
            break
        created_image |= name == "create_image"
        created_snap |= name == "create_snapshot"
    if created_snap:
        def remove_snapshot() -> str:
            ceph.remove_snapshot(logical, image, snap)
            return f"{real}/{image}@{snap}"

        if not step("remove_snapshot", remove_snapshot):
            out = steps.out.steps[-1]
            out.detail += f"; left behind: {real}/{image}@{snap} and the image"
            created_image = False  # an image with a snapshot cannot be removed
    if created_image:
        def remove_image() -> str:
            ceph.remove_image(logical, image)
            return f"{real}/{image}"

        if not step("remove_image", remove_image):
            steps.out.steps[-1].detail += f"; left behind: {real}/{image}"
    why = "not run: an earlier step failed" if not ok else "not run: nothing to remove"
    steps.skip([n for n in todo if n not in done], why, logical)
    steps.out.steps[first:] = sorted(steps.out.steps[first:], key=lambda s: todo.index(s.name))
