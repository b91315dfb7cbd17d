"""The RPO scheduler and a DR group's copies (services/rpo.py): it holds
the next capture while one of the group's copies waits for the copy before
it (`replication_waiting`), and it times the next capture by the longest
recent lag at DR.

Every committed snapshot is replicated, one copy at a time per group; a lab
run at a 5 s RPO, without this hold, cut a point every 1.7 s behind a slow
first copy and its DR point lagged the cut by 39 s eight minutes later.
Real databases (SQLite and PostgreSQL), the scheduler's own assessment,
with the clock given.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from cutpoint.api.models import Group, GroupSnapshot, Job, JobState, utcnow
from cutpoint.api.services import rpo
from sqlalchemy import select


def _dr_point(api: Any, dr_snapshot: Callable[..., int], rpo_s: int) -> int:
    """Group "app" replicating to "dr" with RPO `rpo_s` and one DR point, cut
    30 s ago (asked 0.2 s before) and verified 1 s after; its id."""
    snap_id = dr_snapshot(disks=(0,), dr_verified_after_s=1)
    r = api.request("PATCH", "/v1/groups/app/policy", json={"rpo_seconds": rpo_s})
    assert r.status_code == 200, r.text
    return snap_id


def _asked_before_cut(snap: GroupSnapshot) -> None:
    snap.requested_at = snap.cut_at - dt.timedelta(seconds=0.2)


def test_a_waiting_copy_holds_the_next_capture(api: Any, session_factory: Any,
                                               dr_snapshot: Callable[..., int]) -> None:
    snap_id = _dr_point(api, dr_snapshot, 10)
    now = utcnow()
    with session_factory() as s:
        g = s.scalar(select(Group).where(Group.name == "app"))
        _asked_before_cut(s.get(GroupSnapshot, snap_id))
        s.commit()
        a = rpo.assess(s, g, now, 2.0)
        assert a.due(now) and a.replication_waiting is None  # its DR point is 30 s old

        def copy(state: JobState, age_s: float) -> Job:
            job = Job(id=f"job-{state.value}-{age_s:g}", kind="replicate", state=state,
                      group_id=g.id, snapshot_id=snap_id,
                      created_at=now - dt.timedelta(seconds=age_s))
            s.add(job)
            s.commit()
            return job

        # A copy running alone does not hold the next capture: it is the one
        # the next capture's copy will wait for.
        copy(JobState.running, 3)
        assert rpo.assess(s, g, now, 2.0).due(now)
        # A copy queued behind it does.
        waiting = copy(JobState.queued, 2)
        a = rpo.assess(s, g, now, 2.0)
        assert not a.due(now) and a.replication_waiting == waiting.id
        assert rpo.miss_reason(s, g, a)[0] == "replication_behind"
        # Queued longer than the hold (a lost message): captures go on.
        waiting.created_at = now - dt.timedelta(seconds=rpo.REPLICATION_HOLD_S + 1)
        s.commit()
        a = rpo.assess(s, g, now, 2.0)
        assert a.due(now) and a.replication_waiting is None
        # A finished copy holds nothing, nor does another kind of job.
        waiting.state = JobState.succeeded
        s.add(Job(id="job-retention", kind="retention", state=JobState.queued, group_id=g.id,
                  created_at=now))
        s.commit()
        assert rpo.assess(s, g, now, 2.0).due(now)


def test_the_next_capture_is_due_by_the_longest_recent_lag(
        api: Any, session_factory: Any, dr_snapshot: Callable[..., int]) -> None:
    """Two DR points, copied 1 s and 5 s after their cuts: the next capture
    is due early enough for the 5 s one (the mean, 3 s, made the slow copies
    miss a 5 s RPO at p99); the status still shows the mean lag."""
    snap_id = _dr_point(api, dr_snapshot, 20)
    now = utcnow()
    with session_factory() as s:
        g = s.scalar(select(Group).where(Group.name == "app"))
        first = s.get(GroupSnapshot, snap_id)
        _asked_before_cut(first)
        cut = first.cut_at + dt.timedelta(seconds=10)
        s.add(GroupSnapshot(group_id=g.id, txn="t2", state=first.state,
                            requested_at=cut - dt.timedelta(seconds=0.2), cut_at=cut,
                            dr_verified_at=cut + dt.timedelta(seconds=5)))
        s.commit()
        a = rpo.assess(s, g, now, 2.0)
        assert abs(a.lag_s - 3.0) < 0.01
        assert a.newest_cut is not None and a.due_at is not None
        want = 20 - 0.2 - 5.0 - 2.0
        assert abs((a.due_at - a.newest_cut).total_seconds() - want) < 0.01, a
