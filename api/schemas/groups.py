from __future__ import annotations

import datetime as dt
from typing import Literal

from cutpoint.api.schemas.common import Description, Name, Public, Strict
from cutpoint.api.schemas.policy import PolicyPublic, PolicyUpdate
from pydantic import Field, model_validator


class GroupCreate(Strict):
    name: Name
    description: Description = ""
    policy: PolicyUpdate | None = None


class GroupUpdate(Strict):
    description: Description | None = None
    enabled: bool | None = Field(default=None, description="false stops scheduled snapshots")


class MemberAdd(Strict):
    """Exactly one of `vm` (every disk of the VM) or `disk` ("<vm>/<node>")."""

    vm: str | None = Field(default=None, max_length=128)
    host: str | None = Field(default=None, max_length=64,
                             description="Disambiguates a VM name seen on several hosts")
    disk: str | None = Field(default=None, max_length=200)

    @model_validator(mode="after")
    def _one(self) -> MemberAdd:
        if (self.vm is None) == (self.disk is None):
            raise ValueError("give exactly one of vm or disk")
        return self


class MemberPublic(Public):
    id: int
    kind: Literal["vm", "disk"]
    vm: str
    host: str
    disks: list[str]


class GroupPublic(Public):
    id: int
    name: str
    description: str
    enabled: bool
    version: int
    created_at: dt.datetime
    members: list[MemberPublic]
    policy: PolicyPublic
