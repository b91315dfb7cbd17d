"""A VM's captured definitions (GET /v1/vms/{id}/definitions)."""

from __future__ import annotations

import datetime as dt

from cutpoint.api.schemas.common import Public
from pydantic import Field


class VmDefinitionPublic(Public):
    vm_id: int
    version: int = Field(description="1, 2, ...: a new version when the definition changes.")
    format: str = Field(description="`libvirt-domain-xml` (the domain's inactive XML) or "
                        "`qmp-start-command` (a raw-QEMU VM's start command).")
    sha256: str
    size_bytes: int
    host: str = Field(description="The host whose agent gave it.")
    uid: str | None = Field(default=None, description="The VM's identity then.")
    captured_at: dt.datetime
    dr_status: str = Field(default="signable", description=(
        "`signable`: the DR rewrite signs it for every site of definition_targets; "
        "`refused`: it does not (see dr_refusals); `not-libvirt`: a start command, "
        "which no agent is sent."))
    dr_refusals: list[str] = Field(default_factory=list, description=(
        "Each element the DR rewrite refuses (vmdef_policy: host files, devices, "
        "passthrough), prefixed `site NAME:` when only that site's allow-list refuses it."))


class VmDefinitionFull(VmDefinitionPublic):
    definition: str = Field(description="As the agent gave it: libvirt's inactive XML "
                            "(never its secure XML: no passwords), or the start command.")
