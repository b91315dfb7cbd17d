"""What the console's pages show, read through the services the REST routes
use (rpo, replication, snapshots, jobs): plain dicts for the templates.

RPO at each site, in the design's terms:
- primary: now minus the cut of the newest committed group snapshot (what a
  restore at the primary would lose);
- DR: now minus the cut of the newest DR recovery point
  (`replication.achieved_dr_rpo_s`), with the replication lag of that point
  (`replication.replication_lag_s`).
Either is compared with the policy's `rpo_seconds` when the group has one.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from cutpoint.api.config import Settings
from cutpoint.api.models import (
    Disk,
    FencingEpoch,
    Group,
    GroupDisk,
    GroupSnapshot,
    Host,
    Job,
    Site,
    SnapState,
    Vm,
    as_utc,
    utcnow,
)
from cutpoint.api.services import jobs, replication, rpo, snapshots
from cutpoint.coordinator.dr import drill_timeline
from sqlalchemy import func, select
from sqlalchemy.orm import Session

SNAPSHOTS_SHOWN = 20
JOBS_SHOWN = 50
DONE = ("succeeded", "failed")



def _standing(age_s: float | None, target_s: int | None) -> str:
    """ok / breached against the target; none without a point; untracked without a target."""
    if age_s is None:
        return "none"
    if target_s is None:
        return "untracked"
    return "ok" if age_s <= target_s else "breached"


def primary_sites(s: Session, g: Group) -> list[str]:
    """The sites of the hosts the group's disks are on."""
    return list(s.scalars(
        select(Site.name).distinct()
        .join(Host, Host.site_id == Site.id).join(Vm, Vm.host_id == Host.id)
        .join(Disk, Disk.vm_id == Vm.id).join(GroupDisk, GroupDisk.disk_id == Disk.id)
        .where(GroupDisk.group_id == g.id).order_by(Site.name)))


def site_rpo(s: Session, g: Group, now: dt.datetime) -> list[dict[str, Any]]:
    """One row per site: the primary, then the replication target if any."""
    target = g.policy.rpo_seconds if g.policy else None
    newest = as_utc(s.scalar(select(func.max(GroupSnapshot.cut_at)).where(
        GroupSnapshot.group_id == g.id, GroupSnapshot.state == SnapState.committed)))
    age = (now - newest).total_seconds() if newest else None
    rows = [{"role": "primary", "site": ", ".join(primary_sites(s, g)) or "-",
             "newest": newest, "achieved_s": age, "lag_s": None, "target_s": target,
             "standing": _standing(age, target)}]
    dr = g.policy.replication_target if g.policy else None
    if dr is not None:
        dr_age = replication.achieved_dr_rpo_s(s, g.id, now)
        rows.append({"role": "dr", "site": dr.name,
                     "newest": now - dt.timedelta(seconds=dr_age) if dr_age is not None
                     else None,
                     "achieved_s": dr_age, "lag_s": replication.replication_lag_s(s, g.id),
                     "target_s": target, "standing": _standing(dr_age, target)})
    return rows


def last_drill(s: Session, g: Group) -> Job | None:
    return s.scalar(select(Job).where(Job.kind == "drill", Job.group_id == g.id)
                    .order_by(Job.created_at.desc(), Job.id.desc()).limit(1))


def active_site(s: Session, g: Group) -> str | None:
    """The site that owns the group after a failover (its newest fencing epoch)."""
    fe = s.scalar(select(FencingEpoch).where(FencingEpoch.group_id == g.id)
                  .order_by(FencingEpoch.epoch.desc()).limit(1))
    return fe.active_site if fe else None


def overview(s: Session) -> list[dict[str, Any]]:
    """Every group with its RPO at each site and its last drill, by name."""
    now = utcnow()
    out = []
    for g in s.scalars(select(Group).order_by(Group.name)):
        drill = last_drill(s, g)
        out.append({"name": g.name, "enabled": g.enabled,
                    "rpo_s": g.policy.rpo_seconds if g.policy else None,
                    "sites": site_rpo(s, g, now), "active_site": active_site(s, g),
                    "in_flight": snapshots.in_flight(s, g.id) is not None,
                    "drill": job_row(drill) if drill else None})
    return out


