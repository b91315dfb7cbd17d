"""What the API shows of VMs and disks: place, state, identity, disks,
group membership and the newest committed snapshot of each VM."""

from __future__ import annotations

from cutpoint.api.models import (
    Disk,
    Group,
    GroupDisk,
    GroupMember,
    GroupSnapshot,
    Host,
    MemberSnapshot,
    Site,
    SnapState,
    Vm,
)
from cutpoint.api.schemas.inventory import DiskPublic, LastSnapshot, VmPublic
from sqlalchemy import Select, select
from sqlalchemy.orm import Session


def disk_public(d: Disk, group: str | None = None) -> DiskPublic:
    return DiskPublic(id=d.id, vm_id=d.vm_id, vm=d.vm.name, host=d.vm.host.name, node=d.node,
                      key=d.key, backend=d.backend, pool=d.pool, image=d.image, file=d.file,
                      size_bytes=d.size_bytes, present=d.present, group=group)


def _identity(vm: Vm) -> str:
    if vm.uid is None:
        return "host-name"
    return "libvirt-uuid" if vm.driver == "libvirt" else "configured-id"


def _last_snapshot(session: Session, disk_ids: list[int]) -> LastSnapshot | None:
    if not disk_ids:
        return None
    row = session.execute(
        select(GroupSnapshot, Group.name).join(Group, Group.id == GroupSnapshot.group_id)
        .where(GroupSnapshot.state == SnapState.committed,
               GroupSnapshot.id.in_(select(MemberSnapshot.group_snapshot_id)
                                    .where(MemberSnapshot.disk_id.in_(disk_ids))))
        .order_by(GroupSnapshot.id.desc()).limit(1)).first()
    if row is None:
        return None
    gs, group = row
    return LastSnapshot(id=gs.id, txn=gs.txn, group=group, cut_at=gs.cut_at,
                        finished_at=gs.finished_at, consistency=gs.consistency,
                        dr_verified_at=gs.dr_verified_at)


def vm_public(session: Session, vm: Vm) -> VmPublic:
    disk_ids = [d.id for d in vm.disks]
    by_disk: dict[int, str] = dict(session.execute(
        select(GroupDisk.disk_id, Group.name).join(Group, Group.id == GroupDisk.group_id)
        .where(GroupDisk.disk_id.in_(disk_ids))).all())
    member = session.scalar(select(Group.name).join(GroupMember, GroupMember.group_id == Group.id)
                            .where(GroupMember.vm_id == vm.id))
    groups = sorted(set(by_disk.values()) | ({member} if member else set()))
    return VmPublic(id=vm.id, name=vm.name, uid=vm.uid, identity=_identity(vm),
                    host=vm.host.name, site=vm.host.site.name, driver=vm.driver,
                    state=vm.state, present=vm.present, stale=vm.stale,
                    synced_at=vm.synced_at, groups=groups,
                    last_snapshot=_last_snapshot(session, disk_ids),
                    disks=[disk_public(d, by_disk.get(d.id)) for d in vm.disks])


def query(*, site: str | None = None, host: str | None = None, name: str | None = None,
          uid: str | None = None, present: bool | None = None) -> Select[tuple[Vm]]:
    """VMs, filtered by the site or host they are on, name, uid, presence."""
    stmt = select(Vm)
    if site is not None or host is not None:
        stmt = stmt.join(Host, Host.id == Vm.host_id)
    if site is not None:
        stmt = stmt.join(Site, Site.id == Host.site_id).where(Site.name == site)
    if host is not None:
        stmt = stmt.where(Host.name == host)
    if name is not None:
        stmt = stmt.where(Vm.name == name)
    if uid is not None:
        stmt = stmt.where(Vm.uid == uid)
    if present is not None:
        stmt = stmt.where(Vm.present == present)
    return stmt
