"""Request and reply bodies of the DR endpoints (replication, drills, failover)."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Literal

from cutpoint.api.schemas.common import Public, Strict
from pydantic import Field, StringConstraints

CheckName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_-]{0,31}$")]
RecoveryRef = Annotated[str, StringConstraints(pattern=r"^(latest|[0-9]{1,18}|[A-Za-z0-9._-]{1,64})$")]


class MemberReplicationPublic(Public):
    disk: str
    image: str
    snap: str
    base: str | None
    target_site: str
    state: str
    full: bool | None
    bytes_shipped: int
    bytes_changed: int
    seconds: float | None
    throughput_mbps: float | None
    lag_s: float | None
    error: str | None


class ReplicationPublic(Public):
    snapshot_id: int
    txn: str
    state: Literal["not_replicated", "copying", "verified", "failed", "dr_deleted"]
    recovery_point: bool
    dr_verified_at: str | None
    replication_base: bool
    attempts: int
    bytes_shipped: int
    seconds: float
    throughput_mbps: float | None
    lag_s: float | None
    members: list[MemberReplicationPublic]


class GroupReplicationPublic(Public):
    group: str
    target_site: str | None
    newest_recovery_point: str | None
    replication_lag_s: float | None = Field(description="cut -> verified at DR, newest point")
    achieved_dr_rpo_s: float | None = Field(description="now - cut of the newest DR point")
    fencing_epoch: int
    active_site: str | None
    snapshots: list[ReplicationPublic]


class ReplicateRequest(Strict):
    verify_full: bool = False
    jobs: int = Field(default=2, ge=1, le=16)


VmName = Annotated[str, StringConstraints(min_length=1, max_length=128)]


class CheckRequest(Strict):
    """A check with its parameters (docs/drills.md lists each built-in's)."""
    name: CheckName
    params: dict[str, Any] = Field(default_factory=dict)
    timeout_s: float | None = Field(default=None, gt=0, le=3600)


class ReadinessRule(Strict):
    """When a drill VM counts as ready: running and answering guest-ping, or
    running with a TCP port open (probed from the control plane)."""
    kind: Literal["guest-ping", "tcp"] = "guest-ping"
    port: int | None = Field(default=None, ge=1, le=65535)
    address: str | None = Field(default=None, max_length=255)
    timeout_s: float | None = Field(default=None, ge=0, le=3600)
    delay_s: float | None = Field(default=None, ge=0, le=3600)


class DrillRequest(Strict):
    recovery_point: RecoveryRef = "latest"
    checks: list[CheckName | CheckRequest] | None = Field(
        default=None, max_length=8,
        description="Names, or {name, params, timeout_s}.  Omitted: the checks of the "
        "group's recovery plan, else writer.")
    readiness: dict[VmName, ReadinessRule] = Field(
        default_factory=dict, max_length=256,
        description="Per group VM; a VM the plan or this map does not name: guest-ping.")
    plan: dict[str, Any] | None = Field(
        default=None, description="A recovery plan for this drill only (docs/drills.md); "
        "omitted: the group's newest plan.")


class PlanPublic(Public):
    group: str
    version: int
    body: dict[str, Any]
    sha256: str
    created_by: str | None
    created_at: dt.datetime


class FailoverRequest(Strict):
    recovery_point: RecoveryRef = "latest"
    mode: Literal["planned", "unplanned"]
    workload: Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_-]{0,31}$")] = "none"


class DrPolicyPublic(Public):
    keep_last: int
    keep_within: int


class DrPolicyUpdate(Strict):
    keep_last: int | None = Field(default=None, ge=1, le=100000)
    keep_within: int | None = Field(default=None, ge=0, le=10 * 365 * 86400)




class FailbackRequest(Strict):
    workload: Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_-]{0,31}$")] = "none"
