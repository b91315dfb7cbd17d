"""Failover through the control plane: `POST /v1/groups/{id}/failover`.

    {recovery_point: <id|txn|"latest">, mode: planned|unplanned, workload?: str}

planned:   take a final group snapshot (the normal capture path) and
           replicate it; it becomes the recovery point, so nothing written
           before the request is lost.
both:      fence the primary (agents' `vm.stop` for every member VM; an
           unreachable host is recorded, not waited for), record fencing
           epoch n+1 (`fencing_epochs`: DR is the only writer from then on),
           disable the group's schedule at the fenced site, roll the DR
           images back to the recovery point and boot the VMs on the DR host
           (`cutpoint.coordinator.failover`).  The job result holds the RTO
           (request to every guest ready), the timeline and the epoch.

The DR guests are started with the lab's QEMU launcher, not `vm.start`:
the agent implements `vm.start` for its libvirt driver only and the lab's
guests are plain QEMU.  `workload` (default `none`) is what the DR guests
run after boot.
"""

from __future__ import annotations

import time
from typing import Any

from cutpoint.api.models import (
    FencingEpoch,
    Group,
    GroupSnapshot,
    Host,
    Job,
    JobState,
    utcnow,
)
from sqlalchemy import func, select
from sqlalchemy.orm import Session


class FailoverFailed(Exception):
    def __init__(self, code: str, message: str) -> None:
        self.code = code
        super().__init__(message)


def request(s: Session, g: Group, ref: str | None, mode: str, workload: str,
            actor: str | None) -> Job:
    from cutpoint.api.errors import ApiError
    from cutpoint.api.services import drills, jobs

    if mode not in ("planned", "unplanned"):
        raise ApiError(f"mode must be planned or unplanned, not {mode!r}", code="bad_mode")
    snap = None
    if mode == "unplanned" or ref not in (None, "", "latest"):
        snap = drills.recovery_point(s, g, ref)
    return jobs.create(s, "failover", actor=actor, group_id=g.id,
                       snapshot_id=snap.id if snap else None,
                       params={"group_id": g.id, "mode": mode, "workload": workload,
                               "recovery_point": snap.txn if snap else None})


def _final_snapshot(sf: Any, settings: Any, g_id: int, actor: str | None) -> int:
    from cutpoint.api.services import capture, replication, snapshots

    with sf() as s:
        g = s.get(Group, g_id)
        assert g is not None
        sub = snapshots.request(s, g, trigger="failover", actor=actor)
        sub_id, snap_id = sub.id, sub.snapshot_id
    assert snap_id is not None
    summary = capture.run(sf, settings, snap_id)
    with sf() as s:
        sub = s.get(Job, sub_id)
        if sub is not None:
            sub.state = JobState.succeeded if summary["state"] == "committed" \
                else JobState.failed
            sub.result, sub.progress, sub.finished_at = summary, 1.0, utcnow()
            s.commit()
    if summary["state"] != "committed":
        raise FailoverFailed("final_snapshot_failed",
                             f"the final group snapshot did not commit: {summary}")
    replication.run(sf, settings, snap_id)
    return int(snap_id)


def fence(sf: Any, settings: Any, g_id: int, snap_id: int, job_id: str,
          target: str) -> dict[str, Any]:
    from cutpoint.api.services import agents

    stopped, unreachable = [], []
    with sf() as s:
        snap = s.get(GroupSnapshot, snap_id)
        assert snap is not None
        vms_by_host: dict[str, set[str]] = {}
        for m in snap.members:
            vms_by_host.setdefault(m.host, set()).add(m.vm)
        source = None
        for host_name, vms in sorted(vms_by_host.items()):
            host = s.scalar(select(Host).where(Host.name == host_name))
            if host is None:
                unreachable.append({"host": host_name, "error": "unknown host"})
                continue
            source = host.site.name
            try:
                agents.call(host, settings, *[("vm.stop", {"vm": v}) for v in sorted(vms)])
                stopped += sorted(vms)
            except agents.AgentCallError as exc:
                unreachable.append({"host": host_name, "error": str(exc)[:400]})
        epoch = (s.scalar(select(func.max(FencingEpoch.epoch)).where(
            FencingEpoch.group_id == g_id)) or 0) + 1
        s.add(FencingEpoch(group_id=g_id, epoch=epoch, active_site=target,
                           fenced_site=source or "primary", job_id=job_id))
        g = s.get(Group, g_id)
        assert g is not None
        g.enabled = False  # no more snapshots of the fenced primary
        s.commit()
    return {"epoch": epoch, "stopped": stopped, "unreachable": unreachable,
            "fenced_site": source}


def run_job(sf: Any, settings: Any, job_id: str) -> dict[str, Any]:
    from cutpoint.api.services import drills
    from cutpoint.coordinator.failover import BootSpec, FailoverError, failover

    t0 = time.monotonic()
    with sf() as s:
        job = s.get(Job, job_id)
        if job is None or job.group_id is None:
            raise FailoverFailed("bad_job", f"job {job_id} names no group")
        g_id, mode = job.group_id, job.params.get("mode", "unplanned")
        workload = job.params.get("workload") or "none"
        snap_id, actor = job.snapshot_id, job.created_by
    if mode == "planned" and snap_id is None:
        snap_id = _final_snapshot(sf, settings, g_id, actor)
    assert snap_id is not None
    with sf() as s:
        snap = s.get(GroupSnapshot, snap_id)
        if snap is None or snap.dr_verified_at is None:
            raise FailoverFailed("not_a_recovery_point", "the recovery point is not verified at DR")
        spec = drills.build_spec(s, snap, [], "fo")
        g = s.get(Group, g_id)
        assert g is not None and g.policy.replication_target is not None
        target = g.policy.replication_target.name
        txn, rp = snap.txn, snap.members[0].name
        j = s.get(Job, job_id)
        if j is not None:
            j.snapshot_id, j.message, j.progress = snap_id, f"fencing; recovery point {txn}", 0.3
            s.commit()
    boot = BootSpec(site=spec.site, vms=spec.vms, guest_image=spec.guest_image,
                    host_netns=spec.host_netns, accel=spec.accel, workload=workload,
                    state_dir=f"/var/lib/cutpoint/failover/{job_id[:8]}")
    try:
        res = failover(boot, rp, lambda: fence(sf, settings, g_id, snap_id, job_id, target),
                       t_request=t0)
    except FailoverError as exc:
        raise FailoverFailed("failover_failed", str(exc)) from exc
    return {"mode": mode, "recovery_point": txn, "snapshot_id": snap_id, **res.as_dict()}
