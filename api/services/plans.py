"""Recovery plans through the API (coordinator/dr/plan.py says what a plan is).

    put(s, g, body, actor)   a new version of the group's plan (the same body
                             as the newest: that one, no new version)
    get(s, g, version=None)  the newest version, or that one
    versions(s, g)           every version, newest first
    current(s, g)            the parsed newest plan and its version, or (None, None)

A plan is checked before it is stored (PlanError -> 400 `bad_plan`), and
every VM it names must be a member of the group (400 `plan_unknown_vm`).
Drills use the group's newest plan unless the request brings one
(`cutpoint drill run --plan FILE`); failover uses the newest.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from cutpoint.api.errors import ApiError, NotFound
from cutpoint.api.models import Disk, Group, GroupMember, RecoveryPlan, Vm
from sqlalchemy import func, select
from sqlalchemy.orm import Session


def _digest(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def members(s: Session, g: Group) -> set[str]:
    """The names of the group's VMs: whole-VM members and the VMs of its
    member disks."""
    out = set(s.scalars(select(Vm.name).join(GroupMember, GroupMember.vm_id == Vm.id)
                        .where(GroupMember.group_id == g.id)))
    return out | set(s.scalars(select(Vm.name).join(Disk, Disk.vm_id == Vm.id)
                               .join(GroupMember, GroupMember.disk_id == Disk.id)
                               .where(GroupMember.group_id == g.id)))


def storable(what: str, body: Any, code: str) -> None:
    """ApiError 400 unless `body` is text a database stores as it is: no lone
    surrogate (not UTF-8) and no NUL anywhere in it."""
    try:
        text = json.dumps(body, ensure_ascii=False)
        text.encode("utf-8")
    except (UnicodeEncodeError, TypeError, ValueError) as exc:
        raise ApiError(f"{what}: not storable text: {exc}", code=code) from None
    if "\\u0000" in json.dumps(body):
        raise ApiError(f"{what}: a string holds NUL", code=code)


def validate(s: Session, g: Group, body: Any) -> Any:
    """The parsed plan; ApiError 400 when it cannot be used for `g`."""
    from cutpoint.coordinator.dr.plan import PlanError
    from cutpoint.coordinator.dr.plan import RecoveryPlan as Plan

    storable("plan", body, "bad_plan")
    try:
        plan = Plan.parse(body)
    except PlanError as exc:
        raise ApiError(f"plan: {exc}", code="bad_plan") from exc
    known = members(s, g)
    named = [v.vm for bg in plan.boot_groups for v in bg.vms]
    unknown = sorted(set(named) - known) if known else []
    if unknown:
        raise ApiError(f"plan names VM(s) {unknown} that are not members of group {g.name} "
                       f"(its VMs: {sorted(known)})", code="plan_unknown_vm")
    return plan


def put(s: Session, g: Group, body: dict[str, Any], actor: str | None) -> RecoveryPlan:
    validate(s, g, body)
    newest = get(s, g, None, missing_ok=True)
    digest = _digest(body)
    if newest is not None and newest.sha256 == digest:
        return newest
    version = (s.scalar(select(func.max(RecoveryPlan.version))
                        .where(RecoveryPlan.group_id == g.id)) or 0) + 1
    row = RecoveryPlan(group_id=g.id, version=version, body=body, sha256=digest,
                       created_by=actor)
    s.add(row)
    s.commit()
    return row


def get(s: Session, g: Group, version: int | None = None, *,
        missing_ok: bool = False) -> RecoveryPlan | None:
    q = select(RecoveryPlan).where(RecoveryPlan.group_id == g.id)
    q = q.where(RecoveryPlan.version == version) if version is not None else \
        q.order_by(RecoveryPlan.version.desc()).limit(1)
    row = s.scalar(q)
    if row is None and not missing_ok:
        raise NotFound(f"group {g.name} has no recovery plan"
                       + (f" version {version}" if version is not None else ""),
                       code="no_plan")
    return row


def versions(s: Session, g: Group) -> list[RecoveryPlan]:
    return list(s.scalars(select(RecoveryPlan).where(RecoveryPlan.group_id == g.id)
                          .order_by(RecoveryPlan.version.desc())))


def current(s: Session, g: Group) -> tuple[Any, int | None]:
    from cutpoint.coordinator.dr.plan import RecoveryPlan as Plan

    row = get(s, g, None, missing_ok=True)
    return (Plan.parse(row.body), row.version) if row is not None else (None, None)
