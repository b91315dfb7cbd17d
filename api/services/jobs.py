from __future__ import annotations

import uuid
from typing import Any

from cutpoint.api.models import Job
from cutpoint.api.schemas.jobs import JobPublic
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
