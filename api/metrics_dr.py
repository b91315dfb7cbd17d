"""Prometheus metrics of DR, drills and the job queue, computed from the
database at scrape time like the rest of /metrics (metrics.py):

- cutpoint_dr_achieved_rpo_seconds (gauge by group, site): now minus the cut
  of the newest DR recovery point: the data lost if the primary died now
- cutpoint_dr_rpo_peak_seconds (histogram by group, site): for each DR
  recovery point after the first, the achieved RPO at DR just before it was
  verified (its verification minus the newest cut at DR before it): the worst
  loss window each interval had, so p99 of it is the DR RPO p99
- cutpoint_replication_last_verified_timestamp_seconds (gauge by group, site)
- cutpoint_replication_lag_seconds (gauge by group, site): cut to verified at
  DR, for the newest recovery point
- cutpoint_replication_throughput_bytes_per_second (gauge by group, site): of
  that copy's latest attempt
- cutpoint_replication_shipped_bytes_total, cutpoint_replication_failures_total
  (counters by group, site): over the member copies the database still holds
  (deleting a group snapshot drops its rows; Prometheus reads the drop as a
  counter reset)
- cutpoint_drill_last_passed (gauge by group: 1 or 0),
  cutpoint_drill_last_success_timestamp_seconds, cutpoint_drill_rto_seconds
  (the last passed drill: from its start to every clone booted)
- cutpoint_jobs (gauge by kind, state): `state="queued"` is the queue depth
- cutpoint_job_duration_seconds (histogram by kind): started to finished
"""

from __future__ import annotations

from collections.abc import Iterator

