"""Orphan member snapshots: the sweeper's dry run and an admin's sweep
(services/sweeper.py; it also runs at worker start and periodically)."""

from __future__ import annotations

from typing import Annotated

from cutpoint.api.deps import Admin, SessionDep, SettingsDep
from cutpoint.api.schemas.jobs import JobPublic
from cutpoint.api.schemas.orphans import OrphanPlan, SweepRequest
from cutpoint.api.services import jobs, queue, sweeper
from fastapi import APIRouter, Query, Request, Response

router = APIRouter(prefix="/orphans", tags=["orphans"])


@router.get("", response_model=OrphanPlan)
def plan_sweep(request: Request, _: Admin, settings: SettingsDep,
               grace_s: Annotated[float | None, Query(ge=0, le=365 * 86400)] = None) \
        -> OrphanPlan:
    """Dry run: ask every agent for its RBD snapshots and say which the
    sweeper would delete and why each other one is kept.  Deletes nothing."""
    res = sweeper.plan(request.app.state.read_session_factory, settings, grace_s=grace_s)
    return OrphanPlan.model_validate(res.to_dict())


@router.post("/sweep", status_code=202, response_model=JobPublic)
def run_sweep(body: SweepRequest, session: SessionDep, token: Admin, settings: SettingsDep,
              response: Response) -> JobPublic:
    """Delete the orphans now, in a job (progress and summary on the job,
    each deletion in the audit log)."""
    params = {} if body.grace_s is None else {"grace_s": body.grace_s}
    job = jobs.create(session, "orphan_sweep", actor=token.name, params=params)
    queue.enqueue(session, settings, job)
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    return jobs.public(job)
