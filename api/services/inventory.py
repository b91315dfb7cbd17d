"""VMs and disks mirror agent inventories (agent-protocol `inventory`)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from cutpoint.api.models import Disk, Group, GroupDisk, GroupMember, Host, Vm, utcnow
from cutpoint.api.schemas.inventory import DiskPublic, VmPublic
from sqlalchemy import select
from sqlalchemy.orm import Session


def disk_public(d: Disk, group: str | None = None) -> DiskPublic:
    return DiskPublic(id=d.id, vm_id=d.vm_id, vm=d.vm.name, host=d.vm.host.name, node=d.node,
                      key=d.key, backend=d.backend, pool=d.pool, image=d.image, file=d.file,
                      present=d.present, group=group)


def vm_public(session: Session, vm: Vm) -> VmPublic:
    groups: dict[int, str] = dict(session.execute(
        select(GroupDisk.disk_id, Group.name).join(Group, Group.id == GroupDisk.group_id)
        .where(GroupDisk.disk_id.in_([d.id for d in vm.disks]))).all())
    return VmPublic(id=vm.id, name=vm.name, host=vm.host.name, driver=vm.driver, state=vm.state,
                    present=vm.present, synced_at=vm.synced_at,
                    disks=[disk_public(d, groups.get(d.id)) for d in vm.disks])


def apply(session: Session, host: Host, inventory: dict[str, Any],
          now: dt.datetime | None = None) -> dict[str, int]:
    """Upsert the host's VMs and disks from one `inventory` reply; commit.

    VMs and disks the agent no longer reports are kept (snapshots refer to
    them) but marked present=false.  New disks of a VM that is a whole-VM
    group member join that group, unless another group already has them.
    """
    now = now or utcnow()
    vms = {v.name: v for v in session.scalars(select(Vm).where(Vm.host_id == host.id))}
    seen: set[str] = set()
    counts = {"vms": 0, "disks": 0, "added_to_groups": 0}
    for item in inventory.get("vms", []):
        name = str(item["name"])
        seen.add(name)
        vm = vms.get(name)
        if vm is None:
            vm = Vm(host_id=host.id, name=name)
            session.add(vm)
            session.flush()
            vms[name] = vm
        vm.driver = str(item.get("driver", "qemu"))[:32]
        vm.state = str(item.get("state", "unknown"))[:16]
        vm.present = True
        vm.synced_at = now
        counts["vms"] += 1
        disks = {d.node: d for d in session.scalars(select(Disk).where(Disk.vm_id == vm.id))}
        seen_nodes: set[str] = set()
        for dd in item.get("disks", []):
            node = str(dd["node"])
            seen_nodes.add(node)
            disk = disks.get(node)
            if disk is None:
                disk = Disk(vm_id=vm.id, node=node, key=f"{name}/{node}", backend="unknown")
                session.add(disk)
                disks[node] = disk
            disk.backend = str(dd.get("backend", "unknown"))[:16]
            disk.pool, disk.image, disk.file = dd.get("pool"), dd.get("image"), dd.get("file")
            disk.present = True
            counts["disks"] += 1
        for node, disk in disks.items():
            if node not in seen_nodes:
                disk.present = False
        session.flush()
        member = session.scalar(select(GroupMember).where(GroupMember.vm_id == vm.id))
        if member is not None:
            taken = set(session.scalars(select(GroupDisk.disk_id).where(
                GroupDisk.disk_id.in_([d.id for d in disks.values()]))))
            for disk in disks.values():
                if disk.id not in taken and disk.present:
                    session.add(GroupDisk(disk_id=disk.id, group_id=member.group_id,
                                          member_id=member.id))
                    counts["added_to_groups"] += 1
    for name, vm in vms.items():
        if name not in seen:
            vm.present = False
    host.reachable = True
    host.last_seen_at = now
    host.last_error = None
    session.commit()
    return counts
