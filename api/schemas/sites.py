from __future__ import annotations

import datetime as dt

from cutpoint.api.schemas.common import Description, Name, Public, Strict


class SiteCreate(Strict):
    name: Name
    description: Description = ""


class SiteUpdate(Strict):
    description: Description | None = None


class SitePublic(Public):
    id: int
    name: str
    description: str
    version: int
    created_at: dt.datetime
