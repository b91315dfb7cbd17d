"""Replication state and DR retention: per group, per group snapshot, per member."""

from __future__ import annotations

from typing import Annotated

from cutpoint.api.deps import Admin, IdPath, Operator, SessionDep, Viewer
from cutpoint.api.models import DrPolicy, FencingEpoch, GroupSnapshot, utcnow
from cutpoint.api.schemas.dr import (
    DrPolicyPublic,
    DrPolicyUpdate,
    GroupReplicationPublic,
    ReplicateRequest,
    ReplicationPublic,
)
from cutpoint.api.schemas.jobs import JobPublic
from cutpoint.api.services import groups, jobs, replication
from cutpoint.api.services.common import get_or_404
from fastapi import APIRouter, Path, Query, Request, Response
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
    newest = next((s for s in snaps if s.dr_verified_at is not None), None)
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
    s = get_or_404(session, GroupSnapshot, snapshot_id, "snapshot")
    return ReplicationPublic.model_validate(replication.summary(session, s))


@router.post("/snapshots/{snapshot_id}/replicate", status_code=202, response_model=JobPublic)
def replicate_snapshot(snapshot_id: IdPath, session: SessionDep, token: Operator,
                       request: Request, response: Response,
                       data: ReplicateRequest | None = None) -> JobPublic:
    """Replicate (or retry) one committed group snapshot to its group's DR site."""
    from cutpoint.api.errors import Conflict

    s = get_or_404(session, GroupSnapshot, snapshot_id, "snapshot")
    if s.state.value != "committed":
        raise Conflict(f"snapshot {s.txn} is {s.state.value}, not committed",
                       code="not_committed")
    data = data or ReplicateRequest()
    job = jobs.create(session, "replicate", actor=token.name, group_id=s.group_id,
                      snapshot_id=s.id, params={"verify_full": data.verify_full,
                                                "jobs": data.jobs})
    request.app.state.enqueue("replicate", job.id, session=session)
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    return jobs.public(job)


@router.get("/groups/{group}/dr-policy", response_model=DrPolicyPublic)
def get_dr_policy(group: GroupRef, session: SessionDep, _: Viewer) -> DrPolicyPublic:
    g = groups.resolve(session, group)
    p = session.get(DrPolicy, g.id) or DrPolicy(keep_last=48, keep_within_seconds=0)
    return DrPolicyPublic(keep_last=p.keep_last, keep_within=p.keep_within_seconds)


@router.put("/groups/{group}/dr-policy", response_model=DrPolicyPublic)
def put_dr_policy(group: GroupRef, data: DrPolicyUpdate, session: SessionDep, _: Admin) \
        -> DrPolicyPublic:
    """Retention at the DR site, separate from the primary's; bases are always kept."""
    g = groups.resolve(session, group)
    p = session.get(DrPolicy, g.id)
    if p is None:
        p = DrPolicy(group_id=g.id, keep_last=48, keep_within_seconds=0)
        session.add(p)
    if data.keep_last is not None:
        p.keep_last = data.keep_last
    if data.keep_within is not None:
        p.keep_within_seconds = data.keep_within
    session.commit()
    return DrPolicyPublic(keep_last=p.keep_last, keep_within=p.keep_within_seconds)
