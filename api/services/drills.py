"""Drills through the control plane: `POST /v1/groups/{id}/drills`.

The job's params name the recovery point (a group snapshot id or txn, or
"latest": the newest DR recovery point) and the checks.  `run_job` builds a
`cutpoint.coordinator.dr.drill.DrillSpec` from the database (member disks
of the recovery point -> DR images, the DR site's Ceph access as set
through the API), runs it
with the configured booter (setting `booter`), mirrors each timeline event
into the job's progress/message (what `cutpoint drill run` follows), and
stores the report in the job result.  A drill whose check fails is a failed
job whose result still holds the whole report (evidence).

The agent booter (the default) boots the drill's VMs on the DR agents
from their captured definitions (drill_boot.py); a site where it cannot
(no signing key, no `definition_targets` entry or no `drill_network`
there), or a booter that boots no drill at all, is refused at the request,
409 `drill_boot_unsupported`, before any job or clone exists.
"""

from __future__ import annotations

import os
from typing import Any

from cutpoint.api.errors import Conflict, NotFound
from cutpoint.api.models import Disk, Group, GroupSnapshot, Job, SnapState, utcnow
from sqlalchemy import select
from sqlalchemy.orm import Session

STEPS = {"start": 0.02, "clone": 0.15, "define": 0.18, "isolate": 0.2, "boot_group": 0.3,
         "boot": 0.5, "check": 0.85,
         "cleanup": 0.95, "verdict": 0.99, "error": 0.9}


class DrillFailed(Exception):
    def __init__(self, code: str, message: str, result: dict[str, Any] | None = None) -> None:
        self.code = code
        self.result = result
        super().__init__(message)


def recovery_point(s: Session, g: Group, ref: str | int | None) -> GroupSnapshot:
    """A DR recovery point of `g` by id, txn, or None/"latest" (the newest)."""
    q = select(GroupSnapshot).where(GroupSnapshot.group_id == g.id)
    if ref in (None, "", "latest"):
        snap = s.scalar(q.where(GroupSnapshot.dr_verified_at.is_not(None),
                                GroupSnapshot.state == SnapState.committed)
                        .order_by(GroupSnapshot.cut_at.desc()).limit(1))
        if snap is None:
            raise NotFound(f"group {g.name!r} has no DR recovery point yet",
                           code="no_recovery_point")
        return snap
    sref = str(ref)
    snap = s.scalar(q.where(GroupSnapshot.id == int(sref))) if sref.isdigit() else None
    snap = snap or s.scalar(q.where(GroupSnapshot.txn == sref))
    if snap is None:
        raise NotFound(f"group {g.name!r} has no snapshot {sref!r}", code="snapshot_not_found")
    if snap.dr_verified_at is None or snap.state != SnapState.committed:
        raise Conflict(f"snapshot {snap.txn} is not a DR recovery point (state "
                       f"{snap.state.value}, not verified at DR)", code="not_a_recovery_point")
    return snap


