from __future__ import annotations

from typing import Literal

from cutpoint.api.schemas.common import Name, Public, Strict
from pydantic import Field


class PolicyUpdate(Strict):
    """Fields left out keep their value."""

    rpo_seconds: int | None = Field(default=None, ge=1, le=31_536_000,
                                    description="Target RPO; unset means no schedule")
    keep_last: int | None = Field(default=None, ge=1, le=100_000)
    keep_within: int | None = Field(default=None, ge=0, le=31_536_000,
                                    description="Keep every snapshot younger than this (s)")
    pause_budget_ms: int | None = Field(default=None, ge=1, le=600_000)
    lease_ms: int | None = Field(default=None, ge=100, le=600_000)
    replication_target: Name | None = Field(default=None, description="Site name")
    quiesce: Literal["crash", "fs-freeze"] | None = None
    clear_rpo: bool = Field(default=False, description="true removes the schedule")
    drill_every: int | None = Field(
        default=None, ge=60, le=31_536_000,
        description="Run a drill of the newest DR recovery point this often (s), e.g. 604800 "
        "for weekly; needs a replication target and a booter that can boot drills")
    clear_drill: bool = Field(default=False, description="true removes the drill schedule")


class PolicyPublic(Public):
    rpo_seconds: int | None
    keep_last: int
    keep_within: int
    pause_budget_ms: int
    lease_ms: int
    replication_target: str | None
    quiesce: str
    drill_every: int | None = None
    version: int
