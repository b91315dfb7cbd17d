"""Replication state and DR retention: per group, per group snapshot, per member."""

from __future__ import annotations

from typing import Annotated

from cutpoint.api.deps import Admin, IdPath, Operator, SessionDep, SettingsDep, Viewer
from cutpoint.api.models import FencingEpoch, GroupSnapshot, utcnow
from cutpoint.api.schemas.dr import (
    DrPolicyPublic,
    DrPolicyUpdate,
    GroupReplicationPublic,
    ReplicateRequest,
    ReplicationPublic,
)
from cutpoint.api.schemas.jobs import JobPublic
from cutpoint.api.services import groups, jobs, queue, replication
from cutpoint.api.services.common import get_or_404
from fastapi import APIRouter, Path, Query, Response
from sqlalchemy import select

router = APIRouter(tags=["replication"])
GroupRef = Annotated[str, Path(max_length=64, description="Group id or name")]


@router.get("/groups/{group}/replication", response_model=GroupReplicationPublic)
def group_replication(group: GroupRef, session: SessionDep, _: Viewer,
                      limit: Annotated[int, Query(ge=1, le=500)] = 20) -> GroupReplicationPublic:
    """Replication state of the group's newest snapshots, lag and achieved DR RPO."""
    g = groups.resolve(session, group)
    snaps = list(session.scalars(select(GroupSnapshot).where(GroupSnapshot.group_id == g.id)
                                 .order_by(GroupSnapshot.id.desc()).limit(limit)))
    # The newest recovery point of the group, whatever `limit` lists: with
    # captures queued behind a slow copy, none of the newest few may be
    # verified yet, and the group still has a recovery point at DR.
    newest = session.scalar(select(GroupSnapshot).where(
        GroupSnapshot.group_id == g.id, GroupSnapshot.dr_verified_at.is_not(None))
        .order_by(GroupSnapshot.cut_at.desc(), GroupSnapshot.id.desc()).limit(1))
    fe = session.scalar(select(FencingEpoch).where(FencingEpoch.group_id == g.id)
                        .order_by(FencingEpoch.epoch.desc()).limit(1))
    tgt = g.policy.replication_target if g.policy else None
    return GroupReplicationPublic(
        group=g.name, target_site=tgt.name if tgt else None,
        newest_recovery_point=newest.txn if newest else None,
        replication_lag_s=replication.replication_lag_s(session, g.id),
        achieved_dr_rpo_s=replication.achieved_dr_rpo_s(session, g.id, utcnow()),
        fencing_epoch=fe.epoch if fe else 0, active_site=fe.active_site if fe else None,
        snapshots=[ReplicationPublic.model_validate(replication.summary(session, s))
                   for s in snaps])


@router.get("/snapshots/{snapshot_id}/replication", response_model=ReplicationPublic)
def snapshot_replication(snapshot_id: IdPath, session: SessionDep, _: Viewer) \
        -> ReplicationPublic:
    """Replication state of one group snapshot, per member image."""
    s = get_or_404(session, GroupSnapshot, snapshot_id, "snapshot")
    return ReplicationPublic.model_validate(replication.summary(session, s))


@router.post("/snapshots/{snapshot_id}/replicate", status_code=202, response_model=JobPublic)
def replicate_snapshot(snapshot_id: IdPath, session: SessionDep, token: Operator,
                       settings: SettingsDep, response: Response,
                       data: ReplicateRequest | None = None) -> JobPublic:
    """Replicate (or retry) one committed group snapshot to its group's DR site."""
    s = get_or_404(session, GroupSnapshot, snapshot_id, "snapshot")
    data = data or ReplicateRequest()
    job = replication.request(session, s, verify_full=data.verify_full, jobs=data.jobs,
                              actor=token.name)
    queue.enqueue(session, settings, job)
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    return jobs.public(job)


@router.get("/groups/{group}/dr-policy", response_model=DrPolicyPublic)
def get_dr_policy(group: GroupRef, session: SessionDep, _: Viewer) -> DrPolicyPublic:
    """The group's retention at the DR site."""
    p = replication.dr_policy(session, groups.resolve(session, group))
    return DrPolicyPublic(keep_last=p.keep_last, keep_within=p.keep_within_seconds)


@router.put("/groups/{group}/dr-policy", response_model=DrPolicyPublic)
def put_dr_policy(group: GroupRef, data: DrPolicyUpdate, session: SessionDep, _: Admin) \
        -> DrPolicyPublic:
    """Retention at the DR site, separate from the primary's; bases are always kept."""
    p = replication.set_dr_policy(session, groups.resolve(session, group),
                                  keep_last=data.keep_last, keep_within_s=data.keep_within)
    return DrPolicyPublic(keep_last=p.keep_last, keep_within=p.keep_within_seconds)
