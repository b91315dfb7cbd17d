from __future__ import annotations

from typing import Any

from cutpoint.api.schemas.common import Public, Strict
from pydantic import Field


class OrphanVerdict(Public):
    """One snapshot an agent listed, and what the sweeper makes of it."""

    host: str
    disk: str
    name: str
    id: int | None
    owner: str | None = Field(description="the txn of its cutpoint.snap.<id> key; null: none")
    created: int | None = Field(description="creation time, Unix seconds")
    action: str = Field(description="delete or keep")
    reason: str = Field(description="a stable code: orphan, not_cutpoints, committed, "
                                    "in_doubt, in_flight, too_young, ...")
    detail: str


class OrphanPlan(Public):
    """A dry run of the sweeper: every listed RBD snapshot with its verdict."""

    dry_run: bool
    grace_s: float
    hosts: int
    disks: int
    snapshots: int
    orphans: int
    kept: dict[str, int]
    unreachable: list[str]
    list_errors: list[str]
    verdicts: list[OrphanVerdict]
    deleted: list[dict[str, Any]]
    absent: list[dict[str, Any]]
    refused: list[dict[str, Any]]
    failed: list[dict[str, Any]]


class SweepRequest(Strict):
    grace_s: float | None = Field(
        default=None, ge=0, le=365 * 86400,
        description="minimum age of an orphan, seconds; default: the orphan_grace_s setting")
