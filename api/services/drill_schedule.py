"""Scheduled drills: a group whose policy has `drill_every` gets a drill of
its newest DR recovery point that often, asked for by beat's drill tick
(tasks_periodic.drill_tick) as an operator's `POST /v1/groups/{g}/drills`
would be, with the group's last checks or `writer`.

The group's drill standing (in GET /v1/groups/{g}/rpo, `drill`):
- `running`: a drill of the group is queued or running;
- `overdue`: a schedule is set and no drill passed within its period
  (also when the last one failed that long ago, or none ever ran);
- otherwise the last finished drill's verdict, `passed` or `failed`;
- `none`: no schedule and no drill yet.
A drill that could not be asked for (no DR recovery point, a booter that
cannot boot drills) is logged by the tick and leaves the group overdue.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from cutpoint.api.models import Group, Job, JobState, Policy, as_utc, utcnow
from cutpoint.api.schemas.rpo import DrillStatus
from sqlalchemy import select
from sqlalchemy.orm import Session

log = logging.getLogger("cutpoint.drill_schedule")
ACTIVE = (JobState.queued, JobState.running)
ACTOR = "drill-schedule"



def _drills(s: Session, g: Group) -> Any:
    return select(Job).where(Job.kind == "drill", Job.group_id == g.id)


def in_progress(s: Session, g: Group) -> Job | None:
    return s.scalar(_drills(s, g).where(Job.state.in_(ACTIVE)).limit(1))


def _verdict(j: Job) -> str:
    v = (j.result or {}).get("verdict")
    return v if v in ("passed", "failed") else (
        "passed" if j.state == JobState.succeeded else "failed")


def status(s: Session, g: Group, now: dt.datetime | None = None) -> DrillStatus:
    now = now or utcnow()
    every = g.policy.drill_every_seconds if g.policy else None
    last = s.scalar(_drills(s, g).where(Job.state.not_in(ACTIVE))
                    .order_by(Job.created_at.desc(), Job.id.desc()).limit(1))
    success = [j for j in s.scalars(_drills(s, g).where(Job.state == JobState.succeeded)
                                    .order_by(Job.finished_at.desc()).limit(20))
               if _verdict(j) == "passed"]
    last_success = as_utc(success[0].finished_at) if success else None
    newest = s.scalar(_drills(s, g).order_by(Job.created_at.desc()).limit(1))
    running = in_progress(s, g)
    if running is not None:
        result = "running"
    elif every is not None and (last_success is None
                                or (now - last_success).total_seconds() > every):
        result = "overdue"
    elif last is not None:
        result = _verdict(last)
    else:
        result = "none"
    due = None
    if every is not None:
        asked = as_utc(newest.created_at) if newest else None
        due = asked + dt.timedelta(seconds=every) if asked else now
    return DrillStatus(every_s=every, result=result, last_job_id=last.id if last else None,
                       last_finished_at=as_utc(last.finished_at) if last else None,
                       last_success_at=last_success,
                       running_job_id=running.id if running else None, next_due_at=due)


def due(s: Session, now: dt.datetime | None = None) -> list[Group]:
    """Enabled groups with a drill schedule, none in progress, and no drill asked
    for within their period."""
    now = now or utcnow()
    out = []
    for g in s.scalars(select(Group).join(Policy, Policy.group_id == Group.id).where(
            Group.enabled.is_(True), Policy.drill_every_seconds.is_not(None))):
        st = status(s, g, now)
        if st.running_job_id is None and st.next_due_at is not None and st.next_due_at <= now:
            out.append(g)
    return out


def last_checks(s: Session, g: Group) -> list[str]:
    """The checks of the group's last drill, so a schedule repeats what the operator ran."""
    j = s.scalar(_drills(s, g).where(Job.created_by != ACTOR)
                 .order_by(Job.created_at.desc()).limit(1))
    return list((j.params or {}).get("checks") or ["writer"]) if j else ["writer"]
