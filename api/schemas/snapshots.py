from __future__ import annotations

import datetime as dt

from cutpoint.api.schemas.common import Public
from pydantic import Field


class MemberSnapshotPublic(Public):
    id: int
    host: str
    vm: str
    disk: str
    name: str
    state: str
    consistency: str | None
    method: str | None
    stop_ms: float | None
    barrier_ms: float | None
    snapshot_ms: float | None
    cont_ms: float | None
    paused_ms: float | None
    freeze_ms: float | None = None
    thaw_ms: float | None = None
    freeze_error: str | None = Field(
        default=None, description="Why quiesce fs-freeze fell back to crash for this member")
    thaw_error: str | None = Field(
        default=None, description="Why the thaw after the snapshot failed (the guest may "
        "still be frozen, its writes blocked); null if it succeeded or none was due")
    pause_path: str | None = Field(
        default=None, description="How the agent cut the member's VM: \"live\" (its "
        "disks switched onto overlays with the VM running, its network held until the "
        "commit), \"redirect\" (that switch inside a pause, the snapshot taken after it) or "
        "\"in_pause\" (the snapshot taken inside the pause); null if no agent said")
    pause_path_why: str | None = Field(
        default=None, description="Why the agent cut this member's VM inside the pause "
        "although it can take the redirect cut (its overlays were still being made, "
        "could not be made, or the switch was refused): its pause then followed the "
        "backend's snapshot latency; or, on agents set to the live cut, why the VM was "
        "stopped for its switch (its network could not be held); null otherwise")


class SnapshotPublic(Public):
    id: int
    group: str
    txn: str
    state: str
    trigger: str
    job_id: str | None
    requested_at: dt.datetime
    started_at: dt.datetime | None
    cut_at: dt.datetime | None
    finished_at: dt.datetime | None
    max_pause_ms: float | None
    duration_ms: float | None
    consistency: str | None = Field(
        description="Level reached: the weakest of the members' (crash | fs-freeze)")
    quiesce: str | None = Field(default=None, description="Level asked for by the policy")
    dr_verified_at: dt.datetime | None
    replication_base: bool
    error_code: str | None
    error: str | None


class SnapshotDetail(SnapshotPublic):
    members: list[MemberSnapshotPublic]
