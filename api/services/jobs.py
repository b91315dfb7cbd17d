from __future__ import annotations

import json
import uuid
from typing import Any

from cutpoint.api.models import Job, JobEvent, utcnow
from cutpoint.api.schemas.jobs import JobEventPublic, JobPublic
from sqlalchemy import func, select
from sqlalchemy.orm import Session


def public(job: Job) -> JobPublic:
    d: dict[str, Any] = {c: getattr(job, c) for c in JobPublic.model_fields}
    d["state"] = job.state.value
    return JobPublic.model_validate(d)


def create(session: Session, kind: str, *, actor: str | None, **fields: Any) -> Job:
    job = Job(id=str(uuid.uuid4()), kind=kind, created_by=actor, message="queued", **fields)
    session.add(job)
    session.commit()
    return job


def add_event(session: Session, job_id: str, step: str, *, status: str = "ok",
              t_s: float | None = None, detail: dict[str, Any] | None = None) -> JobEvent:
    """Append one step to the job's events (numbered in order) and commit.

    `detail` is stored as JSON; what JSON cannot hold is written as its str()."""
    seq = (session.scalar(select(func.max(JobEvent.seq)).where(JobEvent.job_id == job_id))
           or 0) + 1
    ev = JobEvent(job_id=job_id, seq=seq, at=utcnow(), t_s=t_s, step=step[:64],
                  status=status[:16],
                  detail=json.loads(json.dumps(detail or {}, default=str)))
    session.add(ev)
    session.commit()
    return ev


def events(session: Session, job_id: str) -> list[JobEventPublic]:
    rows = session.scalars(select(JobEvent).where(JobEvent.job_id == job_id)
                           .order_by(JobEvent.seq))
    return [JobEventPublic(seq=e.seq, at=e.at, t_s=e.t_s, step=e.step, status=e.status,
                           detail=e.detail or {}) for e in rows]
