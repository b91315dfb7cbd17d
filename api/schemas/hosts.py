from __future__ import annotations

import datetime as dt
from typing import Annotated

from cutpoint.api.schemas.common import Name, Public, Strict
from pydantic import Field, StringConstraints

Address = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9.:\-\[\]]{1,255}$")]
Fingerprint = Annotated[str, StringConstraints(pattern=r"^([0-9a-fA-F]{2}:?){31}[0-9a-fA-F]{2}$")]


class HostCreate(Strict):
    name: Name
    site: Name = Field(description="Site name")
    address: Address
    port: int = Field(default=7443, ge=1, le=65535)
    cert_fingerprint: Fingerprint = Field(
        description="SHA-256 of the agent certificate (DER), hex, with or without colons. "
        "Required: every connection to the agent checks it on top of the CA, so a "
        "certificate of another host (signed by the same CA) is refused")


class HostUpdate(Strict):
    address: Address | None = None
    port: int | None = Field(default=None, ge=1, le=65535)
    cert_fingerprint: Fingerprint | None = Field(
        default=None, description="A new pin (a re-issued agent certificate); it cannot be "
        "removed: null leaves it as it is")


class HostPublic(Public):
    id: int
    name: str
    site: str
    address: str
    port: int
    cert_fingerprint: str | None
    reachable: bool | None
    last_seen_at: dt.datetime | None
    last_error: str | None
    agent_version: str | None
    cert_not_after: dt.datetime | None = None
    version: int
    created_at: dt.datetime