def recovery_points(s: Session, g: Group) -> list[dict[str, Any]]:
    """The group's newest snapshots, each at the primary (its member
    snapshots) and at DR (replication state, lag, verified)."""
    rows = []
    for snap in s.scalars(select(GroupSnapshot).where(GroupSnapshot.group_id == g.id)
                          .order_by(GroupSnapshot.id.desc()).limit(SNAPSHOTS_SHOWN)):
        present = sum(1 for m in snap.members if m.state == "present")
        rep = (replication.summary(s, snap)
               if g.policy and g.policy.replication_target_id else None)
        rows.append({"id": snap.id, "txn": snap.txn, "state": snap.state.value,
                     "trigger": snap.trigger, "cut_at": as_utc(snap.cut_at),
                     "max_pause_ms": snap.max_pause_ms, "job_id": snap.job_id,
                     "error": snap.error, "members": len(snap.members),
                     "present": present,
                     "primary_point": snap.state == SnapState.committed and present > 0,
                     "dr_state": rep["state"] if rep else None,
                     "dr_point": bool(rep and rep["recovery_point"]),
                     "dr_lag_s": rep["lag_s"] if rep else None,
                     "dr_verified_at": as_utc(snap.dr_verified_at)})
    return rows


def group_page(s: Session, settings: Settings, g: Group) -> dict[str, Any]:
    now = utcnow()
    status = rpo.status(s, g, settings.capture_head_start_s, now)
    drills = [job_row(j) for j in s.scalars(
        select(Job).where(Job.kind == "drill", Job.group_id == g.id)
        .order_by(Job.created_at.desc(), Job.id.desc()).limit(JOBS_SHOWN))]
    recent = [job_row(j) for j in s.scalars(
        select(Job).where(Job.group_id == g.id, Job.kind != "drill")
        .order_by(Job.created_at.desc(), Job.id.desc()).limit(10))]
    members = sorted(({"name": m.vm.name, "vm_id": m.vm.id} if m.vm else
                      {"name": m.disk.key if m.disk else "?",
                       "vm_id": m.disk.vm_id if m.disk else None} for m in g.members),
                     key=lambda m: str(m["name"]))
    return {"name": g.name, "description": g.description, "enabled": g.enabled,
            "policy": g.policy, "members": members,
            "target": g.policy.replication_target.name
            if g.policy and g.policy.replication_target else None,
            "sites": site_rpo(s, g, now), "status": status, "active_site": active_site(s, g),
            "points": recovery_points(s, g), "drills": drills, "jobs": recent}


def group_live(s: Session, g: Group) -> dict[str, Any]:
    """What the group page polls: RPO at each site and the recovery points."""
    return {"name": g.name, "sites": site_rpo(s, g, utcnow()), "points": recovery_points(s, g),
            "target": g.policy.replication_target.name
            if g.policy and g.policy.replication_target else None}


def dr_points(s: Session, g: Group) -> list[dict[str, Any]]:
    """The DR recovery points a failover may choose, newest first."""
    return [{"txn": p.txn, "cut_at": as_utc(p.cut_at), "verified_at": as_utc(p.dr_verified_at)}
            for p in s.scalars(select(GroupSnapshot).where(
                GroupSnapshot.group_id == g.id, GroupSnapshot.state == SnapState.committed,
                GroupSnapshot.dr_verified_at.is_not(None))
                .order_by(GroupSnapshot.cut_at.desc()).limit(SNAPSHOTS_SHOWN))]


def job_row(j: Job) -> dict[str, Any]:
    p = jobs.public(j)
    return {**p.model_dump(), "done": p.state in DONE,
            "verdict": (j.result or {}).get("verdict") if j.kind == "drill" else None}


def job_list(s: Session) -> list[dict[str, Any]]:
    rows = s.scalars(select(Job).order_by(Job.created_at.desc(), Job.id.desc())
                     .limit(JOBS_SHOWN))
    return [job_row(j) for j in rows]


def group_names(s: Session, ids: set[int]) -> dict[int, str]:
    if not ids:
        return {}
    return {i: n for i, n in s.execute(select(Group.id, Group.name).where(Group.id.in_(ids)))}


def job_page(s: Session, j: Job) -> dict[str, Any]:
    row = job_row(j)
    row["events"] = [e.model_dump() for e in jobs.events(s, j.id)]
    row["group"] = group_names(s, {j.group_id}).get(j.group_id) if j.group_id else None
    return row


def drill_report(s: Session, j: Job) -> dict[str, Any]:
    """A drill job's report (its result; a failed drill keeps it too) and the
    job itself.  The report is what cutpoint.coordinator.dr.drill wrote."""
    rep = dict(j.result or {})
    return {"job": job_page(s, j), "report": rep,
            "verdict": rep.get("verdict") or ("pending" if j.state.value not in DONE
                                              else "none"),
            "checks": list(rep.get("checks") or []),
            "timeline": list(rep.get("timeline") or []),
            # Markup built by drill_timeline.svg, which escapes every value.
            "timeline_svg": drill_timeline.svg(drill_timeline.vm_rows(rep)) if rep else "",
            "guests": list(rep.get("guests") or []),
            "cleanup": rep.get("cleanup") or {}}
