from __future__ import annotations

from cutpoint.api.errors import ApiError, Conflict, NotFound
from cutpoint.api.models import (
    IN_FLIGHT,
    Disk,
    Group,
    GroupDisk,
    GroupMember,
    GroupSnapshot,
    Host,
    Policy,
    Quiesce,
    Vm,
)
from cutpoint.api.schemas.groups import (
    GroupCreate,
    GroupPublic,
    GroupUpdate,
    MemberAdd,
    MemberPublic,
)
from cutpoint.api.schemas.policy import PolicyPublic, PolicyUpdate
from cutpoint.api.services import sites
from cutpoint.api.services.common import (
    check_if_match,
    etag,
    get_by_name_or_404,
    get_or_404,
)
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session


def group_etag(g: Group) -> str:
    return etag("group", g.id, g.version)


def policy_etag(p: Policy) -> str:
    return etag("policy", p.group_id, p.version)


def by_name(session: Session, name: str) -> Group:
    return get_by_name_or_404(session, Group, name, "group")


def resolve(session: Session, ident: str) -> Group:
    """A group by id or by name (paths accept both)."""
    if ident.isdigit() and len(ident) < 18:
        g = session.get(Group, int(ident))
        if g is not None:
            return g
    return by_name(session, ident)


def policy_public(p: Policy) -> PolicyPublic:
    return PolicyPublic(rpo_seconds=p.rpo_seconds, keep_last=p.keep_last,
                        keep_within=p.keep_within_seconds, pause_budget_ms=p.pause_budget_ms,
                        lease_ms=p.lease_ms,
                        replication_target=p.replication_target.name if p.replication_target
                        else None, quiesce=p.quiesce.value, drill_every=p.drill_every_seconds,
                        version=p.version)


def member_public(session: Session, m: GroupMember) -> MemberPublic:
    keys = list(session.scalars(select(Disk.key).join(GroupDisk, GroupDisk.disk_id == Disk.id)
                                .where(GroupDisk.member_id == m.id).order_by(Disk.key)))
    vm = m.vm if m.vm is not None else m.disk.vm  # type: ignore[union-attr]
    return MemberPublic(id=m.id, kind="vm" if m.vm_id else "disk", vm=vm.name,
                        host=vm.host.name, disks=keys)


def public(session: Session, g: Group) -> GroupPublic:
    return GroupPublic(id=g.id, name=g.name, description=g.description, enabled=g.enabled,
                       version=g.version, created_at=g.created_at,
                       members=[member_public(session, m) for m in g.members],
                       policy=policy_public(g.policy))


def _apply_policy(session: Session, p: Policy, data: PolicyUpdate) -> None:
    if data.clear_rpo:
        p.rpo_seconds = None
    elif data.rpo_seconds is not None:
        p.rpo_seconds = data.rpo_seconds
    if data.keep_last is not None:
        p.keep_last = data.keep_last
    if data.keep_within is not None:
        p.keep_within_seconds = data.keep_within
    if data.pause_budget_ms is not None:
        p.pause_budget_ms = data.pause_budget_ms
    if data.lease_ms is not None:
        p.lease_ms = data.lease_ms
    if data.quiesce is not None:
        p.quiesce = Quiesce(data.quiesce)
    if data.replication_target is not None:
        p.replication_target_id = sites.by_name(session, data.replication_target).id
    if data.clear_drill:
        p.drill_every_seconds = None
    elif data.drill_every is not None:
        p.drill_every_seconds = data.drill_every
    if p.lease_ms <= 1:
        raise ApiError("lease_ms must be above 1", code="bad_policy")


def create(session: Session, data: GroupCreate) -> Group:
    if session.scalar(select(Group.id).where(Group.name == data.name)) is not None:
        raise Conflict(f"group {data.name!r} already exists", code="group_exists")
    g = Group(name=data.name, description=data.description)
    g.policy = Policy()
    session.add(g)
    try:
        session.flush()
        if data.policy is not None:
            _apply_policy(session, g.policy, data.policy)
        session.commit()
    except IntegrityError:
        session.rollback()
        raise Conflict(f"group {data.name!r} already exists", code="group_exists") from None
    except BaseException:
        session.rollback()
        raise
    return g


