from __future__ import annotations

from typing import Annotated

from cutpoint.api.deps import Limit, SessionDep, Viewer
from cutpoint.api.errors import ApiError
from cutpoint.api.models import Job
from cutpoint.api.schemas.common import Page
from cutpoint.api.schemas.jobs import JobEventPublic, JobPublic
from cutpoint.api.services import jobs
from cutpoint.api.services.common import get_or_404
from fastapi import APIRouter, Path, Query
from sqlalchemy import select

router = APIRouter(prefix="/jobs", tags=["jobs"])


@router.get("", response_model=Page[JobPublic])
def list_jobs(session: SessionDep, _: Viewer, limit: Limit = 50,
              cursor: Annotated[str | None, Query(max_length=80)] = None,
              kind: Annotated[str | None, Query(max_length=32)] = None,
              group_id: Annotated[int | None, Query(ge=1, le=2**31 - 1)] = None) \
        -> Page[JobPublic]:
    """Newest first, optionally one kind's (`drill`) or one group's.  The cursor
    is `<created_at ISO>|<id>` of the last job seen."""
    stmt = select(Job)
    if kind:
        stmt = stmt.where(Job.kind == kind)
    if group_id is not None:
        stmt = stmt.where(Job.group_id == group_id)
    if cursor:
        ts, sep, jid = cursor.partition("|")
        import datetime as dt

        try:
            at = dt.datetime.fromisoformat(ts)
            if at.tzinfo is None:
                raise ValueError("naive")
        except ValueError:
            raise ApiError(f"cursor {cursor!r} is not one this API handed out",
                           code="bad_cursor") from None
        if not sep:
            raise ApiError(f"cursor {cursor!r} is not one this API handed out", code="bad_cursor")
        stmt = stmt.where((Job.created_at < at) | ((Job.created_at == at) & (Job.id < jid)))
    rows = list(session.scalars(stmt.order_by(Job.created_at.desc(), Job.id.desc())
                                .limit(limit + 1)))
    nxt = None
    if len(rows) > limit:
        rows = rows[:limit]
        nxt = f"{rows[-1].created_at.isoformat()}|{rows[-1].id}"
    return Page(items=[jobs.public(j) for j in rows], next_cursor=nxt)


@router.get("/{job_id}", response_model=JobPublic)
def get_job(job_id: Annotated[str, Path(max_length=36)], session: SessionDep, _: Viewer) \
        -> JobPublic:
    """One job: kind, state, progress, result or error."""
    return jobs.public(get_or_404(session, Job, job_id, "job"))


@router.get("/{job_id}/events", response_model=list[JobEventPublic])
def get_job_events(job_id: Annotated[str, Path(max_length=36)], session: SessionDep,
                   _: Viewer) -> list[JobEventPublic]:
    """The job's steps in order, each with its wall-clock time (`at`) and, where the
    job has an origin (a failover: the request), seconds from it (`t_s`)."""
    get_or_404(session, Job, job_id, "job")
    return jobs.events(session, job_id)
