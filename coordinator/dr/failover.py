"""Failover to the DR site and failback.

    failover(booter, request, recovery_point, fence) -> FailoverResult
    failback_replicate(dr_site, primary_site, images, snap, ...) -> GroupReplication

Failover, after the caller has (in planned mode) taken and replicated a
final group snapshot:

    fence     `fence()` stops the primary VMs if reachable (agents'
              `vm.stop`, `fence_via_agents`) and records a fencing epoch;
              an unreachable primary is recorded, not waited for
              (unplanned mode)
    rollback  every DR image whose head differs from the recovery point
              back to it (librbd through site.py); an unchanged image is left
              alone, because a rollback rewrites every object and would make
              failback ship the whole disk
    boot      the booter (boot.py) starts every VM of the request at DR,
              in parallel (the product's booter: `vm.start{spec: {vm}}` on
              the DR agent that defines it; its `vm_start` events carry the
              agent's `start_ms`); a VM already running there is left as it
              is (`already_running`), never started twice
    ready     the booter says every VM is ready: RTO = request to here

A boot that fails stops what it did start (the booter's `stop`) and raises
FailoverError; the primary stays fenced.

Failback replicates DR -> primary from the newest snapshot both sites hold
(`newest_common_snapshot`): cutpoint-sync ships the extents changed at DR
since then plus whatever the primary wrote after it (drift, repaired), never
a full copy when a common snapshot exists.  `rbd diff` counts an object born
after that snapshot from its start to its end; on a sparse guest disk that
is most of the disk, so the engine zeroes (does not ship) the 4 KiB blocks
of the diff that read as zeroes (docs/replication.md, "Holes in new
objects").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from cutpoint.coordinator.dr.boot import BootDisk, Booter, BootError, BootRequest, Guest
from cutpoint.coordinator.dr.ceph_errors import CephError
from cutpoint.coordinator.dr.replicate import (
    GroupReplication,
    MemberCopy,
    newest_common_snapshot,
    replicate_group,
)
from cutpoint.coordinator.dr.site import CephConnection, CephSite


class FailoverError(RuntimeError):
    pass


def rollback(site: CephSite, disks: list[BootDisk], snap: str) -> list[str]:
    """Roll every image back to `snap`; returns the images actually rolled back.

    An image whose head has not changed since `snap` (the usual case: the
    replication engine writes the head, then creates the snapshot) is left
    alone.  A rollback rewrites every object, so a needless one would make
    the next diff from `snap` (failback's base) cover the whole disk instead
    of what the DR guests wrote.  Ceph failures raise `CephError`.
    """
    with CephConnection(site) as ceph:
        def one(d: BootDisk) -> str | None:
            if not ceph.changed_since(d.pool, d.image, snap):
                return None
            ceph.rollback(d.pool, d.image, snap)
            return d.image

        with ThreadPoolExecutor(max_workers=4) as ex:
            return [i for i in ex.map(one, disks) if i is not None]


@dataclass
class FailoverResult:
    recovery_point: str
    rto_s: float
    timeline: list[dict[str, Any]]
    guests: list[Guest]
    fence: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {"recovery_point": self.recovery_point, "rto_s": round(self.rto_s, 3),
                "timeline": self.timeline, "fence": self.fence,
                "guests": [g.as_dict() for g in self.guests]}


def failover(booter: Booter, req: BootRequest, recovery_point: str,
             fence: Callable[[], dict[str, Any]], t_request: float | None = None,
             boot_timeout_s: float = 240,
             on_event: Callable[[str, dict[str, Any]], None] | None = None,
             plan: Any = None) -> FailoverResult:
    """Fence, roll the DR images back to `recovery_point`, boot at DR; RTO from t_request.

    `on_event(step, event)` sees each timeline event as it happens (the
    caller records job events with it).  `plan` (plan.RecoveryPlan): boot
    the VMs in its order, with its readiness rules and hooks; None: all at
    once, ready when running."""
    t0 = t_request if t_request is not None else time.monotonic()
    timeline: list[dict[str, Any]] = []

    def ev(step: str, detail: dict[str, Any]) -> None:
        e = {"t_s": round(time.monotonic() - t0, 3), "step": step, **detail}
        timeline.append(e)
        if on_event is not None:
            on_event(step, e)

    if req.site is None:
        raise FailoverError("the boot request names no Ceph site for the DR images")
    fenced = fence()
    ev("fence", fenced)
    disks = [d for v in req.vms for d in v.disks]
    images = [d.image for d in disks]
    try:
        rolled = rollback(req.site, disks, recovery_point)
    except CephError as exc:
        raise FailoverError(f"rollback to {recovery_point} at DR failed: {exc}") from exc
    ev("rollback", {"images": images, "to": recovery_point, "rolled_back": rolled})
    guests: list[Guest] = []

    def plan_ev(step: str, detail: dict[str, Any]) -> None:
        if step == "boot":  # a boot group's VMs started: named, not objects
            detail = {k: v for k, v in detail.items() if k != "started"} | {
                "vms": [g.vm for g in detail.get("started", [])]}
        ev(step, detail)

    try:
        if plan is not None and plan.boot_groups:
            from cutpoint.coordinator.dr.plan import boot_in_order

            guests = boot_in_order(booter, req, plan, boot_timeout_s, plan_ev)
        else:
            guests = booter.start(req, ev)
            booter.wait_ready(req, guests, boot_timeout_s, ev)
    except BootError as exc:
        booter.stop(req, guests or exc.guests)
        ev("boot_failed", {"error": str(exc)[:1000]})
        raise FailoverError(f"boot at DR failed: {exc}") from exc
    except BaseException:
        booter.stop(req, guests)
        raise
    rto = time.monotonic() - t0
    ev("running", {"vms": [g.vm for g in guests]})
    return FailoverResult(recovery_point, rto, timeline, guests, fenced)


def failback_replicate(dr_site: CephSite, primary_site: CephSite,
                       images: list[str], snap: str, *, state_dir: str,
                       prefix: str = "cp.", pool: str = "rbd") -> GroupReplication:
    """Ship DR -> primary the deltas since the newest common snapshot of each image.

    `snap` must exist at DR (taken after the DR VMs stopped).  Refuses when
    an image has no common snapshot (that would be a full copy: the operator
    asks for it explicitly with a full resync, not here)."""
    members = []
    for image in images:
        try:
            base = newest_common_snapshot(dr_site, primary_site, image, prefix, pool)
        except CephError as exc:
            raise FailoverError(f"{image}: listing its snapshots: {exc}") from exc
        if base is None:
            raise FailoverError(f"{image}: no snapshot common to DR and primary; failback "
                                "would be a full copy")
        members.append(MemberCopy(image, snap, base, pool=pool))
    return replicate_group(dr_site, primary_site, members, jobs=2, state_dir=state_dir,
                           verify_full=True)


def fence_via_agents(targets: list[tuple[str, int, list[str]]], tls: tuple[str, str, str],
                     timeout_s: float = 15) -> dict[str, Any]:
    """`vm.stop` every VM through its agent; unreachable agents are recorded, not waited for.

    targets: [(address, port, [vm names])]; tls: (ca, cert, key)."""
    import asyncio

    from cutpoint.agentclient.client import AgentClient
    from cutpoint.agentclient.tls import client_context

    ctx = client_context(*tls)

    async def one(addr: str, port: int, vms: list[str]) -> tuple[list[str], dict[str, str] | None]:
        done: list[str] = []
        try:
            async with AgentClient(addr, port, ssl_context=ctx, connect_timeout=5,
                                   call_timeout=timeout_s) as c:
                for vm in vms:
                    await c.call("vm.stop", {"vm": vm})
                    done.append(vm)
            return done, None
        except Exception as exc:  # noqa: BLE001  fencing goes on without this host
            return done, {"agent": f"{addr}:{port}", "error": f"{type(exc).__name__}: {exc}"}

    async def all_() -> list[tuple[list[str], dict[str, str] | None]]:
        return await asyncio.gather(*(one(a, p, v) for a, p, v in targets))

    stopped, unreachable = [], []
    for done, err in asyncio.run(all_()):
        stopped += done
        if err:
            unreachable.append(err)
    return {"stopped": stopped, "unreachable": unreachable}
