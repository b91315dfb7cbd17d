from __future__ import annotations

from cutpoint.api.deps import IdPath, SessionDep, Viewer
from cutpoint.api.models import Group, GroupSnapshot
from cutpoint.api.schemas.snapshots import SnapshotDetail
from cutpoint.api.services import snapshots
from cutpoint.api.services.common import get_or_404
from fastapi import APIRouter

router = APIRouter(prefix="/snapshots", tags=["snapshots"])


@router.get("/{snapshot_id}", response_model=SnapshotDetail)
def get_snapshot(snapshot_id: IdPath, session: SessionDep, _: Viewer) -> SnapshotDetail:
    """One group snapshot with its member snapshots."""
    s = get_or_404(session, GroupSnapshot, snapshot_id, "snapshot")
    g = session.get(Group, s.group_id)
    return snapshots.detail(s, g.name if g else "?")
