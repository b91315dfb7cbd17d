"""A failover job whose group lock is lost mid-way (Redis gone: the
heartbeat cannot refresh it) still fails with where it stopped, whether
production was touched and the next step (the fault matrix's "kill -9 of
Redis | failover" cell, docs/reliability.md).

The job's session factory is fenced by the lock (grouplock.py): once the
lock is lost it refuses every write, the failure path's `failed` event
too.  Here a factory that starts refusing (LockLost) at the moment the
run loses its lock, after the primary was fenced, stands for it; the run's
steps up to that point are replaced by setting its stage.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from cutpoint.api.grouplock import LockLost
from cutpoint.api.models import Group, Job
from cutpoint.api.services import failover
from cutpoint.api.services.failover_recovery import FENCED
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker


class _Fenced:
    """A session factory whose sessions refuse to commit once `lost` is set."""

    def __init__(self, sf: sessionmaker[Session]) -> None:
        self.sf, self.lost = sf, False

    def __call__(self) -> Session:
        s = self.sf()
        commit = s.commit

        def guarded() -> None:
            if self.lost:
                s.rollback()
                raise LockLost("cutpoint:lock:group:1", "the heartbeat could not refresh it")
            commit()
        s.commit = guarded  # type: ignore[method-assign]
        return s


def test_a_lost_lock_fails_the_failover_with_its_stage_and_next_step(
        session_factory: sessionmaker[Session], settings: Any,
        dr_snapshot: Callable[..., int], monkeypatch: pytest.MonkeyPatch) -> None:
    snap_id = dr_snapshot()
    with session_factory() as s:
        g = s.scalar(select(Group).where(Group.name == "app"))
        assert g is not None
        job = Job(id=str(uuid.uuid4()), kind="failover", group_id=g.id, snapshot_id=snap_id,
                  params={"mode": "unplanned"})
        s.add(job)
        s.commit()
        job_id = job.id
    fsf = _Fenced(session_factory)

    def go(run: Any) -> dict[str, Any]:
        run.stage = FENCED          # the primary stopped and fenced
        run.epoch = 1
        fsf.lost = True             # then Redis goes, and the lock with it
        raise LockLost("cutpoint:lock:group:1", "the heartbeat could not refresh it")
    monkeypatch.setattr(failover._Run, "go", go)

    with pytest.raises(failover.FailoverFailed) as ei:
        failover.run_job(fsf, settings, job_id)
    res = ei.value.result
    print(f"\n{ei.value.code}: {ei.value}\n{res}")
    assert ei.value.code == "lock_lost"
    assert res["stage"] == FENCED and res["production_touched"] is True
    assert "Retry" in res["next_step"] and "epoch 1" in res["next_step"]
    assert next(e for e in res["timeline"] if e["step"] == "failed")["stage"] == FENCED
