"""What must hold before a failover touches production.

    checks = [dr_site_reachable(ceph, "dr", ["rbd"]),
              recovery_point_at_dr(ceph, "t1", "cp.web.t1", verified=True, images=[...]),
              dr_agents_ready(booter, boot_request),
              fencing_epoch_available(state, "dr", reserve)]
    failed = first_failure(checks)      # None: the primary may be stopped

A failover stops the primary VMs and takes a fencing epoch only once every
check here passed; one that fails leaves every primary VM running, and the
caller answers with the failed check's name and code.  None of them writes
anything, at either site: they connect, list and ask.

    dr_site_reachable        the DR Ceph cluster answers within its deadline
                             (site.py: connect, then each pool the members
                             use is opened)
    recovery_point_at_dr     the recovery point is verified (the database
                             says so) and every member's DR image holds its
                             snapshot (Ceph says so)
    dr_agents_ready          the booter knows how to start each VM: for the
                             product's booter, each VM's DR agent answers,
                             has vm.start and defines the VM (`preflight`,
                             which starts nothing)
    fencing_epoch_available  the group is not active at the target already
                             (a retry of a failover that failed after
                             taking its epoch reuses it) and the next epoch
                             can be written (the caller's `reserve` tries it
                             and rolls back)

A check whose input a failed check did not provide is `skip`, never a
false `pass`.  `unavailable` marks a failure of something that did not
answer (a 503 to the requester) rather than of a state (a 409).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from cutpoint.coordinator.dr.boot import Booter, BootRequest
from cutpoint.coordinator.dr.ceph_errors import (
    CephError,
    CephNotFound,
    CephTimeout,
    CephUnreachable,
)
from cutpoint.coordinator.dr.site import CephConnection

PASS, FAIL, SKIP = "pass", "fail", "skip"
ORDER = ("dr_site_reachable", "recovery_point_at_dr", "dr_agents_ready",
         "fencing_epoch_available")


@dataclass
class Check:
    name: str
    status: str  # pass | fail | skip
    code: str | None = None  # why it failed (stable: problem responses use it)
    message: str = ""
    ms: float = 0.0
    unavailable: bool = False  # failed because something did not answer
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == PASS

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class FencingState:
    """The group's newest fencing epoch: 0 and no site before any failover.
    `job_state`: the state of the failover job that took it (None: unknown);
    one that failed may be retried under the same epoch.  `job_id`: that job."""

    epoch: int
    active_site: str | None
    job_state: str | None = None
    job_id: str | None = None


def skipped(name: str, why: str) -> Check:
    return Check(name, SKIP, message=why)


def first_failure(checks: Sequence[Check]) -> Check | None:
    return next((c for c in checks if c.status == FAIL), None)


def _timed(name: str, fn: Callable[[], Check]) -> Check:
    t0 = time.monotonic()
    c = fn()
    c.name, c.ms = name, round((time.monotonic() - t0) * 1000, 1)
    return c


def _ceph_failure(exc: CephError, what: str) -> Check:
    return Check("", FAIL, exc.code, f"{what}: {exc}",
                 unavailable=isinstance(exc, (CephUnreachable, CephTimeout)),
                 detail={"error": exc.as_dict()})


def dr_site_reachable(ceph: CephConnection | None, site: str, pools: Sequence[str],
                      why_none: str = "") -> Check:
    """Connect to the DR cluster (bounded by the site's connect timeout) and
    open each logical pool.  `ceph` None: the site has no Ceph access
    configured (`why_none` says why, naming the site)."""
    def run() -> Check:
        if ceph is None:
            return Check("", FAIL, "no_ceph_site",
                         why_none or f"site {site!r} has no Ceph access configured")
        try:
            ceph.connect()
            counts = {p: len(ceph.list_images(p)) for p in sorted(set(pools))}
        except CephError as exc:
            return _ceph_failure(exc, f"the DR site {site!r} is not reachable")
        return Check("", PASS, message=f"site {site!r} answered; pools {sorted(counts)}",
                     detail={"images_per_pool": counts})

    return _timed("dr_site_reachable", run)


def recovery_point_at_dr(ceph: CephConnection, txn: str, snap_name: str, *, verified: bool,
                         images: Sequence[tuple[str, str]]) -> Check:
    """`verified`: the database marks the group snapshot a DR recovery point.
    images: (logical pool, image) of every member; each must hold `snap_name`."""
    def run() -> Check:
        if not verified:
            return Check("", FAIL, "not_verified", f"group snapshot {txn} is not a verified "
                         "DR recovery point (its replication did not complete)")
        missing: list[str] = []
        for pool, image in images:
            try:
                names = {s.name for s in ceph.snapshots(pool, image)}
            except CephNotFound:
                missing.append(f"{pool}/{image} (no such image at DR)")
                continue
            except CephError as exc:
                return _ceph_failure(exc, f"listing the snapshots of {pool}/{image} at DR")
            if snap_name not in names:
                missing.append(f"{pool}/{image}@{snap_name}")
        if missing:
            return Check("", FAIL, "dr_snapshot_missing", f"the recovery point {txn} is "
                         f"verified in the database but missing at DR: {', '.join(missing)}",
                         detail={"missing": missing})
        return Check("", PASS, message=f"{snap_name} is on all {len(images)} DR image(s)",
                     detail={"snapshot": snap_name, "images": len(images)})

    return _timed("recovery_point_at_dr", run)


# Booter's `Unbootable.why` -> the check's code.
_AGENT_CODES = {"no_agent": "no_dr_agent", "agent_unreachable": "dr_agent_unreachable",
                "unknown_vm": "dr_agent_unknown_vm", "cannot_start": "dr_vm_cannot_start"}


def dr_agents_ready(booter: Booter, req: BootRequest) -> Check:
    """The booter's own check of every VM of `req`, without starting one."""
    def run() -> Check:
        try:
            problems = booter.preflight(req)
        except Exception as exc:  # noqa: BLE001  a booter that cannot even ask fails the check
            return Check("", FAIL, "dr_vm_cannot_start", f"the booter's check failed: "
                         f"{type(exc).__name__}: {exc}")
        if problems:
            first = problems[0]
            return Check("", FAIL, _AGENT_CODES.get(first.why, "dr_vm_cannot_start"),
                         "the DR site cannot start " + "; ".join(str(p) for p in problems),
                         unavailable=first.why == "agent_unreachable",
                         detail={"vms": {p.vm: {"why": p.why, "message": p.message}
                                         for p in problems}})
        return Check("", PASS, message=f"the DR agents know all {len(req.vms)} VM(s)",
                     detail={"vms": sorted({str(a) for a in req.agents.values()})})

    return _timed("dr_agents_ready", run)


def fencing_epoch_available(state: FencingState, target: str,
                            reserve: Callable[[int], None], job_id: str | None = None) -> Check:
    """The epoch this failover will run under: the next one, or the current
    one for a retry of a failover that failed after taking it, or for the
    failover job `job_id` itself run again (its worker died after it took
    the epoch).  `reserve(n)` tries to write epoch n and undoes it; any
    exception fails the check."""
    def run() -> Check:
        if (state.active_site == target and job_id is not None and state.job_id == job_id
                and state.job_state in ("queued", "running")):
            return Check("", PASS, message=f"resumed: fencing epoch {state.epoch} was taken by "
                         "an earlier attempt of this job and is reused",
                         detail={"epoch": state.epoch, "reuse": True})
        if state.active_site == target and state.job_state in ("queued", "running"):
            return Check("", FAIL, "failover_in_progress", f"fencing epoch {state.epoch} "
                         f"(active site {target!r}) belongs to a failover that is still "
                         "running", detail={"epoch": state.epoch})
        if state.active_site == target and state.job_state != "failed":
            return Check("", FAIL, "already_failed_over", f"the group is active at {target!r} "
                         f"since fencing epoch {state.epoch}: there is nothing to fail over "
                         "(the way back is a failback)", detail={"epoch": state.epoch})
        if state.active_site == target:
            return Check("", PASS, message=f"retry: fencing epoch {state.epoch} (taken by "
                         "the failover that failed) is reused",
                         detail={"epoch": state.epoch, "reuse": True})
        n = state.epoch + 1
        try:
            reserve(n)
        except Exception as exc:  # noqa: BLE001  whatever the database said, the epoch is not ours
            return Check("", FAIL, "epoch_unavailable", f"fencing epoch {n} cannot be "
                         f"recorded: {type(exc).__name__}: {str(exc)[:300]}",
                         detail={"epoch": n})
        return Check("", PASS, message=f"fencing epoch {n} can be taken",
                     detail={"epoch": n, "reuse": False})

    return _timed("fencing_epoch_available", run)
