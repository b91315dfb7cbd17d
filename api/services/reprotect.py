"""Re-protect and failback: after a failover, protect the group the other way.

    POST /v1/groups/{g}/re-protect   job `reprotect`
    POST /v1/groups/{g}/failback     job `failback`

A failover leaves the group running at its DR site (fencing epoch n, DR
active) with nothing protecting it: its members are still the old
primary's VMs, its schedule is off.

Re-protect turns the group around and copies it back:

    reverse     each VM member now names the VM of the same name at the
                active site (the one the failover booted), and the group
                replicates to the site it left (`reverse_direction`)
    snapshot    a group snapshot of the VMs at the active site, through
                their agents (the normal capture path: a consistent cut of
                the running guests)
    replicate   active site -> old primary, from the newest recovery point
                both sites hold (the failover's, usually): cutpoint-sync
                ships what changed at the active site since then and
                repairs what the old primary wrote after it; with no common
                point it copies everything, and the result says so
                (`full_copy`)
    schedule    the group's schedule is switched back on: the group is
                protected again, in the other direction

Failback is a planned failover back to the original primary (the failover
job, run as part of this one: final snapshot and replication, stop, a
snapshot of the stopped disks, fence epoch n+1, roll back, boot), then
re-protect in the original direction.  It needs a re-protected group: the
old primary must hold a recent copy first.

Both jobs hold the group's lock and its replicate lock (tasks_dr.py).
"""

from __future__ import annotations

import time
from typing import Any

from cutpoint.api.errors import ApiError, Conflict
from cutpoint.api.models import (
    Group,
    GroupDisk,
    GroupMember,
    Host,
    Job,
    JobState,
    Site,
    Vm,
    utcnow,
)
from sqlalchemy import select
from sqlalchemy.orm import Session


