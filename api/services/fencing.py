"""Fencing: which site of a group may write its disks, and making it hold.

    state(s, group_id)                         -> FencingState(epoch, active_site, job_state)
    reserve(s, group_id, n, target, fenced)    try epoch n in a savepoint, undo it
    take(s, group_id, n, target, fenced, job)  record epoch n (or adopt it, on a retry)
    mark_images(ceph, images, n)               cutpoint.fencing_epoch = n on each DR image
    stop_primaries(sf, settings, vms_by_host)  vm.stop through the primary agents
    replication_refusal(s, snap, target)       why a copy into `target` must not run

A failover takes fencing epoch n = newest + 1 (`fencing_epochs`: the target
is the active site from then on, the old primary the fenced one) and marks
every member image at the target with it.  From then on nothing from the
old primary may write those images: the replicate worker refuses (the group
is active at the copy's target, or the snapshot predates the epoch), and
cutpoint-sync itself refuses an image whose epoch is not older than the
copy's (`--epoch`, storage/sync/sync_fence.h) — the last line, for a copy
the worker did not stop (an old process, a stale job).

The primary agents are asked in parallel, each bounded by a short connect
deadline (an unreachable host costs that, not a TCP timeout) and the agent
call timeout; a host that does not answer is recorded, not waited for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from cutpoint.api.models import FencingEpoch, GroupSnapshot, Host, Job, as_utc
from cutpoint.coordinator.dr.preconditions import FencingState
from sqlalchemy import func, select
from sqlalchemy.orm import Session

IMAGE_KEY = "cutpoint.fencing_epoch"  # storage/sync/sync_fence.h SYNC_FENCE_KEY
# How long a fence waits for a primary agent to accept a connection.
CONNECT_TIMEOUT_S = 5.0


def newest(s: Session, group_id: int) -> FencingEpoch | None:
    return s.scalar(select(FencingEpoch).where(FencingEpoch.group_id == group_id)
                    .order_by(FencingEpoch.epoch.desc()).limit(1))


def state(s: Session, group_id: int) -> FencingState:
    fe = newest(s, group_id)
    if fe is None:
        return FencingState(0, None)
    job = s.get(Job, fe.job_id) if fe.job_id else None
    return FencingState(fe.epoch, fe.active_site,
                        job_state=job.state.value if job is not None else None,
                        job_id=fe.job_id)


def reserve(s: Session, group_id: int, n: int, target: str, fenced: str) -> None:
    """Write epoch n inside a savepoint and roll it back: the database
    accepts it now (unique per group, writable).  Raises what it raised."""
    sp = s.begin_nested()
    try:
        s.add(FencingEpoch(group_id=group_id, epoch=n, active_site=target,
                           fenced_site=fenced, job_id=None))
        s.flush()
    finally:
        sp.rollback()


def take(s: Session, group_id: int, n: int, target: str, fenced: str,
         job_id: str) -> dict[str, Any]:
    """Record epoch n (target active, `fenced` fenced) for `job_id` and commit.
    An epoch n that exists already for the target is the one a failed
    failover took: this retry adopts it (its job becomes this one)."""
    fe = s.scalar(select(FencingEpoch).where(FencingEpoch.group_id == group_id,
                                             FencingEpoch.epoch == n))
    reused = fe is not None
    if fe is None:
        s.add(FencingEpoch(group_id=group_id, epoch=n, active_site=target, fenced_site=fenced,
                           job_id=job_id))
    elif fe.active_site != target:
        raise RuntimeError(f"fencing epoch {n} of group {group_id} names site "
                           f"{fe.active_site!r}, not {target!r}")
    else:
        fe.job_id = job_id
    s.commit()
    return {"epoch": n, "active_site": target, "fenced_site": fenced, "reused": reused}


def mark_images(ceph: Any, images: Sequence[tuple[str, str]], n: int) -> list[str]:
    """Set the fencing epoch on every (pool, image) at the target (idempotent)."""
    done = []
    for pool, image in images:
        ceph.metadata_set(pool, image, IMAGE_KEY, str(n))
        done.append(f"{pool}/{image}")
    return done


def stop_primaries(sf: Any, settings: Any, vms_by_host: dict[str, list[str]],
                   connect_timeout_s: float = CONNECT_TIMEOUT_S) -> dict[str, Any]:
    """`vm.stop` every VM through its host's agent, all hosts at once.  The
    hosts are read first and the session closed: no transaction waits on
    an agent.

    -> {stopped: [vm], unreachable: [{host, error}], site: the hosts' site}"""
    from cutpoint.api.services import agents

    hosts: list[tuple[Host, list[str]]] = []
    unreachable: list[dict[str, str]] = []
    site = None
    with sf() as s:
        for name, vms in sorted(vms_by_host.items()):
            host = s.scalar(select(Host).where(Host.name == name))
            if host is None:
                unreachable.append({"host": name, "error": "unknown host"})
                continue
            site = site or host.site.name
            hosts.append((host, sorted(vms)))
    # Closed, not rolled back: the hosts keep their loaded columns, detached.

    async def all_() -> list[Any]:
        return await asyncio.gather(
            *(agents.call_async(h, settings, [("vm.stop", {"vm": v}) for v in vms],
                           connect_timeout_s=connect_timeout_s) for h, vms in hosts),
            return_exceptions=True)

    stopped: list[str] = []
    for (host, vms), r in zip(hosts, asyncio.run(all_()) if hosts else [], strict=True):
        if isinstance(r, BaseException):
            unreachable.append({"host": host.name, "error": str(r)[:400]})
        else:
            stopped += vms
    return {"stopped": stopped, "unreachable": unreachable, "site": site}


def replication_refusal(s: Session, snap: GroupSnapshot, target: str,
                        expected_epoch: int | None = None) -> tuple[str, str] | None:
    """(code, message) when copying `snap` into `target` could overwrite a
    live copy; None when it may run.

    fenced        the group is active at `target` since its newest epoch: the
                  images there are the live copy
    epoch_moved   the snapshot was cut before the newest epoch (it is the old
                  primary's), or the job was queued under another epoch"""
    fe = newest(s, snap.group_id)
    if fe is None:
        return None
    if fe.active_site == target:
        return ("fenced", (f"group snapshot {snap.txn}: the group is active at {target!r} "
                           f"since fencing epoch {fe.epoch} (failover job {fe.job_id}); "
                           f"replication into {target!r} would overwrite the live copy, so it "
                           "is refused"))
    cut = snap.cut_at or snap.requested_at
    at = fe.at
    if cut is not None and at is not None and as_utc(cut) < as_utc(at):
        return ("epoch_moved", (f"group snapshot {snap.txn} was cut before fencing epoch "
                                f"{fe.epoch} ({at.isoformat()}): it belongs to the site that "
                                "epoch fenced, and is never replicated"))
    if expected_epoch is not None and expected_epoch != fe.epoch:
        return ("epoch_moved", (f"the job was queued under fencing epoch {expected_epoch} "
                                f"and the group is at epoch {fe.epoch} now: refused"))
    return None



def current_epoch(s: Session, group_id: int) -> int:
    return int(s.scalar(select(func.max(FencingEpoch.epoch)).where(
        FencingEpoch.group_id == group_id)) or 0)
