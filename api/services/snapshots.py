"""Group snapshot requests: one job and one in-flight row, in one transaction."""

from __future__ import annotations

import secrets
import time
import uuid

from cutpoint.api.errors import Conflict
from cutpoint.api.models import (
    Group,
    GroupDisk,
    GroupSnapshot,
    Job,
    SnapState,
)
from cutpoint.api.schemas.snapshots import (
    MemberSnapshotPublic,
    SnapshotDetail,
    SnapshotPublic,
)
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session


def new_txn() -> str:
    """Sortable and unique: milliseconds since the epoch (hex) + 24 random bits."""
    return f"{int(time.time() * 1000):011x}{secrets.token_hex(3)}"


def public(s: GroupSnapshot, group_name: str) -> SnapshotPublic:
    return SnapshotPublic.model_validate({**_cols(s), "group": group_name})


def detail(s: GroupSnapshot, group_name: str) -> SnapshotDetail:
    return SnapshotDetail.model_validate({
        **_cols(s), "group": group_name,
        "members": [MemberSnapshotPublic.model_validate(m) for m in s.members]})


def _cols(s: GroupSnapshot) -> dict[str, object]:
    d = {c: getattr(s, c) for c in SnapshotPublic.model_fields if c != "group"}
    d["state"] = s.state.value
    return d


def in_flight(session: Session, group_id: int) -> GroupSnapshot | None:
    return session.scalar(select(GroupSnapshot).where(GroupSnapshot.inflight_group_id == group_id))


def request(session: Session, g: Group, *, trigger: str, actor: str | None) -> Job:
    """Create the job and the pending snapshot, or refuse with 409.

    The UNIQUE inflight_group_id makes the refusal hold under concurrency:
    of N simultaneous requests exactly one insert succeeds.
    """
    if session.scalar(select(GroupDisk.disk_id).where(GroupDisk.group_id == g.id).limit(1)) \
            is None:
        raise Conflict(f"group {g.name!r} has no members", code="group_empty")
    busy = in_flight(session, g.id)
    if busy is not None:
        raise _busy(g, busy)
    job = Job(id=str(uuid.uuid4()), kind="group_snapshot", group_id=g.id, created_by=actor,
              params={"group_id": g.id, "trigger": trigger}, message="queued")
    snap = GroupSnapshot(group_id=g.id, txn=new_txn(), state=SnapState.pending,
                         inflight_group_id=g.id, trigger=trigger, job_id=job.id)
    session.add_all([job, snap])
    try:
        session.flush()
        job.snapshot_id = snap.id
        session.commit()
    except IntegrityError:
        session.rollback()
        busy = in_flight(session, g.id)
        raise _busy(g, busy) from None
    return job


def request_many(session: Session, group_ids: list[int], *, trigger: str,
                 actor: str | None) -> list[Job]:
    """`request` for many groups in one transaction and one commit (the
    scheduler's tick); a group with no disks, or with a snapshot in flight
    (the same UNIQUE refusal, in its own savepoint), is left out."""
    with_disks = set(session.scalars(select(GroupDisk.group_id).where(
        GroupDisk.group_id.in_(group_ids)).distinct()))
    out = []
    for gid in group_ids:
        if gid not in with_disks:
            continue
        job = Job(id=str(uuid.uuid4()), kind="group_snapshot", group_id=gid,
                  created_by=actor, params={"group_id": gid, "trigger": trigger},
                  message="queued")
        snap = GroupSnapshot(group_id=gid, txn=new_txn(), state=SnapState.pending,
                             inflight_group_id=gid, trigger=trigger, job_id=job.id)
        try:
            with session.begin_nested():
                session.add_all([job, snap])
                session.flush()
                job.snapshot_id = snap.id
                session.flush()
        except IntegrityError:
            continue  # in flight already (a request slipped in meanwhile)
        out.append(job)
    session.commit()
    return out


def _busy(g: Group, busy: GroupSnapshot | None) -> Conflict:
    extra = {"snapshot_id": busy.id, "job_id": busy.job_id} if busy is not None else {}
    return Conflict(f"group {g.name!r} already has a snapshot in flight",
                    code="snapshot_in_flight", extra=extra)
