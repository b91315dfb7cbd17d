from __future__ import annotations

import datetime as dt
from typing import Literal

from cutpoint.api.schemas.common import Public
from pydantic import Field


class RpoMissPublic(Public):
    id: int
    group: str
    at: dt.datetime
    reason: str
    detail: str
    achieved_rpo_s: float | None
    rpo_seconds: int
    snapshot_id: int | None


class DrillStatus(Public):
    every_s: int | None = Field(description="The policy's drill schedule; null: none.")
    result: Literal["passed", "failed", "overdue", "running", "none"] = Field(
        description="running: a drill is queued or running; overdue: a schedule is set and "
        "no drill passed within its period; else the last finished drill's verdict.")
    last_job_id: str | None
    last_finished_at: dt.datetime | None
    last_success_at: dt.datetime | None
    running_job_id: str | None
    next_due_at: dt.datetime | None = Field(
        description="When the schedule asks for the next drill.")


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
    drill: DrillStatus | None = None
