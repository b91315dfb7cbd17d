"""VMs and disks mirror agent inventories (agent-protocol `inventory`);
the views of them: services/vms.py; which row a reported VM is:
services/vm_identity.py."""

from __future__ import annotations

import datetime as dt
from typing import Any

from cutpoint.api.models import Disk, GroupDisk, GroupMember, Host, Vm, utcnow
from cutpoint.api.services import vm_identity
from sqlalchemy import select
from sqlalchemy.orm import Session


def apply(session: Session, host: Host, inventory: dict[str, Any],
          now: dt.datetime | None = None) -> dict[str, int]:
    """Upsert the host's VMs and disks from one `inventory` reply; commit.

    VMs and disks the agent no longer reports are kept (snapshots refer to
    them) but marked present=false.  New disks of a VM that is a whole-VM
    group member join that group, unless another group already has them.
    A VM whose `uid` another host's row holds is that row, moved here
    (vm_identity); `conflicts` counts the reports left for a later sync.
    """
    now = now or utcnow()
    vms = {v.name: v for v in session.scalars(select(Vm).where(Vm.host_id == host.id))}
    had = {v.id for v in vms.values()}
    seen: set[int] = set()
    counts = {"vms": 0, "disks": 0, "added_to_groups": 0, "moved": 0, "conflicts": 0}
    for item in inventory.get("vms", []):
        name = str(item["name"])[:128]
        uid = str(item["uid"])[:64] if item.get("uid") else None
        state = str(item.get("state", "unknown"))[:16]
        try:
            vm = vm_identity.resolve(session, host, name, uid, state, vms)
        except vm_identity.Conflict as exc:
            vm_identity.log.warning("event=vm_identity_conflict host=%s vm=%s why=%s",
                                    host.name, name, exc)
            counts["conflicts"] += 1
            continue
        if vm is None:
            vm = Vm(host_id=host.id, name=name)
            session.add(vm)
            session.flush()
        elif vm.id not in had:
            counts["moved"] += 1
        vms[name] = vm
        seen.add(vm.id)
        vm.uid = uid or vm.uid
        vm.driver = str(item.get("driver", "qemu"))[:32]
        vm.state = state
        vm.present = True
        vm.stale = bool(item.get("stale", False))
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
            disk.key = f"{name}/{node}"          # the VM may have been renamed
            disk.backend = str(dd.get("backend", "unknown"))[:16]
            disk.pool, disk.image, disk.file = dd.get("pool"), dd.get("image"), dd.get("file")
            size = dd.get("size")
            disk.size_bytes = size if isinstance(size, int) and size > 0 else disk.size_bytes
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
    for vm in vms.values():
        if vm.id not in seen and vm.host_id == host.id:
            vm.present = False
    host.inventory_stale = bool(inventory.get("stale", False))
    host.reachable = True
    host.last_seen_at = now
    host.last_error = None
    session.commit()
    return counts
