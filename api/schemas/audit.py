from __future__ import annotations

import datetime as dt
from typing import Any

from cutpoint.api.schemas.common import Public


class AuditPublic(Public):
    id: int
    at: dt.datetime
    actor: str | None
    role: str | None
    method: str
    path: str
    status: int
    request_id: str
    remote: str | None
    detail: dict[str, Any] | None
