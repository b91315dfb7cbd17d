"""Restore of a group snapshot through the control plane.

    POST /v1/groups/{g}/restore/clone     {snapshot, site?, suffix? | names?}
    POST /v1/groups/{g}/restore/in-place  {snapshot, site?}

`site` is where the images are restored: the primary (the members' own
site, the default) or the DR site (the copies replication made there, under
the same image and snapshot names).  At the primary any committed group
snapshot whose member snapshots still exist can be restored; at DR only a
verified recovery point.

The request is checked before a job exists (a refusal is a problem and
nothing is touched): the snapshot, the site's Ceph access, that the site
holds the snapshot on every member, and, for in-place, that no member VM
runs at that site.  Which VMs run is asked of every agent of the site; an
agent that does not answer refuses the restore too, because a VM it runs
cannot be ruled out.  The job checks again before it changes anything (a
VM may have started meanwhile), and the Ceph side refuses an image with a
lock holder (coordinator/dr/restore.py).

The job holds the group's lock (no snapshot or retention of the group
meanwhile: retention could delete the snapshot being restored) and its
replicate lock (an in-place restore at DR rewrites the images replication
writes).
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from cutpoint.api.errors import ApiError, Conflict, NotFound
from cutpoint.api.models import Disk, Group, GroupSnapshot, Host, Job, Site, SnapState
from sqlalchemy import select
from sqlalchemy.orm import Session

CLONE, IN_PLACE = "clone", "in_place"
# A VM the agent lists in this state has no process holding its disks.
STOPPED_STATES = ("shutoff",)
_IMAGE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class RestoreFailed(Exception):
    def __init__(self, code: str, message: str, result: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.result = code, result or {}


def snapshot_of(s: Session, g: Group, ref: str, at_dr: bool) -> GroupSnapshot:
    """The group snapshot `ref` (id, txn or "latest") that can be restored here."""
    from cutpoint.api.services import drills

    if at_dr:
        return drills.recovery_point(s, g, ref)
    q = select(GroupSnapshot).where(GroupSnapshot.group_id == g.id)
    if ref in ("", "latest"):
        snap = s.scalar(q.where(GroupSnapshot.state == SnapState.committed)
                        .order_by(GroupSnapshot.cut_at.desc()).limit(1))
        if snap is None:
            raise NotFound(f"group {g.name!r} has no committed snapshot", code="snapshot_not_found")
        return snap
    snap = s.scalar(q.where(GroupSnapshot.id == int(ref))) if ref.isdigit() else None
    snap = snap or s.scalar(q.where(GroupSnapshot.txn == ref))
    if snap is None:
        raise NotFound(f"group {g.name!r} has no snapshot {ref!r}", code="snapshot_not_found")
    if snap.state != SnapState.committed:
        raise Conflict(f"snapshot {snap.txn} is {snap.state.value}, not committed: it is no "
                       "consistent cut", code="snapshot_not_committed")
    return snap


def source_site(s: Session, snap: GroupSnapshot) -> str:
    """The site of the snapshot's member disks (RBD only: other backends have no restore)."""
    sites = set()
    for m in snap.members:
        disk = s.get(Disk, m.disk_id) if m.disk_id else None
        if disk is None or disk.backend != "rbd" or not disk.image:
            raise Conflict(f"member {m.disk} is not an RBD disk: cutpoint restores RBD "
                           "images only", code="not_restorable")
        sites.add(disk.vm.host.site.name)
    if len(sites) != 1:
        raise Conflict(f"the snapshot's members are at sites {sorted(sites)}",
                       code="mixed_sites")
    return sites.pop()


def plan_of(s: Session, snap: GroupSnapshot, site: str) -> Any:
    from cutpoint.api.services.sites import ceph_site
    from cutpoint.coordinator.dr.restore import RestoreDisk, RestorePlan

    disks = []
    for m in sorted(snap.members, key=lambda m: m.disk):
        d = s.get(Disk, m.disk_id)
        assert d is not None and d.image  # source_site checked it
        disks.append(RestoreDisk(m.vm, d.node, d.pool or "rbd", d.image, m.name))
    return RestorePlan(ceph_site(s, site), disks)