def update(session: Session, g: Group, data: GroupUpdate, if_match: str | None) -> Group:
    check_if_match(if_match, group_etag(g))
    if data.description is not None:
        g.description = data.description
    if data.enabled is not None:
        g.enabled = data.enabled
    g.version += 1
    session.commit()
    return g


def set_policy(session: Session, g: Group, data: PolicyUpdate, if_match: str | None) -> Policy:
    check_if_match(if_match, policy_etag(g.policy))
    _apply_policy(session, g.policy, data)
    g.policy.version += 1
    session.commit()
    return g.policy


def delete(session: Session, g: Group, if_match: str | None) -> None:
    check_if_match(if_match, group_etag(g))
    busy = session.scalar(select(func.count()).select_from(GroupSnapshot).where(
        GroupSnapshot.group_id == g.id, GroupSnapshot.state.in_(IN_FLIGHT)))
    if busy:
        raise Conflict(f"group {g.name!r} has a snapshot in flight", code="snapshot_in_flight")
    session.delete(g)
    session.commit()


def _find_vm(session: Session, g: Group, name: str, host: str | None) -> Vm:
    stmt = select(Vm).join(Host, Host.id == Vm.host_id).where(Vm.name == name)
    if host is not None:
        stmt = stmt.where(Host.name == host)
    vms = list(session.scalars(stmt).unique())
    if not vms:
        raise NotFound(f"VM {name!r} is not in any synced inventory", code="vm_not_found")
    target = g.policy.replication_target_id if g.policy else None
    if len(vms) > 1 and target is not None:
        # A DR host's agent lists the group's VMs again, as the standbys it
        # boots on failover; the member is the copy outside the DR site.
        vms = [v for v in vms if v.host.site_id != target] or vms
    if len(vms) > 1:
        raise Conflict(f"VM {name!r} exists on several hosts; give host", code="vm_ambiguous")
    return vms[0]


def add_member(session: Session, g: Group, data: MemberAdd) -> GroupMember:
    if data.vm is not None:
        vm = _find_vm(session, g, data.vm, data.host)
        disks = [d for d in vm.disks if d.present]
        if not disks:
            raise Conflict(f"VM {vm.name!r} has no disks", code="vm_has_no_disks")
        member = GroupMember(group_id=g.id, vm_id=vm.id)
    else:
        assert data.disk is not None
        vm_name, _, node = data.disk.partition("/")
        vm = _find_vm(session, g, vm_name, data.host)
        disk = next((d for d in vm.disks if d.node == node), None)
        if disk is None:
            raise NotFound(f"disk {data.disk!r} does not exist", code="disk_not_found")
        disks = [disk]
        member = GroupMember(group_id=g.id, disk_id=disk.id)
    owners = session.execute(
        select(Disk.key, Group.name).join(GroupDisk, GroupDisk.disk_id == Disk.id)
        .join(Group, Group.id == GroupDisk.group_id)
        .where(Disk.id.in_([d.id for d in disks]))).all()
    if owners:
        desc = ", ".join(f"{k} in {n}" for k, n in owners)
        raise Conflict(f"a disk belongs to at most one group: {desc}",
                       code="disk_in_other_group")
    session.add(member)
    try:
        session.flush()
        for d in disks:
            session.add(GroupDisk(disk_id=d.id, group_id=g.id, member_id=member.id))
        g.version += 1
        session.commit()
    except IntegrityError:
        session.rollback()
        raise Conflict("a disk belongs to at most one group (concurrent add)",
                       code="disk_in_other_group") from None
    return member


def remove_member(session: Session, g: Group, member_id: int) -> None:
    m = get_or_404(session, GroupMember, member_id, "member")
    if m.group_id != g.id:
        raise NotFound(f"member {member_id} is not in group {g.name!r}", code="member_not_found")
    session.delete(m)
    g.version += 1
    session.commit()
