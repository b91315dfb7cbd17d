"""Which VM row an inventory entry is: a VM keeps its identity across hosts.

An agent reports each VM's `uid` (agent-protocol §4.2): a libvirt
domain's UUID, or the `id =` an operator configured for a raw-QEMU VM.
When a host reports a uid that a row of another host holds, the VM has
moved (migrated, or shut down there and defined here): the row moves with
it, so its disks, its group membership and its snapshot history stay
those of the same VM, and the next group snapshot asks the new host.

Two hosts may report the same uid for a while (a live migration: the
source runs, the destination waits paused; or a domain left defined but
shut off on the old host).  The row moves only when the new report is
the better claim: the old host no longer lists the VM, the old host is
unreachable, or the VM runs (or is paused) here and not there.  Otherwise
the report is a conflict: it is skipped and counted, and the watch
applies that host's next inventory again rather than trusting its
generation, so the move lands once the old host lets go.
"""

from __future__ import annotations

import logging

from cutpoint.api.models import GroupMember, Host, Vm
from sqlalchemy import select
from sqlalchemy.orm import Session

log = logging.getLogger("cutpoint.inventory")

ACTIVE = ("running", "paused")


class Conflict(Exception):
    """The uid is claimed by a VM of another host that still holds it."""


def _better_claim(holder: Vm, state: str) -> bool:
    if not holder.present or holder.host.reachable is False:
        return True
    return state in ACTIVE and holder.state not in ACTIVE


def _free_name(session: Session, host: Host, name: str, keep: Vm) -> None:
    """Make `name` free on `host` for `keep`: a leftover row of that name
    (no longer reported, in no group) is deleted; snapshots keep its names
    (member snapshots copy host/vm/disk and lose only the disk link)."""
    old = session.scalar(select(Vm).where(Vm.host_id == host.id, Vm.name == name))
    if old is None or old.id == keep.id:
        return
    in_group = session.scalar(select(GroupMember.id).where(GroupMember.vm_id == old.id))
    if old.present or in_group is not None or old.uid not in (None, keep.uid):
        raise Conflict(f"{host.name} already has a VM named {name!r} (row {old.id})")
    session.delete(old)
    session.flush()


def resolve(session: Session, host: Host, name: str, uid: str | None, state: str,
            by_name: dict[str, Vm]) -> Vm | None:
    """The row for the VM `name` (`uid`) that `host` reports, moved or
    renamed onto it if needed; None when the host has no row for it yet.
    Raises Conflict when another host's row holds the uid and keeps it."""
    here = by_name.get(name)
    if uid is None:
        return here
    holder = session.scalar(select(Vm).where(Vm.uid == uid))
    if holder is None:
        if here is not None and here.uid not in (None, uid):
            # the domain of that name here was redefined: a new VM
            here.name = f"{name}~{here.id}"
            here.present = False
            session.flush()
            by_name.pop(name, None)
            return None
        return here
    if holder.host_id == host.id:
        if holder.name != name:          # the domain was renamed
            _free_name(session, host, name, holder)
            by_name.pop(holder.name, None)
            holder.name = name
        return holder
    if not _better_claim(holder, state):
        raise Conflict(f"{uid} is also {holder.name} on {holder.host.name} "
                       f"({holder.state}); it stays there until that host lets go")
    _free_name(session, host, name, holder)
    log.info("event=vm_moved uid=%s vm=%s from=%s to=%s", uid, name, holder.host.name,
             host.name)
    by_name.pop(name, None)
    holder.host_id, holder.name = host.id, name
    session.flush()
    session.refresh(holder)
    return holder