def clone_names(plan: Any, snap: GroupSnapshot, suffix: str | None,
                names: dict[str, str] | None) -> dict[str, str]:
    """{disk key: clone image}: the operator's names, else `<image>-<suffix>`
    (default suffix `restore-<snapshot id>`)."""
    from cutpoint.coordinator.dr.restore import clone_name

    keys = {d.key for d in plan.disks}
    if names:
        unknown = sorted(set(names) - keys)
        if unknown:
            raise ApiError(f"names for disks that are not members: {unknown}; the members "
                           f"are {sorted(keys)}", code="bad_names")
        out = {d.key: names.get(d.key) or clone_name(d, suffix or f"restore-{snap.id}")
               for d in plan.disks}
    else:
        out = {d.key: clone_name(d, suffix or f"restore-{snap.id}") for d in plan.disks}
    bad = sorted(v for v in out.values() if not _IMAGE_NAME.match(v))
    if bad:
        raise ApiError(f"not an image name: {bad}", code="bad_names")
    return out


def running_members(s: Session, settings: Any, site: str, vms: list[str],
                    timeout_s: float = 10) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """([{vm, host, state}] of member VMs not stopped at `site`, [{host, error}] unasked)."""
    from cutpoint.api.services import agents

    hosts = list(s.scalars(select(Host).join(Site, Host.site_id == Site.id)
                           .where(Site.name == site).order_by(Host.name)))

    async def ask(h: Host) -> list[dict[str, Any]] | BaseException:
        try:
            return await asyncio.wait_for(
                agents.call_async(h, settings, [("inventory", {})],
                                  connect_timeout_s=min(5.0, timeout_s)), timeout_s)
        except Exception as exc:  # noqa: BLE001  an unasked host refuses the restore
            return exc

    async def all_() -> list[Any]:
        return await asyncio.gather(*(ask(h) for h in hosts))

    running, unasked = [], []
    wanted = set(vms)
    for h, got in zip(hosts, asyncio.run(all_()) if hosts else [], strict=True):
        if isinstance(got, BaseException):
            unasked.append({"host": h.name, "error": f"{type(got).__name__}: {got}"[:300]})
            continue
        for vm in (got[0].get("vms") or []) if got else []:
            if vm.get("name") in wanted and (vm.get("state") not in STOPPED_STATES
                                             or vm.get("stale")):
                running.append({"vm": vm["name"], "host": h.name, "state": vm.get("state"),
                                "stale": bool(vm.get("stale"))})
    return running, unasked


def refuse_if_running(s: Session, settings: Any, site: str, vms: list[str]) -> None:
    running, unasked = running_members(s, settings, site, vms)
    if running:
        raise Conflict("an in-place restore needs every member VM stopped; running at "
                       f"{site}: " + ", ".join(f"{r['vm']} on {r['host']} ({r['state']}"
                                                f"{', stale' if r['stale'] else ''})"
                                                for r in running)
                       + ". Stop them first (or restore as clones).",
                       code="vms_running", extra={"vms": running})
    if unasked:
        raise ApiError("cannot tell whether the member VMs are stopped: the agent of "
                       + ", ".join(f"{u['host']} ({u['error']})" for u in unasked)
                       + " did not answer", code="agents_unreachable", status=503,
                       extra={"hosts": unasked})


