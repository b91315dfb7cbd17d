from __future__ import annotations

import datetime as dt
from typing import Any

from cutpoint.api.schemas.common import Public


class JobPublic(Public):
    id: str
    kind: str
    state: str
    progress: float
    message: str
    group_id: int | None
    host_id: int | None
    snapshot_id: int | None
    attempts: int
    error_code: str | None
    error: str | None
    result: dict[str, Any] | None
    created_by: str | None
    created_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None


class JobEventPublic(Public):
    seq: int
    at: dt.datetime
    t_s: float | None
    step: str
    status: str
    detail: dict[str, Any]
