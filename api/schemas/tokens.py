from __future__ import annotations

import datetime as dt
from typing import Literal

from cutpoint.api.schemas.common import Name, Public, Strict


class TokenCreate(Strict):
    name: Name
    role: Literal["viewer", "operator", "admin"]


class TokenPublic(Public):
    id: int
    name: str
    role: str
    prefix: str
    created_at: dt.datetime
    last_used_at: dt.datetime | None
    revoked_at: dt.datetime | None


class TokenCreated(TokenPublic):
    token: str
