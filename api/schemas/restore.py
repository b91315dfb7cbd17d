"""Request bodies of the restore endpoints."""

from __future__ import annotations

from typing import Annotated

from cutpoint.api.schemas.common import Strict
from cutpoint.api.schemas.dr import RecoveryRef
from pydantic import Field, StringConstraints

SiteName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
ImageName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]
DiskKey = Annotated[str, StringConstraints(pattern=r"^[^/\s]{1,128}/[^/\s]{1,64}$")]
Suffix = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]


class RestoreInPlaceRequest(Strict):
    snapshot: RecoveryRef = Field(description="Group snapshot id, txn, or `latest`")
    site: SiteName | None = Field(default=None, description="Where to restore: the group's "
                                  "primary (default) or its DR site")


class RestoreCloneRequest(RestoreInPlaceRequest):
    suffix: Suffix | None = Field(default=None, description="Clone names are "
                                  "`<image>-<suffix>` (default `restore-<snapshot id>`)")
    names: dict[DiskKey, ImageName] | None = Field(
        default=None, max_length=256,
        description="Clone name per member disk (`<vm>/<node>`); the others are derived")
