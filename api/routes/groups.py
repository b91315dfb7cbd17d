from __future__ import annotations

from typing import Annotated

from cutpoint.api.deps import (
    Admin,
    Cursor,
    IdPath,
    IfMatch,
    Limit,
    Operator,
    SessionDep,
    SettingsDep,
    Viewer,
)
from cutpoint.api.models import Group, GroupSnapshot, RpoMiss
from cutpoint.api.schemas.common import Page
from cutpoint.api.schemas.groups import (
    GroupCreate,
    GroupPublic,
    GroupUpdate,
    MemberAdd,
    MemberPublic,
)
from cutpoint.api.schemas.jobs import JobPublic
from cutpoint.api.schemas.policy import PolicyPublic, PolicyUpdate
from cutpoint.api.schemas.rpo import RpoMissPublic, RpoStatus
from cutpoint.api.schemas.snapshots import SnapshotPublic
from cutpoint.api.services import groups, jobs, queue, rpo, snapshots
from cutpoint.api.services.common import paginate
from fastapi import APIRouter, Path, Response
from sqlalchemy import select

router = APIRouter(prefix="/groups", tags=["groups"])
GroupRef = Annotated[str, Path(max_length=64, description="Group id or name")]


@router.get("", response_model=Page[GroupPublic])
def list_groups(session: SessionDep, _: Viewer, limit: Limit = 50, cursor: Cursor = None) \
        -> Page[GroupPublic]:
    """Every consistency group, by name."""
    rows, nxt = paginate(session, select(Group), Group.id, limit, cursor)
    return Page(items=[groups.public(session, g) for g in rows], next_cursor=nxt)


@router.post("", status_code=201, response_model=GroupPublic)
def create_group(data: GroupCreate, session: SessionDep, _: Admin, response: Response) \
        -> GroupPublic:
    """Create a group `{name, description?, policy?}`; members are added afterwards."""
    g = groups.create(session, data)
    response.headers["ETag"] = groups.group_etag(g)
    response.headers["Location"] = f"/v1/groups/{g.id}"
    return groups.public(session, g)


@router.get("/{group}", response_model=GroupPublic)
def get_group(group: GroupRef, session: SessionDep, _: Viewer, response: Response) -> GroupPublic:
    """One group with its members, policy and state."""
    g = groups.resolve(session, group)
    response.headers["ETag"] = groups.group_etag(g)
    return groups.public(session, g)


@router.patch("/{group}", response_model=GroupPublic)
def update_group(group: GroupRef, data: GroupUpdate, session: SessionDep, _: Admin,
                 response: Response, if_match: IfMatch = None) -> GroupPublic:
    """Change a group; `enabled: false` pauses its schedule."""
    g = groups.update(session, groups.resolve(session, group), data, if_match)
    response.headers["ETag"] = groups.group_etag(g)
    return groups.public(session, g)


@router.delete("/{group}", status_code=204)
def delete_group(group: GroupRef, session: SessionDep, _: Admin, if_match: IfMatch = None) -> Response:
    """Delete a group and its schedule (refused while a snapshot is in flight:
    `snapshot_in_flight`); nothing at Ceph is touched.  The CLI asks first."""
    groups.delete(session, groups.resolve(session, group), if_match)
    return Response(status_code=204)


@router.get("/{group}/policy", response_model=PolicyPublic)
def get_policy(group: GroupRef, session: SessionDep, _: Viewer, response: Response) \
        -> PolicyPublic:
    """The group's snapshot policy (interval, RPO target, retention, quiesce)."""
    g = groups.resolve(session, group)
    response.headers["ETag"] = groups.policy_etag(g.policy)
    return groups.policy_public(g.policy)


@router.patch("/{group}/policy", response_model=PolicyPublic)
def update_policy(group: GroupRef, data: PolicyUpdate, session: SessionDep, _: Admin,
                  response: Response, if_match: IfMatch = None) -> PolicyPublic:
    """Change the group's snapshot policy; the schedule follows at once."""
    p = groups.set_policy(session, groups.resolve(session, group), data, if_match)
    response.headers["ETag"] = groups.policy_etag(p)
    return groups.policy_public(p)


@router.post("/{group}/members", status_code=201, response_model=MemberPublic)
def add_member(group: GroupRef, data: MemberAdd, session: SessionDep, _: Admin) -> MemberPublic:
    """Add `{"vm": "name", "host"?}` (all its disks, now and later) or `{"disk": "vm/node"}`."""
    g = groups.resolve(session, group)
    return groups.member_public(session, groups.add_member(session, g, data))


@router.delete("/{group}/members/{member_id}", status_code=204)
def remove_member(group: GroupRef, member_id: IdPath, session: SessionDep, _: Admin) -> Response:
    """Remove one member; its past snapshots stay."""
    groups.remove_member(session, groups.resolve(session, group), member_id)
    return Response(status_code=204)


@router.post("/{group}/snapshots", status_code=202, response_model=JobPublic,
             responses={409: {"description": "A snapshot of this group is in flight"}})
def take_snapshot(group: GroupRef, session: SessionDep, token: Operator, settings: SettingsDep,
                  response: Response) -> JobPublic:
    """Start a group snapshot; returns its job.  One in flight per group (409 otherwise)."""
    g = groups.resolve(session, group)
    job = snapshots.request(session, g, trigger="manual", actor=token.name)
    queue.enqueue(session, settings, job)
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    return jobs.public(job)


@router.get("/{group}/snapshots", response_model=Page[SnapshotPublic])
def list_snapshots(group: GroupRef, session: SessionDep, _: Viewer, limit: Limit = 50,
                   cursor: Cursor = None) -> Page[SnapshotPublic]:
    """The group's snapshots, newest first, with state and timings."""
    g = groups.resolve(session, group)
    rows, nxt = paginate(session, select(GroupSnapshot).where(GroupSnapshot.group_id == g.id),
                         GroupSnapshot.id, limit, cursor, newest_first=True)
    return Page(items=[snapshots.public(s, g.name) for s in rows], next_cursor=nxt)


@router.get("/{group}/rpo", response_model=RpoStatus)
def rpo_status(group: GroupRef, session: SessionDep, settings: SettingsDep, _: Viewer) \
        -> RpoStatus:
    """Achieved RPO, target, compliant, next due and last miss."""
    return rpo.status(session, groups.resolve(session, group), settings.capture_head_start_s)


@router.get("/{group}/rpo/misses", response_model=Page[RpoMissPublic])
def rpo_misses(group: GroupRef, session: SessionDep, _: Viewer, limit: Limit = 50,
               cursor: Cursor = None) -> Page[RpoMissPublic]:
    """Every recorded RPO miss with its reason."""
    g = groups.resolve(session, group)
    rows, nxt = paginate(session, select(RpoMiss).where(RpoMiss.group_id == g.id), RpoMiss.id,
                         limit, cursor, newest_first=True)
    return Page(items=[rpo.miss_public(m, g.name) for m in rows], next_cursor=nxt)


@router.post("/{group}/retention", status_code=202, response_model=JobPublic)
def run_retention(group: GroupRef, session: SessionDep, token: Operator, settings: SettingsDep,
                  response: Response) -> JobPublic:
    """Apply the retention policy now (it also runs periodically)."""
    g = groups.resolve(session, group)
    job = jobs.create(session, "retention", actor=token.name, group_id=g.id,
                      params={"group_id": g.id})
    queue.enqueue(session, settings, job)
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    return jobs.public(job)
