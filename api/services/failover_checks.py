"""A failover's preconditions, from the control plane's own records.

    plan = members(s, g, snap)                     # VMs, DR images, the target
    checks = run(s, settings, g, plan, snap, job_id=None)
    raise_if_failed(checks)                        # the 409/503 problem

`run` gathers what each check of `cutpoint.coordinator.dr.preconditions`
needs from the database (the recovery point's verification, the DR host
whose inventory lists the VMs, the fencing state) and asks the DR site's
Ceph cluster and agents, each within `failover_check_timeout_s`.  The route
runs it before it creates the job, so a failover that cannot succeed is
refused at the request with every primary VM still running; the job runs it
again before it touches anything (what held at the request may not now).

Without a chosen recovery point (planned mode, "latest") the recovery point
check is skipped here: the job checks its own final snapshot, once it is
replicated and before any primary VM stops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cutpoint.api.errors import ApiError, Conflict
from cutpoint.api.models import Disk, Group, GroupDisk, GroupSnapshot
from cutpoint.coordinator.dr import preconditions as pre
from sqlalchemy import select
from sqlalchemy.orm import Session


class PreconditionNotMet(ApiError):
    status, code, title = 409, "precondition_not_met", "Failover precondition not met"


@dataclass
class Plan:
    """What a failover of group `group` to `target` moves: VMs and their disks."""

    group: str
    target: str
    source: str  # the site the members run at now (the primary)
    vms: dict[str, list[tuple[str, str, str]]]  # vm -> [(node, logical pool, image)]
    hosts: dict[str, list[str]]  # primary host -> its member VMs

    @property
    def images(self) -> list[tuple[str, str]]:
        return [(pool, image) for disks in self.vms.values() for _, pool, image in disks]

    @property
    def pools(self) -> list[str]:
        return sorted({pool for pool, _ in self.images})


def target_of(g: Group) -> str:
    tgt = g.policy.replication_target if g.policy else None
    if tgt is None:
        raise Conflict(f"group {g.name!r} has no replication target: nothing to fail over to",
                       code="no_target")
    return str(tgt.name)


def members(s: Session, g: Group, snap: GroupSnapshot | None) -> Plan:
    """The VMs and DR images of the recovery point `snap`, or of the group's
    disks now (no recovery point chosen yet)."""
    target = target_of(g)
    vms: dict[str, list[tuple[str, str, str]]] = {}
    hosts: dict[str, set[str]] = {}
    sources: set[str] = set()
    if snap is not None:
        rows = [(m.vm, m.host, s.get(Disk, m.disk_id) if m.disk_id else None, m.disk)
                for m in snap.members]
    else:
        rows = [(gd.disk.vm.name, gd.disk.vm.host.name, gd.disk, gd.disk.key)
                for gd in s.scalars(select(GroupDisk).where(GroupDisk.group_id == g.id))]
    for vm, host, disk, key in rows:
        if disk is None or disk.backend != "rbd" or not disk.image:
            raise Conflict(f"member {key} is not an RBD disk: it has no DR copy",
                           code="not_replicable")
        vms.setdefault(vm, []).append((disk.node, disk.pool or "rbd", disk.image))
        hosts.setdefault(host, set()).add(vm)
        sources.add(disk.vm.host.site.name)
    if not vms:
        raise Conflict(f"group {g.name!r} has no member disks", code="no_members")
    if len(sources) > 1:
        raise Conflict(f"group {g.name!r} has members at several sites {sorted(sources)}",
                       code="mixed_sites")
    return Plan(g.name, target, sources.pop(), {v: sorted(d) for v, d in sorted(vms.items())},
                {h: sorted(v) for h, v in sorted(hosts.items())})


def boot_request(s: Session, settings: Any, plan: Plan, tag: str, workload: str = "none",
                 site: Any = None) -> Any:
    """The BootRequest of the plan's VMs at the target, with the agent that
    starts each (the target's registered host whose inventory lists it).
    `site`: the target's CephSite; None for a preflight, which reads no image."""
    from cutpoint.api.services.failover import dr_agent_for
    from cutpoint.api.services.failover_signed import signed_starts
    from cutpoint.coordinator.dr.boot import (
        FAILOVER,
        AgentRef,
        BootDisk,
        BootRequest,
        BootVM,
    )

    vms = [BootVM(vm, tuple(BootDisk(node, image, pool) for node, pool, image in disks))
           for vm, disks in plan.vms.items()]
    found = dr_agent_for(s, settings, plan.target, list(plan.vms))
    agents = {v.name: AgentRef(*found["agents"][v.name]) for v in vms
              if v.name in found.get("agents", {})}
    # A VM no DR agent defines: its captured definition, signed (failover_signed.py)
    unlisted = {v: d for v, d in plan.vms.items() if v not in agents}
    from cutpoint.api.services import plans

    g = s.scalar(select(Group).where(Group.name == plan.group))
    rplan, _ = plans.current(s, g) if g is not None else (None, None)
    more, specs, _ = signed_starts(s, settings, plan.target, plan.source, unlisted,
                                   rplan.failover_networks if rplan else None) \
        if found else ({}, {}, {})
    agents |= {v: AgentRef(*ref) for v, ref in more.items()}
    tls = (str(settings.agent_ca), str(settings.agent_cert), str(settings.agent_key)) \
        if settings.agent_ca and settings.agent_cert and settings.agent_key else None
    return BootRequest(FAILOVER, site, vms, tag, workload=workload, agents=agents,
                       specs=specs, tls=tls,
                       check_timeout_s=float(settings.failover_check_timeout_s))


@dataclass(frozen=True)
class RecoveryPoint:
    txn: str
    name: str  # the member snapshots' name, cp.<group>.<txn>
    verified: bool

    @classmethod
    def of(cls, g: Group, snap: GroupSnapshot) -> RecoveryPoint:
        name = snap.members[0].name if snap.members else f"cp.{g.name}.{snap.txn}"
        return cls(snap.txn, name, snap.dr_verified_at is not None)


@dataclass
class Inputs:
    """What the checks that ask other systems need, read from the database
    first: they then run with no transaction open (on SQLite a transaction
    holds the database's write lock, and a DR site that does not answer
    takes the whole check deadline)."""

    plan: Plan
    rp: RecoveryPoint | None
    site: Any  # CephSite, or None (why_none says why)
    why_none: str
    boot: Any  # BootRequest of the plan's VMs, with their DR agent


def gather(s: Session, settings: Any, g: Group, plan: Plan,
           snap: GroupSnapshot | None) -> Inputs:
    from cutpoint.api.services import sites

    try:
        site = sites.ceph_site(s, plan.target,
                               timeout_s=int(settings.failover_check_timeout_s))
        why = ""
    except ApiError as exc:  # not registered, no Ceph access, or one that cannot work
        site, why = None, f"{exc.detail} ({exc.code})"
    return Inputs(plan, RecoveryPoint.of(g, snap) if snap is not None else None, site, why,
                  boot_request(s, settings, plan, "preflight"))


def external(settings: Any, inp: Inputs, *, agents: bool = True) -> list[pre.Check]:
    """The checks that ask the DR site: its Ceph cluster, the recovery point
    there, its agents (unless `agents` is false).  No database access."""
    from cutpoint.coordinator.dr.boot import UnknownBooter, load_booter
    from cutpoint.coordinator.dr.site import CephConnection

    plan = inp.plan
    checks: list[pre.Check] = []
    ceph = CephConnection(inp.site) if inp.site is not None else None
    try:
        checks.append(pre.dr_site_reachable(ceph, plan.target, plan.pools, inp.why_none))
        if inp.rp is None:
            checks.append(pre.skipped("recovery_point_at_dr", "planned: checked on the final "
                                      "snapshot once it is replicated, before any primary "
                                      "VM stops"))
        elif ceph is None or not checks[0].ok:
            checks.append(pre.skipped("recovery_point_at_dr", "the DR site is not reachable"))
        else:
            checks.append(pre.recovery_point_at_dr(ceph, inp.rp.txn, inp.rp.name,
                                                   verified=inp.rp.verified,
                                                   images=plan.images))
    finally:
        if ceph is not None:
            ceph.close()
    if not agents:
        return checks
    try:
        booter = load_booter(settings.booter)
    except UnknownBooter as exc:
        checks.append(pre.Check("dr_agents_ready", pre.FAIL, "unknown_booter", str(exc)))
    else:
        checks.append(pre.dr_agents_ready(booter, inp.boot))
    return checks


def run(s: Session, settings: Any, g: Group, plan: Plan,
        snap: GroupSnapshot | None, job_id: str | None = None) -> list[pre.Check]:
    """Every precondition, in order; nothing is written anywhere.  Ends the
    session's transaction before asking the DR site (see Inputs).  `job_id`:
    the failover job asking (its own epoch, from an attempt whose worker
    died, is its to reuse)."""
    from cutpoint.api.services import fencing

    g_id = g.id
    inp = gather(s, settings, g, plan, snap)
    s.rollback()
    checks = external(settings, inp)
    st = fencing.state(s, g_id)
    checks.append(pre.fencing_epoch_available(
        st, plan.target, lambda n: fencing.reserve(s, g_id, n, plan.target, plan.source),
        job_id))
    s.rollback()
    return checks


def recovery_point(settings: Any, inp: Inputs) -> pre.Check:
    """The recovery point check alone (the job's, on its own final snapshot),
    the DR site's reachability first; no database access."""
    checks = external(settings, inp, agents=False)
    return next((c for c in checks if c.status == pre.FAIL), checks[1])


def raise_if_failed(checks: list[pre.Check]) -> None:
    """The first failed check as a problem: 503 when something did not answer,
    409 for a state; `precondition` names it, `checks` holds them all."""
    failed = pre.first_failure(checks)
    if failed is None:
        return
    raise PreconditionNotMet(
        f"{failed.name}: {failed.message}. Nothing was stopped or changed: every primary "
        "VM still runs.", code=failed.code or "precondition_not_met",
        status=503 if failed.unavailable else 409,
        extra={"precondition": failed.name, "checks": [c.as_dict() for c in checks]})