from cutpoint.api.models import (
    Group,
    GroupSnapshot,
    Job,
    JobState,
    MemberReplication,
    as_utc,
    utcnow,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

JOB_BUCKETS_S = (1, 5, 15, 60, 300, 900, 3600, 4 * 3600)
DR_RPO_BUCKETS_S = (5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600)



def replication_metrics(s: Session) -> Iterator[Metric]:
    labels = ["group", "site"]
    rpo = GaugeMetricFamily("cutpoint_dr_achieved_rpo_seconds",
                            "Now minus the cut of the newest DR recovery point", labels=labels)
    verified = GaugeMetricFamily("cutpoint_replication_last_verified_timestamp_seconds",
                                 "When the newest DR recovery point was verified (Unix time)",
                                 labels=labels)
    lag = GaugeMetricFamily("cutpoint_replication_lag_seconds",
                            "Cut to verified at DR, for the newest DR recovery point",
                            labels=labels)
    rate = GaugeMetricFamily("cutpoint_replication_throughput_bytes_per_second",
                             "Bytes shipped per second by the newest DR recovery point's copy",
                             labels=labels)
    now = utcnow()
    for g in s.scalars(select(Group)).all():
        target = g.policy.replication_target if g.policy is not None else None
        if target is None:
            continue
        snap = s.scalar(select(GroupSnapshot).where(
            GroupSnapshot.group_id == g.id, GroupSnapshot.dr_verified_at.is_not(None))
            .order_by(GroupSnapshot.cut_at.desc()).limit(1))
        if snap is None or snap.cut_at is None or snap.dr_verified_at is None:
            continue
        key = [g.name, target.name]
        cut, at = as_utc(snap.cut_at), as_utc(snap.dr_verified_at)
        rpo.add_metric(key, (now - cut).total_seconds())
        verified.add_metric(key, at.timestamp())
        lag.add_metric(key, (at - cut).total_seconds())
        attempt = s.scalar(select(func.max(MemberReplication.attempt)).where(
            MemberReplication.group_snapshot_id == snap.id))
        shipped, secs = s.execute(
            select(func.sum(MemberReplication.bytes_shipped), func.max(MemberReplication.seconds))
            .where(MemberReplication.group_snapshot_id == snap.id,
                   MemberReplication.attempt == attempt)).one()
        if secs:
            rate.add_metric(key, float(shipped or 0) / float(secs))
    yield from (rpo, verified, lag, rate)
    yield _dr_rpo_peaks(s)

    shipped_total = CounterMetricFamily("cutpoint_replication_shipped_bytes",
                                        "Bytes cutpoint-sync shipped to DR", labels=labels)
    failures = CounterMetricFamily("cutpoint_replication_failures",
                                   "Member copies to DR that failed", labels=labels)
    rows = s.execute(
        select(Group.name, MemberReplication.target_site,
               func.sum(MemberReplication.bytes_shipped),
               func.sum(case((MemberReplication.state == "failed", 1), else_=0)))
        .join(GroupSnapshot, GroupSnapshot.id == MemberReplication.group_snapshot_id)
        .join(Group, Group.id == GroupSnapshot.group_id)
        .group_by(Group.name, MemberReplication.target_site)).all()
    for name, site, nbytes, nfailed in rows:
        shipped_total.add_metric([name, site], float(nbytes or 0))
        failures.add_metric([name, site], float(nfailed or 0))
    yield shipped_total
    yield failures


def _dr_rpo_peaks(s: Session) -> Metric:
    hist = HistogramMetricFamily("cutpoint_dr_rpo_peak_seconds",
                                 "Achieved RPO at DR just before each recovery point was "
                                 "verified", labels=["group", "site"])
    for g in s.scalars(select(Group)).all():
        target = g.policy.replication_target if g.policy is not None else None
        if target is None:
            continue
        points = s.execute(select(GroupSnapshot.cut_at, GroupSnapshot.dr_verified_at).where(
            GroupSnapshot.group_id == g.id, GroupSnapshot.dr_verified_at.is_not(None),
            GroupSnapshot.cut_at.is_not(None)).order_by(GroupSnapshot.dr_verified_at)).all()
        # In verification order; the newest cut at DR so far, since an older
        # snapshot can be verified after a newer one.
        peaks: list[float] = []
        newest = None
        for cut, verified in points:
            if newest is not None:
                peaks.append((as_utc(verified) - newest).total_seconds())
            newest = as_utc(cut) if newest is None else max(newest, as_utc(cut))
        if not peaks:
            continue
        buckets = [(str(float(b)), sum(1 for x in peaks if x <= b)) for b in DR_RPO_BUCKETS_S]
        buckets.append(("+Inf", len(peaks)))
        hist.add_metric([g.name, target.name], buckets, sum(peaks))
    return hist


def drill_metrics(s: Session) -> Iterator[Metric]:
    passed = GaugeMetricFamily("cutpoint_drill_last_passed",
                               "1 if the group's last finished drill passed, else 0",
                               labels=["group"])
    success = GaugeMetricFamily("cutpoint_drill_last_success_timestamp_seconds",
                                "When the group's last passed drill finished (Unix time)",
                                labels=["group"])
    rto = GaugeMetricFamily("cutpoint_drill_rto_seconds",
                            "The last passed drill: from its start to every clone booted",
                            labels=["group"])
    done = (JobState.succeeded, JobState.failed)
    for g in s.scalars(select(Group)).all():
        last = s.scalar(select(Job).where(Job.kind == "drill", Job.group_id == g.id,
                                          Job.state.in_(done), Job.finished_at.is_not(None))
                        .order_by(Job.finished_at.desc()).limit(1))
        if last is None:
            continue
        passed.add_metric([g.name], 1.0 if last.state == JobState.succeeded else 0.0)
        ok = last if last.state == JobState.succeeded else s.scalar(
            select(Job).where(Job.kind == "drill", Job.group_id == g.id,
                              Job.state == JobState.succeeded, Job.finished_at.is_not(None))
            .order_by(Job.finished_at.desc()).limit(1))
        if ok is not None and ok.finished_at is not None:
            success.add_metric([g.name], as_utc(ok.finished_at).timestamp())
            boot_s = (ok.result or {}).get("boot_s")
            if isinstance(boot_s, (int, float)):
                rto.add_metric([g.name], float(boot_s))
    yield from (passed, success, rto)


def job_metrics(s: Session) -> Iterator[Metric]:
    jobs = GaugeMetricFamily("cutpoint_jobs", "Jobs by kind and state; queued is the backlog",
                             labels=["kind", "state"])
    for kind, state, n in s.execute(select(Job.kind, Job.state, func.count())
                                    .group_by(Job.kind, Job.state)).all():
        jobs.add_metric([kind, state.value if isinstance(state, JobState) else state], n)
    yield jobs

    hist = HistogramMetricFamily("cutpoint_job_duration_seconds",
                                 "Finished jobs, from started to finished", labels=["kind"])
    per_kind: dict[str, list[float]] = {}
    for kind, started, finished in s.execute(
            select(Job.kind, Job.started_at, Job.finished_at).where(
                Job.started_at.is_not(None), Job.finished_at.is_not(None))).all():
        per_kind.setdefault(kind, []).append(
            max(0.0, (as_utc(finished) - as_utc(started)).total_seconds()))
    for kind, secs in sorted(per_kind.items()):
        buckets = [(str(float(b)), sum(1 for x in secs if x <= b)) for b in JOB_BUCKETS_S]
        buckets.append(("+Inf", len(secs)))
        hist.add_metric([kind], buckets, sum(secs))
    yield hist
