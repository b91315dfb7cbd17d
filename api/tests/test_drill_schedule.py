"""Scheduled drills and one drill per group (services/drill_schedule.py), over a
real database (SQLite and PostgreSQL): the policy's `drill_every`, the group's
drill standing in GET /v1/groups/{g}/rpo (passed, failed, overdue, running),
which groups beat's drill tick finds due, and the refusal of a second drill
of a group while one is queued or running."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from cutpoint.api.models import Group, Job, JobState, utcnow
from cutpoint.api.services import drill_schedule
from sqlalchemy import select

WEEK = 7 * 86400


def _drill(sf: Any, jid: str, state: JobState, age_s: float, verdict: str | None) -> None:
    with sf() as s:
        g = s.scalar(select(Group).where(Group.name == "app"))
        at = utcnow() - dt.timedelta(seconds=age_s)
        s.add(Job(id=jid, kind="drill", group_id=g.id, state=state, created_at=at,
                  finished_at=at + dt.timedelta(seconds=40) if verdict else None,
                  params={"checks": ["writer"]},
                  result={"verdict": verdict} if verdict else None))
        s.commit()


def _standing(api: Any) -> dict[str, Any]:
    r = api.as_("viewer").get("/v1/groups/app/rpo")
    assert r.status_code == 200, r.text
    return dict(r.json()["drill"])


def _due(sf: Any, later_s: float = 0) -> list[str]:
    with sf() as s:
        return [g.name for g in drill_schedule.due(s, utcnow() + dt.timedelta(seconds=later_s))]


def test_schedule_standing_and_due(api: Any, session_factory: Any,
                                   dr_snapshot: Callable[..., int]) -> None:
    dr_snapshot(dr_verified_after_s=5)
    assert _standing(api)["result"] == "none" and _due(session_factory) == []
    r = api.patch("/v1/groups/app/policy", json={"drill_every": WEEK})
    assert r.status_code == 200 and r.json()["drill_every"] == WEEK, r.text
    assert api.get("/v1/groups/app").json()["policy"]["drill_every"] == WEEK
    assert api.patch("/v1/groups/app/policy", json={"drill_every": 10}).status_code == 422
    # A schedule and no drill yet: overdue, due now.
    st = _standing(api)
    assert (st["result"], st["every_s"], st["last_success_at"]) == ("overdue", WEEK, None)
    assert _due(session_factory) == ["app"]

    # One queued: running, not due again, and a second drill is refused.
    _drill(session_factory, "00000000-0000-4000-8000-00000000d001", JobState.queued, 1, None)
    st = _standing(api)
    assert st["result"] == "running" and st["running_job_id"].endswith("d001")
    assert _due(session_factory) == []
    r = api.as_("operator").post("/v1/groups/app/drills", json={})
    assert r.status_code == 409 and r.json()["code"] == "drill_in_progress", r.text
    assert "d001" in r.json()["detail"]

    with session_factory() as s:
        j = s.get(Job, "00000000-0000-4000-8000-00000000d001")
        j.state, j.finished_at, j.result = JobState.succeeded, utcnow(), {"verdict": "passed"}
        s.commit()
    st = _standing(api)
    assert st["result"] == "passed" and st["last_success_at"] is not None
    assert _due(session_factory) == []
    # A week on, nothing passed since: overdue, and due.
    assert _due(session_factory, later_s=WEEK + 60) == ["app"]
    with session_factory() as s:
        g = s.scalar(select(Group).where(Group.name == "app"))
        later = drill_schedule.status(s, g, utcnow() + dt.timedelta(seconds=WEEK + 60))
    assert later.result == "overdue"

    # A failed drill after the pass: failed (a pass is still within the week).
    _drill(session_factory, "00000000-0000-4000-8000-00000000d002", JobState.failed, 0, "failed")
    assert _standing(api)["result"] == "failed"
    # A disabled group is never due; clearing the schedule ends "overdue".
    assert api.patch("/v1/groups/app", json={"enabled": False}).status_code == 200
    assert _due(session_factory, later_s=WEEK + 60) == []
    r = api.patch("/v1/groups/app/policy", json={"clear_drill": True})
    assert r.status_code == 200 and r.json()["drill_every"] is None
    assert _standing(api)["next_due_at"] is None


def test_a_scheduled_drill_repeats_the_operators_checks(session_factory: Any, api: Any,
                                                        dr_snapshot: Callable[..., int]) -> None:
    dr_snapshot(dr_verified_after_s=5)
    with session_factory() as s:
        g = s.scalar(select(Group).where(Group.name == "app"))
        assert drill_schedule.last_checks(s, g) == ["writer"]
        s.add(Job(id="00000000-0000-4000-8000-00000000d003", kind="drill", group_id=g.id,
                  state=JobState.succeeded, created_by="test-operator",
                  params={"checks": ["writer", "postgres"]}))
        s.add(Job(id="00000000-0000-4000-8000-00000000d004", kind="drill", group_id=g.id,
                  state=JobState.succeeded, created_by=drill_schedule.ACTOR,
                  created_at=utcnow() + dt.timedelta(seconds=1), params={"checks": ["x"]}))
        s.commit()
        assert drill_schedule.last_checks(s, g) == ["writer", "postgres"]
