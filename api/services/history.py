"""History pruning: finished jobs (with their events) and audit entries
older than `history_keep_days` are deleted, in batches.  The newest
`drill_reports_kept` drill jobs of each group are kept whatever their age:
their result is the drill's report, an auditor's evidence.

Jobs still queued or running are never touched, whatever their age.  Failed
jobs are counted into `pruned_job_failures` in the same transaction as
their deletion, so the failure counter the metrics compute from the jobs
table never goes down.  Each batch commits on its own: a pass over a large
backlog holds no long transaction and can stop anywhere.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from cutpoint.api.models import (
    AuditEntry,
    Job,
    JobEvent,
    JobState,
    PrunedJobFailures,
    utcnow,
)
from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

BATCH = 500
FINISHED = (JobState.succeeded, JobState.failed)


@dataclass
class PruneResult:
    cutoff: str
    jobs: int = 0
    job_events: int = 0
    audit_entries: int = 0

    def as_dict(self) -> dict[str, object]:
        return {"cutoff": self.cutoff, "jobs": self.jobs, "job_events": self.job_events,
                "audit_entries": self.audit_entries}


def _count_failures(s: Session, ids: list[str]) -> None:
    rows = s.execute(select(Job.kind, Job.error_code, func.count())
                     .where(Job.id.in_(ids), Job.state == JobState.failed)
                     .group_by(Job.kind, Job.error_code)).all()
    for kind, code, n in rows:
        key = (kind, code or "unknown")
        row = s.get(PrunedJobFailures, key)
        if row is None:
            s.add(PrunedJobFailures(kind=key[0], error_code=key[1], count=n))
        else:
            row.count += n


def kept_drills(s: Session, keep: int) -> set[str]:
    """The newest `keep` drill jobs of each group."""
    kept: set[str] = set()
    per_group: dict[int | None, int] = {}
    for jid, gid in s.execute(select(Job.id, Job.group_id).where(Job.kind == "drill")
                              .order_by(Job.group_id, Job.created_at.desc(), Job.id.desc())):
        if per_group.get(gid, 0) < keep:
            per_group[gid] = per_group.get(gid, 0) + 1
            kept.add(jid)
    return kept


def prune(s: Session, keep_days: float, now: dt.datetime | None = None,
          keep_drills: int = 20) -> PruneResult:
    """Delete what finished (jobs) or happened (audit) before now - keep_days,
    except the newest `keep_drills` drills of each group."""
    cutoff = (now or utcnow()) - dt.timedelta(days=keep_days)
    res = PruneResult(cutoff=cutoff.isoformat())
    spared = kept_drills(s, keep_drills)
    while True:
        ids = [i for i in s.scalars(select(Job.id).where(
            Job.state.in_(FINISHED), Job.finished_at < cutoff, Job.id.not_in(spared))
            .limit(BATCH))]
        if not ids:
            break
        _count_failures(s, ids)
        res.job_events += s.execute(delete(JobEvent).where(JobEvent.job_id.in_(ids))).rowcount
        res.jobs += s.execute(delete(Job).where(Job.id.in_(ids))).rowcount
        s.commit()
    while True:
        ids = list(s.scalars(select(AuditEntry.id).where(AuditEntry.at < cutoff).limit(BATCH)))
        if not ids:
            break
        res.audit_entries += s.execute(delete(AuditEntry).where(AuditEntry.id.in_(ids))).rowcount
        s.commit()
    return res
