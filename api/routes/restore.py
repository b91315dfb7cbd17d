"""Restore of a group snapshot: as new clones, or in place."""

from __future__ import annotations

from typing import Annotated

from cutpoint.api.deps import Admin, SessionDep, SettingsDep
from cutpoint.api.schemas.jobs import JobPublic
from cutpoint.api.schemas.restore import RestoreCloneRequest, RestoreInPlaceRequest
from cutpoint.api.services import groups, jobs, queue, restore
from fastapi import APIRouter, Path, Response

router = APIRouter(tags=["restore"])
GroupRef = Annotated[str, Path(max_length=64, description="Group id or name")]
_REFUSALS = {409: {"description": "Refused, nothing touched: the snapshot is not at that "
                   "site on every member, a clone name is taken, or (in place) a member "
                   "VM runs or an image is open; the problem names them"},
             503: {"description": "The site's agents or Ceph did not answer; nothing touched"}}


@router.post("/groups/{group}/restore/clone", status_code=202, response_model=JobPublic,
             responses=_REFUSALS)
def restore_clone(group: GroupRef, data: RestoreCloneRequest, session: SessionDep,
                  token: Admin, settings: SettingsDep, response: Response) -> JobPublic:
    """Restore a group snapshot as new copy-on-write clones; the originals are untouched.

    Each member disk's snapshot is cloned in its pool at the chosen site, as
    `names[disk]` or `<image>-<suffix>`.  If any name is taken, nothing is
    created; a clone that fails removes the clones this restore made."""
    g = groups.resolve(session, group)
    job = restore.request(session, settings, g, restore.CLONE, data.snapshot, data.site,
                          data.suffix, data.names, token.name)
    queue.enqueue(session, settings, job)
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    return jobs.public(job)


@router.post("/groups/{group}/restore/in-place", status_code=202, response_model=JobPublic,
             responses=_REFUSALS)
def restore_in_place(group: GroupRef, data: RestoreInPlaceRequest, session: SessionDep,
                     token: Admin, settings: SettingsDep, response: Response) -> JobPublic:
    """Roll every member image of the group back to a snapshot, at one site.

    What was written since the snapshot is lost.  Refused while any member
    VM runs at that site (409 `vms_running`, with `vms`), while an agent of
    the site does not answer (503 `agents_unreachable`, with `hosts`), or
    while an image is open (409 `image_in_use`, with `items`)."""
    g = groups.resolve(session, group)
    job = restore.request(session, settings, g, restore.IN_PLACE, data.snapshot, data.site,
                          None, None, token.name)
    queue.enqueue(session, settings, job)
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    return jobs.public(job)
