from __future__ import annotations

import datetime as dt

from cutpoint.api.schemas.common import Public


class RpoMissPublic(Public):
    id: int
    group: str
    at: dt.datetime
    reason: str
    detail: str
    achieved_rpo_s: float | None
    rpo_seconds: int
    snapshot_id: int | None


class RpoStatus(Public):
    group: str
    rpo_seconds: int | None
    achieved_rpo_s: float | None
    compliant: bool | None
    newest_recovery_point: dt.datetime | None
    next_due_at: dt.datetime | None
    replication_lag_s: float
    in_flight: bool
    misses: int
    last_miss: RpoMissPublic | None
