"""History pruning (services/history.py) on SQLite and PostgreSQL: old
finished jobs go with their events, old audit entries go, queued or running
jobs stay whatever their age, and the failure counter on /metrics does not
go down."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from cutpoint.api.models import AuditEntry, Job, JobEvent, JobState, utcnow
from cutpoint.api.services import history
from sqlalchemy import func, select


def _job(s: Any, state: JobState, age_days: float, code: str | None = None) -> str:
    at = utcnow() - dt.timedelta(days=age_days)
    j = Job(id=str(uuid.uuid4()), kind="replicate", state=state, created_at=at,
            finished_at=at if state in history.FINISHED else None, error_code=code)
    s.add(j)
    s.flush()
    s.add(JobEvent(job_id=j.id, seq=1, step="start", at=at))
    return j.id


def _failures(api: Any) -> str:
    return "\n".join(ln for ln in api.client.get("/metrics").text.splitlines()
                     if ln.startswith("cutpoint_job_failures_total{"))


def test_prune_old_history_keeps_the_rest_and_the_counter(api: Any, session_factory: Any) -> None:
    with session_factory() as s:
        old_ok = _job(s, JobState.succeeded, 100)
        old_failed = [_job(s, JobState.failed, 100, "copy_failed") for _ in range(3)]
        old_running = _job(s, JobState.running, 100)
        old_queued = _job(s, JobState.queued, 100)
        new_failed = _job(s, JobState.failed, 1, "copy_failed")
        new_ok = _job(s, JobState.succeeded, 1)
        audit_ids = [str(uuid.uuid4()) for _ in range(3)]
        for age, rid in zip((100, 100, 1), audit_ids, strict=True):
            s.add(AuditEntry(at=utcnow() - dt.timedelta(days=age), method="POST",
                             path="/v1/groups", status=201, request_id=rid))
        s.commit()
    mine = {old_ok, *old_failed, old_running, old_queued, new_failed, new_ok}
    before = _failures(api)
    assert 'cutpoint_job_failures_total{code="copy_failed",kind="replicate"} 4.0' in before

    with session_factory() as s:
        r = history.prune(s, keep_days=90)
    assert (r.jobs, r.job_events, r.audit_entries) == (4, 4, 2), r.as_dict()

    # Other tests' rows may share the database: look at this test's own.
    with session_factory() as s:
        left = set(s.scalars(select(Job.id))) & mine
        assert left == {old_running, old_queued, new_failed, new_ok}
        assert s.scalar(select(func.count()).select_from(JobEvent)
                        .where(JobEvent.job_id.in_(mine))) == 4
        assert list(s.scalars(select(AuditEntry.request_id)
                              .where(AuditEntry.request_id.in_(audit_ids)))) == audit_ids[2:]
    # Three failed jobs are gone from the table; the counter still says 4.
    assert _failures(api) == before

    with session_factory() as s:  # a second pass finds nothing more
        r = history.prune(s, keep_days=90)
    assert (r.jobs, r.job_events, r.audit_entries) == (0, 0, 0)
