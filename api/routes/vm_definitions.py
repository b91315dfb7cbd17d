"""GET /v1/vms/{id}/definitions: a VM's captured definitions, for DR."""

from __future__ import annotations

from cutpoint.api.deps import IdPath, SessionDep, SettingsDep, Viewer
from cutpoint.api.errors import NotFound
from cutpoint.api.models import Vm
from cutpoint.api.schemas.vm_definitions import VmDefinitionFull, VmDefinitionPublic
from cutpoint.api.services import vm_definitions
from cutpoint.api.services.common import get_or_404
from fastapi import APIRouter

router = APIRouter(tags=["inventory"])


@router.get("/vms/{vm_id}/definitions", response_model=list[VmDefinitionPublic])
def list_definitions(vm_id: IdPath, session: SessionDep, settings: SettingsDep,
                     _: Viewer) -> list[VmDefinitionPublic]:
    """The versions of the VM's captured definition, oldest first (without
    their text), each with whether the DR rewrite signs it (`dr_status`)."""
    get_or_404(session, Vm, vm_id, "vm")
    return vm_definitions.versions(session, vm_id, settings)


@router.get("/vms/{vm_id}/definitions/{version}", response_model=VmDefinitionFull)
def get_definition(vm_id: IdPath, version: IdPath, session: SessionDep,
                   settings: SettingsDep, _: Viewer) -> VmDefinitionFull:
    """One version of the VM's captured definition, with its text."""
    get_or_404(session, Vm, vm_id, "vm")
    row = vm_definitions.one(session, vm_id, version, settings)
    if row is None:
        raise NotFound(f"vm {vm_id} has no definition version {version}",
                       code="definition_not_found")
    return row