def request(s: Session, g: Group, ref: str | int | None, checks: list[Any] | None,
            actor: str | None, booter: str, settings: Any = None,
            readiness: dict[str, dict[str, Any]] | None = None,
            plan: dict[str, Any] | None = None) -> Job:
    """The drill job of `g`, checked: its checks (names or {name, params,
    timeout_s}; None: the plan's, else writer), readiness rules and plan
    (None: the group's newest), the recovery point, the booter.  One drill
    of a group at a time: 409 drill_in_progress, also for the loser of two
    requests at once (the database's unique index on active drill jobs)."""
    from cutpoint.api.errors import ApiError
    from cutpoint.api.services import jobs, plans
    from cutpoint.coordinator.dr import checks as drill_checks
    from cutpoint.coordinator.dr.boot import (
        DRILL,
        DRILL_REFUSAL,
        UnknownBooter,
        load_booter,
    )
    from cutpoint.coordinator.dr.readiness import Readiness, RuleError
    from sqlalchemy.exc import IntegrityError

    plans.storable("checks", checks, "bad_check")
    plans.storable("readiness", readiness, "bad_readiness")
    plan_obj, plan_version = (plans.validate(s, g, plan), None) if plan is not None \
        else plans.current(s, g)
    if checks is None:
        specs = list(plan_obj.drill_checks) if plan_obj and plan_obj.drill_checks else \
            [drill_checks.CheckSpec("writer")]
    else:
        try:
            specs = [drill_checks.CheckSpec.parse(c) for c in checks]
        except drill_checks.CheckError as exc:
            raise ApiError(str(exc), code="bad_check") from exc
    unknown = [c.name for c in specs if c.name not in drill_checks.known()]
    if unknown:
        raise ApiError(f"unknown check(s) {unknown}; known: {drill_checks.known()}",
                       code="unknown_check")
    for vm, rule in (readiness or {}).items():
        try:
            Readiness.parse(rule)
        except RuleError as exc:
            raise ApiError(f"readiness of {vm}: {exc}", code="bad_readiness") from exc
    from cutpoint.api.services import drill_schedule

    running = drill_schedule.in_progress(s, g)
    if running is not None:
        raise Conflict(f"a drill of group {g.name} is already {running.state.value} (job "
                       f"{running.id}); one drill per group at a time", code="drill_in_progress")
    snap = recovery_point(s, g, ref)
    try:
        b = load_booter(booter)
    except UnknownBooter as exc:
        raise Conflict(str(exc), code="unknown_booter") from exc
    if DRILL not in b.purposes:
        raise Conflict(f"booter {booter!r} cannot boot a drill", code="drill_boot_unsupported")
    if getattr(b, "needs_definitions", False):
        from cutpoint.api.services import drill_boot

        target = g.policy.replication_target if g.policy else None
        why = ("the group has no replication target" if target is None or settings is None
               else drill_boot.check(settings, target.name,
                                     plan_obj.drill_network if plan_obj else None))
        if why:
            raise Conflict(f"booter {booter!r} cannot boot this drill: {why}; "
                           f"{DRILL_REFUSAL}", code="drill_boot_unsupported")
    params = {"group_id": g.id, "recovery_point": snap.txn,
              "checks": [c.as_dict() if c.params or c.timeout_s != drill_checks.
                         DEFAULT_TIMEOUT_S else c.name for c in specs],
              "readiness": dict(readiness or {}), "plan": plan,
              "plan_version": plan_version}
    try:
        return jobs.create(s, "drill", actor=actor, group_id=g.id, snapshot_id=snap.id,
                           params=params)
    except IntegrityError:
        # another request of this group's drill was created between our
        # look and our insert: the index on active drill jobs refused ours
        s.rollback()
        running = drill_schedule.in_progress(s, g)
        raise Conflict(f"a drill of group {g.name} is already "
                       f"{running.state.value if running else 'queued'}"
                       f"{f' (job {running.id})' if running else ''}; one drill per group "
                       "at a time", code="drill_in_progress") from None


def build_spec(s: Session, snap: GroupSnapshot, checks: list[Any], drill_id: str,
               sf: Any = None, settings: Any = None, params: dict[str, Any] | None = None) \
        -> Any:
    """The DrillSpec of a recovery point: its member VMs and their images at DR."""
    from cutpoint.api.services.replication import ReplicationFailed, site_of
    from cutpoint.coordinator.dr.boot import BootDisk, BootVM
    from cutpoint.coordinator.dr.drill import DrillSpec

    g = s.get(Group, snap.group_id)
    assert g is not None
    target = g.policy.replication_target if g.policy else None
    if target is None:
        raise DrillFailed("no_target", f"group {g.name} has no replication target")
    try:
        site = site_of(s, target.name)
    except ReplicationFailed as exc:
        raise DrillFailed(exc.code, str(exc)) from exc
    by_vm: dict[str, list[BootDisk]] = {}
    for m in snap.members:
        disk = s.get(Disk, m.disk_id) if m.disk_id else None
        if disk is None or not disk.image:
            raise DrillFailed("not_replicable", f"member {m.disk} has no RBD image")
        by_vm.setdefault(m.vm, []).append(BootDisk(disk.node, disk.image, disk.pool or "rbd"))
    vms = [BootVM(vm, tuple(sorted(d, key=lambda x: x.node))) for vm, d in sorted(by_vm.items())]
    from cutpoint.api.services import plans
    from cutpoint.coordinator.dr.plan import RecoveryPlan

    params = params or {}
    if params.get("plan") is not None:
        plan = RecoveryPlan.parse(params["plan"])
    elif params.get("plan_version") is not None:
        row = plans.get(s, g, int(params["plan_version"]), missing_ok=True)
        plan = RecoveryPlan.parse(row.body) if row else None
    else:
        plan = None
    definitions, tls = None, None
    if sf is not None and settings is not None:
        from cutpoint.api.services import drill_boot

        definitions = drill_boot.definitions(sf, settings, target.name,
                                             plan.drill_network if plan else None)
        if settings.agent_ca and settings.agent_cert and settings.agent_key:
            tls = (str(settings.agent_ca), str(settings.agent_cert), str(settings.agent_key))
    return DrillSpec(site=site, recovery_point=snap.members[0].name, vms=vms,
                     checks=checks,
                     report_dir=os.environ.get("CP_DRILL_DIR", "/var/lib/cutpoint/drills"),
                     drill_id=drill_id, definitions=definitions, agent_tls=tls,
                     readiness=dict(params.get("readiness") or {}), plan=plan)


