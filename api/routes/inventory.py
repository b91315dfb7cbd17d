from __future__ import annotations

from cutpoint.api.deps import Cursor, IdPath, Limit, SessionDep, Viewer
from cutpoint.api.models import Disk, Vm
from cutpoint.api.schemas.common import Page
from cutpoint.api.schemas.inventory import DiskPublic, VmPublic
from cutpoint.api.services import vms
from cutpoint.api.services.common import get_or_404, paginate
from fastapi import APIRouter, Query
from sqlalchemy import select

router = APIRouter(tags=["inventory"])


@router.get("/vms", response_model=Page[VmPublic])
def list_vms(session: SessionDep, _: Viewer, limit: Limit = 50, cursor: Cursor = None,
             site: str | None = Query(default=None, max_length=64,
                                      description="Only VMs on hosts of this site."),
             host: str | None = Query(default=None, max_length=64,
                                      description="Only VMs on this host."),
             name: str | None = Query(default=None, max_length=128,
                                      description="Only VMs of this name (one per host)."),
             uid: str | None = Query(default=None, max_length=64,
                                     description="The VM of this identity (domain UUID or "
                                     "configured id)."),
             present: bool | None = Query(
                 default=None, description="true: only VMs their host's agent lists now; "
                 "false: only those it no longer lists.")) -> Page[VmPublic]:
    """VMs synced from the agents, filtered by `site`, `host`, `name`, `uid`, `present`.

    Each with its site, host, state, `stale`, identity (`uid`, `identity`), disks, `groups` and
    `last_snapshot`; see docs/api.md, VMs."""
    stmt = vms.query(site=site, host=host, name=name, uid=uid, present=present)
    rows, nxt = paginate(session, stmt, Vm.id, limit, cursor)
    return Page(items=[vms.vm_public(session, v) for v in rows], next_cursor=nxt)


@router.get("/vms/{vm_id}", response_model=VmPublic)
def get_vm(vm_id: IdPath, session: SessionDep, _: Viewer) -> VmPublic:
    """One VM as the agents last reported it."""
    return vms.vm_public(session, get_or_404(session, Vm, vm_id, "vm"))


@router.get("/disks", response_model=Page[DiskPublic])
def list_disks(session: SessionDep, _: Viewer, limit: Limit = 50, cursor: Cursor = None) \
        -> Page[DiskPublic]:
    """Disks synced from the agents; `key` is the agent's disk id `<vm>/<node>`."""
    rows, nxt = paginate(session, select(Disk), Disk.id, limit, cursor)
    return Page(items=[vms.disk_public(d) for d in rows], next_cursor=nxt)


@router.get("/disks/{disk_id}", response_model=DiskPublic)
def get_disk(disk_id: IdPath, session: SessionDep, _: Viewer) -> DiskPublic:
    """One disk as the agents last reported it."""
    return vms.disk_public(get_or_404(session, Disk, disk_id, "disk"))
