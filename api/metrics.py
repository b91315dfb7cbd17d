"""Prometheus metrics.

Domain metrics are computed from the database at scrape time, so every API
replica reports the same numbers whatever worker did the work:
- cutpoint_pause_seconds (histogram per group): max pause of committed snapshots
- cutpoint_group_snapshots (gauge by group, state): outcomes by state
- cutpoint_achieved_rpo_seconds (gauge per group)
- cutpoint_rpo_misses_total (counter by group, reason)
- cutpoint_job_failures_total (counter by kind, code)
- cutpoint_agent_reachable (gauge per host: 1, 0, or absent if never tried)
The DR, drill and job-queue families are in metrics_dr.py.  Per-process
HTTP metrics come from the middleware in app.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from cutpoint.api.metrics_dr import drill_metrics, job_metrics, replication_metrics
from cutpoint.api.models import (
    Group,
    GroupSnapshot,
    Host,
    Job,
    JobState,
    PrunedJobFailures,
    RpoMiss,
    SnapState,
    utcnow,
)
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

PAUSE_BUCKETS_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)


class DbCollector(Collector):
    def __init__(self, session_factory: Callable[[], Session]) -> None:
        self._sf = session_factory

    def collect(self) -> Iterator[Metric]:
        session = self._sf()
        try:
            yield from self._collect(session)
        finally:
            session.rollback()
            session.close()

    def _collect(self, s: Session) -> Iterator[Metric]:
        # Prometheus wants base units: the buckets are kept in ms (the
        # column's unit) for the query and exported in seconds.
        pause = HistogramMetricFamily("cutpoint_pause_seconds",
                                      "Longest VM pause of each committed group snapshot",
                                      labels=["group"])
        cols = [func.sum(case((GroupSnapshot.max_pause_ms <= b, 1), else_=0))
                for b in PAUSE_BUCKETS_MS]
        rows = s.execute(select(Group.name, func.count(), func.sum(GroupSnapshot.max_pause_ms),
                                *cols)
                         .join(Group, Group.id == GroupSnapshot.group_id)
                         .where(GroupSnapshot.max_pause_ms.is_not(None))
                         .group_by(Group.name)).all()
        for name, count, total, *cum in rows:
            buckets = [(str(b / 1000), int(c or 0)) for b, c in zip(PAUSE_BUCKETS_MS, cum,
                                                                    strict=True)]
            buckets.append(("+Inf", int(count)))
            pause.add_metric([name], buckets, float(total or 0) / 1000)
        yield pause

        states = GaugeMetricFamily("cutpoint_group_snapshots",
                                   "Group snapshots by state", labels=["group", "state"])
        for name, state, n in s.execute(
                select(Group.name, GroupSnapshot.state, func.count())
                .join(Group, Group.id == GroupSnapshot.group_id)
                .group_by(Group.name, GroupSnapshot.state)).all():
            states.add_metric([name, state.value if isinstance(state, SnapState) else state], n)
        yield states

        now = utcnow()
        rpo = GaugeMetricFamily("cutpoint_achieved_rpo_seconds",
                                "Now minus the capture time of the newest recovery point",
                                labels=["group"])
        target = GaugeMetricFamily("cutpoint_rpo_target_seconds", "Policy rpo_seconds",
                                   labels=["group"])
        for g in s.scalars(select(Group)).all():
            newest = s.scalar(select(func.max(GroupSnapshot.cut_at)).where(
                GroupSnapshot.group_id == g.id, GroupSnapshot.state == SnapState.committed))
            if newest is not None:
                if newest.tzinfo is None:
                    import datetime as dt

                    newest = newest.replace(tzinfo=dt.UTC)
                rpo.add_metric([g.name], (now - newest).total_seconds())
            if g.policy is not None and g.policy.rpo_seconds is not None:
                target.add_metric([g.name], g.policy.rpo_seconds)
        yield rpo
        yield target

        misses = CounterMetricFamily("cutpoint_rpo_misses", "Recorded RPO misses",
                                     labels=["group", "reason"])
        for name, reason, n in s.execute(
                select(Group.name, RpoMiss.reason, func.count())
                .join(Group, Group.id == RpoMiss.group_id)
                .group_by(Group.name, RpoMiss.reason)).all():
            misses.add_metric([name, reason], n)
        yield misses

        fails = CounterMetricFamily("cutpoint_job_failures", "Failed jobs",
                                    labels=["kind", "code"])
        # Those history pruning deleted count too: a counter never goes down.
        failed: dict[tuple[str, str], int] = {
            (p.kind, p.error_code): p.count for p in s.scalars(select(PrunedJobFailures))}
        for kind, code, n in s.execute(
                select(Job.kind, Job.error_code, func.count())
                .where(Job.state == JobState.failed)
                .group_by(Job.kind, Job.error_code)).all():
            key = (kind, code or "unknown")
            failed[key] = failed.get(key, 0) + n
        for (kind, code), n in sorted(failed.items()):
            fails.add_metric([kind, code], n)
        yield fails

        expiry = GaugeMetricFamily("cutpoint_agent_cert_expiry_timestamp_seconds",
                                   "When the agent's certificate expires (Unix time), as "
                                   "presented at the last inventory pull",
                                   labels=["host", "site"])
        for h in s.scalars(select(Host).where(Host.cert_not_after.is_not(None))).all():
            assert h.cert_not_after is not None
            expiry.add_metric([h.name, h.site.name], h.cert_not_after.timestamp())
        yield expiry

        reach = GaugeMetricFamily("cutpoint_agent_reachable",
                                  "1 if the host's agent answered the last call, else 0",
                                  labels=["host", "site"])
        for h in s.scalars(select(Host)).all():
            if h.reachable is not None:
                reach.add_metric([h.name, h.site.name], 1.0 if h.reachable else 0.0)
        yield reach

        yield from replication_metrics(s)
        yield from drill_metrics(s)
        yield from job_metrics(s)


def make_registry(session_factory: Callable[[], Session]) -> tuple[CollectorRegistry, Counter,
                                                                   Histogram]:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(DbCollector(session_factory))
    requests = Counter("cutpoint_http_requests", "HTTP requests",
                       ["method", "route", "status"], registry=reg)
    latency = Histogram("cutpoint_http_request_seconds", "HTTP request latency",
                        ["method", "route"], registry=reg)
    return reg, requests, latency