def _interrupted(sf: Any, settings: Any, job_id: str, spec: Any,
                 attempt: int) -> dict[str, Any]:
    from cutpoint.coordinator.dr.boot import load_booter
    from cutpoint.coordinator.dr.drill import sweep_interrupted

    out = sweep_interrupted(spec, load_booter(settings.booter))
    c = out["cleanup"]
    left = {k: v for k, v in c["leftovers"].items() if v}
    done = ("cleaned up" if c["ok"] else
            f"cleanup failed: {'; '.join(c['errors']) or 'left'} {left or ''}".rstrip())
    with sf() as s:
        j = s.get(Job, job_id)
        if j is not None:
            j.message = f"interrupted: {done}"[:255]
            s.commit()
    raise DrillFailed("drill_interrupted",
                      f"drill {out['drill_id']} interrupted: the worker running it was lost "
                      f"(this is attempt {attempt}); what it started at DR was {done}", out)


def run_job(sf: Any, settings: Any, job_id: str) -> dict[str, Any]:
    from cutpoint.coordinator.dr.boot import load_booter
    from cutpoint.coordinator.dr.drill import run_drill

    with sf() as s:
        job = s.get(Job, job_id)
        if job is None or job.snapshot_id is None:
            raise DrillFailed("bad_job", f"job {job_id} names no recovery point")
        snap = s.get(GroupSnapshot, job.snapshot_id)
        if snap is None or snap.dr_verified_at is None:
            raise DrillFailed("not_a_recovery_point", "the recovery point is gone")
        spec = build_spec(s, snap, list(job.params.get("checks") or ["writer"]),
                          job_id.replace("-", "")[:8], sf, settings, job.params)
        attempt = job.attempts
    if attempt > 1:
        # An earlier delivery ran this drill and its worker died (a drill
        # job is redelivered only then): its clones and guests are still at
        # DR.  Clean them up and record the drill interrupted, rather than
        # run it again over what it left.
        return _interrupted(sf, settings, job_id, spec, attempt)

    def progress(ev: dict[str, Any]) -> None:
        with sf() as s2:
            j = s2.get(Job, job_id)
            if j is None:
                return
            j.progress = max(j.progress, STEPS.get(ev["step"], j.progress))
            detail = ev.get("vm") or ev.get("check") or ev.get("error") or ""
            j.message = f"{ev['step']} {ev['status']} {detail}".strip()[:255]
            s2.commit()

    report = run_drill(spec, load_booter(settings.booter), on_event=progress)
    if report["verdict"] != "passed":
        why = report.get("error") or "; ".join(
            f"{c['name']}: {c['summary']}" for c in report["checks"] if not c["ok"]) \
            or "cleanup failed"
        with sf() as s:
            j = s.get(Job, job_id)
            if j is not None:
                # The evidence stays with the failed job.
                j.result = report
                j.finished_at = utcnow()
                s.commit()
        raise DrillFailed("drill_failed", f"drill {report['drill_id']} failed: {why} "
                          f"(report {report['report_html']})", report)
    return dict(report)
