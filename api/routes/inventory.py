from __future__ import annotations

from cutpoint.api.deps import Cursor, IdPath, Limit, SessionDep, Viewer
from cutpoint.api.models import Disk, Host, Vm
from cutpoint.api.schemas.common import Page
from cutpoint.api.schemas.inventory import DiskPublic, VmPublic
from cutpoint.api.services import inventory
from cutpoint.api.services.common import get_or_404, paginate
from fastapi import APIRouter, Query
from sqlalchemy import select

router = APIRouter(tags=["inventory"])


@router.get("/vms", response_model=Page[VmPublic])
def list_vms(session: SessionDep, _: Viewer, limit: Limit = 50, cursor: Cursor = None,
             host: str | None = Query(default=None, max_length=64)) -> Page[VmPublic]:
    stmt = select(Vm)
    if host is not None:
        stmt = stmt.join(Host, Host.id == Vm.host_id).where(Host.name == host)
    rows, nxt = paginate(session, stmt, Vm.id, limit, cursor)
    return Page(items=[inventory.vm_public(session, v) for v in rows], next_cursor=nxt)


@router.get("/vms/{vm_id}", response_model=VmPublic)
def get_vm(vm_id: IdPath, session: SessionDep, _: Viewer) -> VmPublic:
    return inventory.vm_public(session, get_or_404(session, Vm, vm_id, "vm"))


@router.get("/disks", response_model=Page[DiskPublic])
def list_disks(session: SessionDep, _: Viewer, limit: Limit = 50, cursor: Cursor = None) \
        -> Page[DiskPublic]:
    rows, nxt = paginate(session, select(Disk), Disk.id, limit, cursor)
    return Page(items=[inventory.disk_public(d) for d in rows], next_cursor=nxt)


@router.get("/disks/{disk_id}", response_model=DiskPublic)
def get_disk(disk_id: IdPath, session: SessionDep, _: Viewer) -> DiskPublic:
    return inventory.disk_public(get_or_404(session, Disk, disk_id, "disk"))