class ReprotectFailed(Exception):
    def __init__(self, code: str, message: str, result: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.result = code, result or {}


def _member_site(s: Session, g: Group) -> str:
    sites = {gd.disk.vm.host.site.name
             for gd in s.scalars(select(GroupDisk).where(GroupDisk.group_id == g.id))}
    if len(sites) != 1:
        raise Conflict(f"group {g.name!r} has members at {sorted(sites) or 'no site'}",
                       code="mixed_sites" if sites else "no_members")
    return sites.pop()


def direction(s: Session, g: Group) -> tuple[str, str | None, Any]:
    """(the members' site, the replication target, the fencing state)."""
    from cutpoint.api.services import fencing

    target = g.policy.replication_target.name if g.policy and g.policy.replication_target \
        else None
    return _member_site(s, g), target, fencing.state(s, g.id)


def _counterparts(s: Session, g: Group, site: str) -> list[tuple[GroupMember, Vm, Vm]]:
    """Each VM member with the present VM of the same name at `site`."""
    out, missing = [], []
    for m in s.scalars(select(GroupMember).where(GroupMember.group_id == g.id)
                       .order_by(GroupMember.id)):
        vm = m.vm if m.vm is not None else (m.disk.vm if m.disk is not None else None)
        if vm is None:
            continue
        there = list(s.scalars(select(Vm).join(Host, Host.id == Vm.host_id)
                               .join(Site, Site.id == Host.site_id)
                               .where(Site.name == site, Vm.name == vm.name,
                                      Vm.present.is_(True))).unique())
        if len(there) != 1:
            missing.append(f"{vm.name} ({len(there)} at {site})")
            continue
        out.append((m, vm, there[0]))
    if missing:
        raise Conflict(f"site {site} does not list exactly one VM for each member: "
                       + ", ".join(missing) + "; sync its hosts' inventory "
                       "(POST /v1/hosts/{id}/sync)", code="no_counterpart",
                       extra={"vms": missing})
    return out


def check(s: Session, g: Group) -> tuple[str, str]:
    """(active site, site to protect to), or the refusal: the group must run at
    a site other than its members' (a failover happened and was not turned
    around yet)."""
    from cutpoint.api.services.sites import ceph_site

    members_at, target, st = direction(s, g)
    if st.active_site is None:
        raise Conflict(f"group {g.name!r} never failed over: it is protected from "
                       f"{members_at} to {target}", code="not_failed_over")
    if st.active_site == members_at:
        raise Conflict(f"group {g.name!r} is protected already: it runs at "
                       f"{members_at} (fencing epoch {st.epoch}) and replicates to {target}",
                       code="already_protected")
    _counterparts(s, g, st.active_site)
    ceph_site(s, members_at)  # the site copied to must have Ceph access
    ceph_site(s, st.active_site)
    return st.active_site, members_at


def reverse_direction(s: Session, g: Group, active: str, to: str) -> list[dict[str, Any]]:
    """Members -> the VMs of the same names at `active`; replication -> `to`."""
    pairs = _counterparts(s, g, active)
    moved = []
    for gd in list(s.scalars(select(GroupDisk).where(GroupDisk.group_id == g.id))):
        s.delete(gd)
    s.flush()
    for m, old, new in pairs:
        if m.disk_id is not None:
            assert m.disk is not None
            node = m.disk.node
            disk = next((d for d in new.disks if d.node == node and d.present), None)
            if disk is None:
                raise Conflict(f"{new.name} at {active} has no disk {node}",
                               code="no_counterpart")
            m.disk_id, disks = disk.id, [disk]
        else:
            m.vm_id, disks = new.id, [d for d in new.disks if d.present]
        for d in disks:
            s.add(GroupDisk(disk_id=d.id, group_id=g.id, member_id=m.id))
        moved.append({"vm": new.name, "from": old.host.name, "to": new.host.name,
                      "disks": sorted(d.key for d in disks)})
    assert g.policy is not None
    g.policy.replication_target = s.scalar(select(Site).where(Site.name == to))
    g.version += 1
    return moved


def request(s: Session, g: Group, kind: str, actor: str | None,
            settings: Any = None, workload: str = "none") -> Job:
    """Check, then create the `reprotect` or `failback` job (a refusal: no job)."""
    from cutpoint.api.services import failover_checks, jobs

    if kind == "reprotect":
        active, to = check(s, g)
        params: dict[str, Any] = {"group_id": g.id, "active": active, "to": to}
    else:
        members_at, target, st = direction(s, g)
        if st.active_site != members_at or target is None:
            raise Conflict(f"group {g.name!r} is not protected from the site it runs at "
                           f"({st.active_site}): re-protect it first "
                           f"(`cutpoint dr re-protect {g.name}`)", code="not_reprotected")
        # The failover's own preconditions, checked now: a refusal touches nothing.
        plan = failover_checks.members(s, g, None)
        failover_checks.raise_if_failed(failover_checks.run(s, settings, g, plan, None))
        params = {"group_id": g.id, "from": members_at, "to": target, "workload": workload,
                  "requested_at": time.time()}
    job = jobs.create(s, kind, actor=actor, group_id=g.id, params=params)
    jobs.add_event(s, job.id, "request", t_s=0.0, detail=params)
    return job


def _event(sf: Any, job_id: str, t0: float, step: str, detail: dict[str, Any],
           progress: float | None = None) -> None:
    from cutpoint.api.services import jobs

    with sf() as s:
        jobs.add_event(s, job_id, step, t_s=round(time.monotonic() - t0, 3), detail=detail)
        if progress is not None:
            j = s.get(Job, job_id)
            if j is not None:
                j.progress, j.message = max(j.progress, progress), step
                s.commit()


def _reprotect(sf: Any, settings: Any, job_id: str, g_id: int, actor: str | None,
               t0: float, base_progress: float = 0.0) -> dict[str, Any]:
    from cutpoint.api.models import GroupSnapshot
    from cutpoint.api.services import failover, replication

    span = 1.0 - base_progress
    with sf() as s:
        g = s.get(Group, g_id)
        assert g is not None
        try:
            active, to = check(s, g)
            moved = reverse_direction(s, g, active, to)
            s.commit()
        except ApiError as exc:
            raise ReprotectFailed(exc.code, exc.detail) from exc
    _event(sf, job_id, t0, "reverse", {"active": active, "to": to, "members": moved},
           base_progress + 0.1 * span)

    def mark(step: str, detail: dict[str, Any]) -> None:
        _event(sf, job_id, t0, step, detail, base_progress + 0.5 * span)

    try:
        snap_id = failover.final_snapshot(sf, settings, g_id, actor, mark, trigger="reprotect")
    except failover.FailoverFailed as exc:
        raise ReprotectFailed(exc.code, f"re-protect {active} -> {to}: {exc}; the group "
                              f"now names the VMs at {active} and replicates to {to} "
                              "(run re-protect's snapshot again: `cutpoint group snapshot`)",
                              {"reversed": moved}) from exc
    with sf() as s:
        snap = s.get(GroupSnapshot, snap_id)
        assert snap is not None
        rep = replication.summary(s, snap)
        g = s.get(Group, g_id)
        assert g is not None
        g.enabled = True
        s.commit()
    members = rep.get("members") or []
    full = [m["disk"] for m in members if m.get("full")]
    shipped = sum(int(m.get("bytes_shipped") or 0) for m in members)
    changed = sum(int(m.get("bytes_changed") or 0) for m in members)
    out = {"active": active, "protected_to": to, "members": moved, "snapshot_id": snap_id,
           "txn": rep.get("txn"), "bytes_shipped": shipped, "bytes_changed": changed,
           "full_copy": bool(full),
           "full_copy_why": (f"no recovery point common to {active} and {to} for "
                             f"{', '.join(full)}: copied whole") if full else None,
           "replication": members, "schedule": "enabled"}
    _event(sf, job_id, t0, "protected", {k: out[k] for k in
                                         ("txn", "bytes_shipped", "bytes_changed",
                                          "full_copy", "full_copy_why")},
           base_progress + span)
    return out


def run_reprotect(sf: Any, settings: Any, job_id: str) -> dict[str, Any]:
    t0 = time.monotonic()
    with sf() as s:
        job = s.get(Job, job_id)
        assert job is not None and job.group_id is not None
        g_id, actor = job.group_id, job.created_by
    return _reprotect(sf, settings, job_id, g_id, actor, t0)


def run_failback(sf: Any, settings: Any, job_id: str) -> dict[str, Any]:
    """The planned failover back (as its own `failover` job, run here), then
    re-protect in the original direction."""
    from cutpoint.api.services import failover, jobs

    t0 = time.monotonic()
    with sf() as s:
        job = s.get(Job, job_id)
        assert job is not None and job.group_id is not None
        g_id, actor, p = job.group_id, job.created_by, dict(job.params or {})
        fo = jobs.create(s, "failover", actor=actor, group_id=g_id,
                         params={"group_id": g_id, "mode": "planned",
                                 "workload": p.get("workload") or "none",
                                 "recovery_point": None,
                                 "requested_at": p.get("requested_at") or time.time(),
                                 "failback_job": job_id})
        fo.state, fo.started_at, fo.message = JobState.running, utcnow(), "running"
        s.commit()
        fo_id = fo.id
    _event(sf, job_id, t0, "failover", {"job": fo_id, "to": p.get("to")}, 0.05)
    try:
        fo_result = failover.run_job(sf, settings, fo_id)
        state, code, err = JobState.succeeded, None, None
    except failover.FailoverFailed as exc:
        fo_result, state, code, err = exc.result, JobState.failed, exc.code, str(exc)
    with sf() as s:
        fo = s.get(Job, fo_id)
        if fo is not None:
            fo.state, fo.result, fo.error_code, fo.error = state, fo_result, code, err
            fo.progress, fo.finished_at = 1.0, utcnow()
            s.commit()
    if state != JobState.succeeded:
        raise ReprotectFailed(code or "failover_failed",
                              f"failback: the failover to {p.get('to')} failed (job {fo_id}): "
                              f"{err}", {"failover_job": fo_id, "failover": fo_result})
    _event(sf, job_id, t0, "failed_back", {"job": fo_id, "rto_s": fo_result.get("rto_s")},
           0.6)
    try:
        rp = _reprotect(sf, settings, job_id, g_id, actor, t0, base_progress=0.6)
    except ReprotectFailed as exc:
        exc.result = {**exc.result, "failover_job": fo_id, "failover": fo_result}
        raise
    return {"failover_job": fo_id, "rto_s": fo_result.get("rto_s"),
            "recovery_point": fo_result.get("recovery_point"), "failover": fo_result,
            "reprotect": rp}