def request(s: Session, settings: Any, g: Group, mode: str, ref: str, site: str | None,
            suffix: str | None, names: dict[str, str] | None, actor: str | None) -> Job:
    """Check the restore, then create its job (a refusal is a problem and no job)."""
    from cutpoint.api.services import jobs
    from cutpoint.coordinator.dr.restore import RestoreRefused, check

    if mode not in (CLONE, IN_PLACE):
        raise ApiError(f"mode must be {CLONE} or {IN_PLACE}", code="bad_mode")
    primary = _primary_of(s, g)
    site = site or primary
    at_dr = site != primary
    if at_dr and (g.policy is None or g.policy.replication_target is None
                  or g.policy.replication_target.name != site):
        raise Conflict(f"site {site!r} is neither the group's primary ({primary}) nor its "
                       "DR site", code="not_a_group_site")
    snap = snapshot_of(s, g, ref, at_dr)
    if source_site(s, snap) != primary:
        raise Conflict("the snapshot was taken at another site than the group's members "
                       "are now", code="mixed_sites")
    plan = plan_of(s, snap, site)
    cnames = clone_names(plan, snap, suffix, names) if mode == CLONE else {}
    if mode == IN_PLACE:
        refuse_if_running(s, settings, site, sorted({d.vm for d in plan.disks}))
    try:  # a CephError here is the API's Ceph problem (errors.CEPH_STATUS)
        check(plan, mode, cnames)
    except RestoreRefused as exc:
        raise Conflict(str(exc), code=exc.code, extra={"items": exc.items}) from exc
    job = jobs.create(s, "restore", actor=actor, group_id=g.id, snapshot_id=snap.id,
                      params={"group_id": g.id, "snapshot_id": snap.id, "mode": mode,
                              "site": site, "names": cnames})
    jobs.add_event(s, job.id, "request", t_s=0.0, detail={
        "mode": mode, "site": site, "snapshot": snap.txn,
        "disks": [d.key for d in plan.disks], "names": cnames})
    return job


def _primary_of(s: Session, g: Group) -> str:
    from cutpoint.api.models import GroupDisk

    sites = {gd.disk.vm.host.site.name
             for gd in s.scalars(select(GroupDisk).where(GroupDisk.group_id == g.id))}
    if not sites:
        raise Conflict(f"group {g.name!r} has no member disks", code="no_members")
    if len(sites) > 1:
        raise Conflict(f"group {g.name!r} has members at several sites {sorted(sites)}",
                       code="mixed_sites")
    return sites.pop()


def run_job(sf: Any, settings: Any, job_id: str) -> dict[str, Any]:
    """The restore job: checks again, then clones or rolls back, one event per disk."""
    import time

    from cutpoint.api.services import jobs
    from cutpoint.coordinator.dr import restore as core
    from cutpoint.coordinator.dr.ceph_errors import CephError

    t0 = time.monotonic()
    with sf() as s:
        job = s.get(Job, job_id)
        assert job is not None
        p = dict(job.params or {})
        snap = s.get(GroupSnapshot, int(p["snapshot_id"]))
        if snap is None:
            raise RestoreFailed("snapshot_not_found", "the snapshot was deleted before the "
                                "restore ran")
        mode, site = p["mode"], p["site"]
        try:
            plan = plan_of(s, snap, site)
            if mode == IN_PLACE:
                refuse_if_running(s, settings, site, sorted({d.vm for d in plan.disks}))
        except ApiError as exc:
            raise RestoreFailed(exc.code, exc.detail, {"refused": exc.extra}) from exc
        total = len(plan.disks)

    def on_progress(step: str, detail: dict[str, Any]) -> None:
        with sf() as s:
            jobs.add_event(s, job_id, step, t_s=round(time.monotonic() - t0, 3), detail=detail)
            j = s.get(Job, job_id)
            if j is not None:
                j.progress = detail["done"] / max(1, total)
                j.message = f"{step} {detail['done']}/{total}: {detail['disk']}"[:255]
                s.commit()

    try:
        if mode == CLONE:
            done = core.clones(plan, dict(p["names"]), on_progress=on_progress)
        else:
            done = core.in_place(plan, on_progress=on_progress)
    except core.RestoreRefused as exc:
        raise RestoreFailed(exc.code, str(exc), {"refused": exc.items}) from exc
    except core.RestoreFailed as exc:
        raise RestoreFailed("restore_failed", str(exc),
                            {"done": exc.done, "undone": exc.undone}) from exc
    except CephError as exc:
        raise RestoreFailed(exc.code, str(exc)) from exc
    return {"mode": mode, "site": site, "snapshot": snap.txn, "disks": done,
            "seconds": round(time.monotonic() - t0, 3)}
