"""The drill report an auditor reads (GET /v1/drills/{id}/report)."""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from cutpoint.api.schemas.common import Public
from pydantic import Field


class Segment(Public):
    step: str = Field(description="clone, boot, a check's name, or teardown")
    start_s: float
    end_s: float
    status: Literal["ok", "failed", "pending"]


class VmRow(Public):
    vm: str
    ready_s: float | None = Field(description="Seconds from the drill's start until the VM "
                                  "was ready; null: it never was.")
    segments: list[Segment]


class CheckResult(Public):
    name: str
    ok: bool
    summary: str
    seconds: float | None
    output: dict[str, Any] = Field(description="What the check recorded besides its summary.")


class DrillReport(Public):
    job_id: str
    drill_id: str | None
    group: str | None
    state: str = Field(description="The drill job's state.")
    verdict: Literal["passed", "failed", "pending", "none"]
    error: str | None
    recovery_point: str | None
    point_cut_at: dt.datetime | None
    point_age_s: float | None = Field(
        description="Age of the recovery point when the drill was asked for: the RPO the "
        "drill proved.")
    requested_at: dt.datetime
    finished_at: dt.datetime | None
    rto_s: float | None = Field(
        description="From the request to the last VM ready; null if a VM never was.")
    booter: str | None
    vms: list[VmRow] = Field(description="The timeline, one row per VM.")
    checks: list[CheckResult]
    boot_order: list[dict[str, Any]] = Field(
        default_factory=list, description="The recovery plan's boot groups as they became "
        "ready: {group, order, vms, ready_t_s}; one group of all VMs without a plan.")
    cleanup: dict[str, Any]
    timeline: list[dict[str, Any]] = Field(description="Every event the drill recorded.")
