"""Failover of a group to its DR site."""

from __future__ import annotations

import time
from typing import Annotated

from cutpoint.api.deps import Admin, SessionDep, SettingsDep
from cutpoint.api.schemas.dr import FailoverRequest
from cutpoint.api.schemas.jobs import JobPublic
from cutpoint.api.services import failover, groups, jobs, queue
from fastapi import APIRouter, Path, Response

router = APIRouter(tags=["failover"])
GroupRef = Annotated[str, Path(max_length=64, description="Group id or name")]


@router.post("/groups/{group}/failover", status_code=202, response_model=JobPublic,
             responses={409: {"description": "A precondition does not hold (the problem's "
                              "`precondition` names it); nothing was touched"},
                        503: {"description": "The DR site (Ceph or an agent) did not answer "
                              "within the check deadline; nothing was touched"}})
def start_failover(group: GroupRef, data: FailoverRequest, session: SessionDep, token: Admin,
                   settings: SettingsDep, response: Response) -> JobPublic:
    """Fence the primary and bring the group up at DR from a recovery point.

    Every precondition is checked first (the DR site answers, the recovery
    point is verified and on every DR image, the DR agents know every VM,
    the fencing epoch can be taken); a failure is refused here with a
    problem naming it, and no primary VM is touched.  planned: a final group
    snapshot is taken and replicated first (it is the recovery point).  The
    job result holds the RTO (from this request to every DR guest ready),
    its breakdown, the timeline and the fencing epoch; its steps are
    `GET /v1/jobs/{id}/events`."""
    requested_at = time.time()  # RTO origin: the request, not the worker's start
    g = groups.resolve(session, group)
    job = failover.request(session, settings, g, data.recovery_point, data.mode, data.workload,
                           token.name, requested_at=requested_at)
    queue.enqueue(session, settings, job)
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    return jobs.public(job)
