"""Re-protect a failed-over group, and fail it back."""

from __future__ import annotations

from typing import Annotated

from cutpoint.api.deps import Admin, SessionDep, SettingsDep
from cutpoint.api.schemas.dr import FailbackRequest
from cutpoint.api.schemas.jobs import JobPublic
from cutpoint.api.services import groups, jobs, queue, reprotect
from fastapi import APIRouter, Path, Response

router = APIRouter(tags=["failover"])
GroupRef = Annotated[str, Path(max_length=64, description="Group id or name")]


@router.post("/groups/{group}/re-protect", status_code=202, response_model=JobPublic,
             responses={409: {"description": "The group did not fail over, is protected "
                              "already, or a member has no VM at the active site"}})
def start_reprotect(group: GroupRef, session: SessionDep, token: Admin,
                    settings: SettingsDep, response: Response) -> JobPublic:
    """Protect a failed-over group in the other direction.

    The group's members become the VMs running at the active site, a group
    snapshot of them is replicated to the site they left (deltas from the
    newest recovery point both hold; a full copy only when there is none,
    and the result says so), and the schedule is switched back on.  409
    `not_failed_over`, `already_protected`, or `no_counterpart` (with `vms`:
    the active site's inventory does not list them)."""
    g = groups.resolve(session, group)
    job = reprotect.request(session, g, "reprotect", token.name)
    queue.enqueue(session, settings, job)
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    return jobs.public(job)


@router.post("/groups/{group}/failback", status_code=202, response_model=JobPublic,
             responses={409: {"description": "Not re-protected yet, or a failover "
                              "precondition does not hold; nothing was touched"},
                        503: {"description": "The original primary did not answer"}})
def start_failback(group: GroupRef, data: FailbackRequest, session: SessionDep,
                   token: Admin, settings: SettingsDep, response: Response) -> JobPublic:
    """Fail a re-protected group back to its original primary, then re-protect it.

    A planned failover in the other direction (its own `failover` job, with
    the RTO), followed by re-protect in the original direction.  409
    `not_reprotected` until the original primary holds a recent copy; the
    failover's precondition problems otherwise."""
    g = groups.resolve(session, group)
    job = reprotect.request(session, g, "failback", token.name, settings, data.workload)
    queue.enqueue(session, settings, job)
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    return jobs.public(job)
