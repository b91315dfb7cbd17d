"""Drills (test failover) at the DR site."""

from __future__ import annotations

from typing import Annotated

from cutpoint.api.deps import Operator, SessionDep, SettingsDep
from cutpoint.api.schemas.dr import DrillRequest
from cutpoint.api.schemas.jobs import JobPublic
from cutpoint.api.services import drills, groups, jobs, queue
from fastapi import APIRouter, Path, Response

router = APIRouter(tags=["drills"])
GroupRef = Annotated[str, Path(max_length=64, description="Group id or name")]


@router.post("/groups/{group}/drills", status_code=202, response_model=JobPublic,
             responses={404: {"description": "No such group or recovery point"},
                        409: {"description": "Not a DR recovery point, or the configured "
                                             "booter cannot boot a drill"}})
def start_drill(group: GroupRef, data: DrillRequest, session: SessionDep, token: Operator,
                settings: SettingsDep, response: Response) -> JobPublic:
    """Clone a DR recovery point, boot it isolated at DR, run the checks, clean up.

    Follow the job (`GET /v1/jobs/{id}`); its result is the drill report."""
    g = groups.resolve(session, group)
    job = drills.request(session, g, data.recovery_point, list(data.checks), token.name,
                         settings.booter)
    queue.enqueue(session, settings, job)
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    return jobs.public(job)
