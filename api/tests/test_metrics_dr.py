"""/metrics: the DR, drill and job-queue families (metrics_dr.py), from the
database."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from cutpoint.api.models import (
    Group,
    GroupSnapshot,
    Job,
    JobState,
    MemberReplication,
    Policy,
    Site,
    SnapState,
    utcnow,
)


def seed_dr(session_factory: Any, name: str = "d") -> dt.datetime:
    """A group replicated to site `<name>-dr`: an older recovery point, the
    newest one (cut 100 s ago, verified 40 s later, attempt 2 after a failed
    attempt 1), a snapshot not copied yet; two drills, the last one failed;
    a queued job.  Returns the newest point's cut."""
    now = utcnow()
    with session_factory() as s:
        dr = Site(name=f"{name}-dr")
        s.add(dr)
        s.flush()
        g = Group(name=name)
        g.policy = Policy(rpo_seconds=60, replication_target_id=dr.id)
        s.add(g)
        s.flush()
        cut = now - dt.timedelta(seconds=100)
        old = GroupSnapshot(group_id=g.id, txn=f"{name}0", state=SnapState.committed,
                            cut_at=cut - dt.timedelta(seconds=600),
                            dr_verified_at=cut - dt.timedelta(seconds=590))
        new = GroupSnapshot(group_id=g.id, txn=f"{name}1", state=SnapState.committed,
                            cut_at=cut, dr_verified_at=cut + dt.timedelta(seconds=40))
        s.add_all([old, new, GroupSnapshot(group_id=g.id, txn=f"{name}2",
                                           state=SnapState.committed, cut_at=now)])
        s.flush()

        def copy(snap: GroupSnapshot, attempt: int, disk: str, state: str, shipped: int,
                 secs: float) -> MemberReplication:
            return MemberReplication(group_snapshot_id=snap.id, attempt=attempt, disk=disk,
                                     pool="rbd", image=disk, snap=snap.txn,
                                     target_site=dr.name, state=state, bytes_shipped=shipped,
                                     seconds=secs)
        s.add_all([copy(old, 1, "a", "verified", 1000, 1.0),
                   copy(new, 1, "a", "failed", 50, 9.0),
                   copy(new, 2, "a", "verified", 4000, 2.0),
                   copy(new, 2, "b", "verified", 6000, 4.0)])
        s.add(Job(id=str(uuid.uuid4()), kind="drill",
                  state=JobState.succeeded, group_id=g.id, result={"boot_s": 12.5},
                  started_at=now - dt.timedelta(seconds=300),
                  finished_at=now - dt.timedelta(seconds=200)))
        s.add(Job(id=str(uuid.uuid4()), kind="drill",
                  state=JobState.failed, group_id=g.id, result={"verdict": "failed"},
                  started_at=now - dt.timedelta(seconds=100),
                  finished_at=now - dt.timedelta(seconds=50)))
        s.add(Job(id=str(uuid.uuid4()),
                  kind="replicate", state=JobState.queued, group_id=g.id))
        s.commit()
    return cut


def _value(text: str, prefix: str) -> float:
    line = next(ln for ln in text.splitlines() if ln.startswith(prefix))
    return float(line.rsplit(" ", 1)[1])


def test_dr_drill_and_job_metrics(api: Any, session_factory: Any) -> None:
    cut = seed_dr(session_factory)
    text = api.client.get("/metrics").text
    key = '{group="d",site="d-dr"}'
    assert 100.0 <= _value(text, "cutpoint_dr_achieved_rpo_seconds" + key) < 160.0
    assert _value(text, "cutpoint_replication_lag_seconds" + key) == 40.0
    assert _value(text, "cutpoint_replication_last_verified_timestamp_seconds" + key) == \
        (cut + dt.timedelta(seconds=40)).replace(tzinfo=dt.UTC).timestamp()
    # the newest point's latest attempt: 10000 B, its slowest member 4 s
    assert _value(text, "cutpoint_replication_throughput_bytes_per_second" + key) == 2500.0
    assert _value(text, "cutpoint_replication_shipped_bytes_total" + key) == 11050.0
    assert _value(text, "cutpoint_replication_failures_total" + key) == 1.0
    # one interval: the newest point verified at cut+40, the previous cut at cut-600
    assert _value(text, "cutpoint_dr_rpo_peak_seconds_count" + key) == 1.0
    assert _value(text, "cutpoint_dr_rpo_peak_seconds_sum" + key) == 640.0
    assert _value(text, 'cutpoint_dr_rpo_peak_seconds_bucket{group="d",le="600.0",site="d-dr"}') \
        == 0.0
    assert _value(text, 'cutpoint_dr_rpo_peak_seconds_bucket{group="d",le="1800.0",site="d-dr"}') \
        == 1.0
    assert _value(text, 'cutpoint_drill_last_passed{group="d"}') == 0.0
    assert _value(text, 'cutpoint_drill_rto_seconds{group="d"}') == 12.5
    assert utcnow().timestamp() - _value(
        text, 'cutpoint_drill_last_success_timestamp_seconds{group="d"}') > 150
    assert _value(text, 'cutpoint_jobs{kind="replicate",state="queued"}') >= 1.0
    assert _value(text, 'cutpoint_job_duration_seconds_count{kind="drill"}') >= 2.0
    assert _value(text, 'cutpoint_job_duration_seconds_bucket{kind="drill",le="60.0"}') >= 1.0
