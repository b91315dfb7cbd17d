"""The console's inventory pages (GET): hosts by site with their agent's
standing (reachable, last seen, certificate expiry, stale inventory), the
VMs the agents report (filtered by site or host), and one VM (identity,
disks, groups, newest snapshot).  Viewer role, as GET /v1/hosts and
GET /v1/vms; read through the same services.
"""

from __future__ import annotations

from typing import Annotated

from cutpoint.api.console import auth, views_inventory
from cutpoint.api.console.render import ConsoleRoute, page
from cutpoint.api.deps import SessionDep
from cutpoint.api.models import Role, Vm
from cutpoint.api.services import vms
from cutpoint.api.services.common import get_or_404
from fastapi import APIRouter, Path, Query, Request, Response

router = APIRouter(prefix="/console", route_class=ConsoleRoute, include_in_schema=False)
NameFilter = Annotated[str | None, Query(max_length=64)]


@router.get("/hosts")
def host_list(request: Request, session: SessionDep, user: auth.User) -> Response:
    user.need(Role.viewer)
    return page(request, "hosts.html", {"hosts": views_inventory.host_rows(session),
                                        "warn_days": views_inventory.CERT_WARN_DAYS})


@router.get("/vms")
def vm_list(request: Request, session: SessionDep, user: auth.User,
            site: NameFilter = None, host: NameFilter = None) -> Response:
    user.need(Role.viewer)
    return page(request, "vms.html", {"vms": views_inventory.vm_rows(session, site, host),
                                      "site": site, "host": host,
                                      "limit": views_inventory.VMS_SHOWN})


@router.get("/vms/{vm_id}")
def vm_detail(request: Request, vm_id: Annotated[int, Path(ge=1, le=2**62)],
              session: SessionDep, user: auth.User) -> Response:
    user.need(Role.viewer)
    vm = vms.vm_public(session, get_or_404(session, Vm, vm_id, "vm"))
    return page(request, "vm.html", {"vm": vm.model_dump()})
