"""The Celery application (Redis broker) and how the API hands it jobs.

    celery -A cutpoint.api.worker:celery_app worker -Q cutpoint.snapshots,cutpoint.default
    celery -A cutpoint.api.worker:celery_app beat

Queues: `cutpoint.scheduler` carries the beat ticks alone, so a long group
snapshot can never delay the tick that decides the next one.
"""

from __future__ import annotations

from celery import Celery
from cutpoint.api import (
    beat_lock,  # noqa: F401  connects the beat's lock to beat_init
    worker_metrics,  # noqa: F401  connects the metrics port to worker_init
)
from cutpoint.api.config import Settings, get_settings

QUEUES = {
    "group_snapshot": "cutpoint.snapshots",
    "retention": "cutpoint.default",
    "inventory_sync": "cutpoint.default",
    "scheduler_tick": "cutpoint.scheduler",
    # These two talk to agents: never on the scheduler queue.
    "retention_tick": "cutpoint.default",
    "inventory_tick": "cutpoint.default",
    # Every few seconds; its own queue, so a deployment can give it a worker
    # that long snapshots and replications never hold up.
    "inventory_watch": "cutpoint.inventory",
    # Talks to agents, like a snapshot of the groups it resolves.
    "resolve_in_doubt": "cutpoint.snapshots",
    # The orphan sweeper talks to every agent: never on the scheduler queue.
    "orphan_sweep": "cutpoint.default",
    "orphan_sweep_tick": "cutpoint.default",
    # Database only, in batches.
    "history_prune_tick": "cutpoint.default",
    # Database only; the drill it asks for runs as a `drill` job.
    "drill_tick": "cutpoint.default",
    # Talks to the DR agents and the sites' Ceph: never on the scheduler queue.
    "drill_sweep_tick": "cutpoint.default",
    # HTTP to receivers, each call bounded by 10 s: never on the scheduler queue.
    "webhook_tick": "cutpoint.default",
    # DR: long-running, they talk to agents and both Ceph sites.
    "replicate": "cutpoint.default",
    "drill": "cutpoint.default",
    "failover": "cutpoint.default",
    "restore": "cutpoint.default",
    "reprotect": "cutpoint.default",
    "failback": "cutpoint.default",
}


def make_celery(settings: Settings) -> Celery:
    app = Celery("cutpoint", broker=settings.redis_url, include=["cutpoint.api.tasks"])
    app.conf.update(
        task_acks_late=True,
        # A worker killed with the task in hand must give it back, not ack it.
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue="cutpoint.default",
        task_routes={f"cutpoint.{k}": {"queue": v} for k, v in QUEUES.items()},
        task_ignore_result=True,
        task_always_eager=settings.celery_eager,
        # Redis hands an unacknowledged message out again after the
        # visibility timeout; kombu looks for such messages every
        # interval x throttle seconds (100 s by default).  One look per
        # quarter timeout makes a dead worker's job come back at a known time.
        broker_transport_options={
            "visibility_timeout": settings.broker_visibility_timeout_s,
            "unacked_restore_interval": max(1, settings.broker_visibility_timeout_s // 4),
            "unacked_restore_throttle": 1},
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        beat_schedule={
            "scheduler-tick": {"task": "cutpoint.scheduler_tick",
                               "schedule": settings.scheduler_tick_s,
                               "options": {"expires": max(2.0, settings.scheduler_tick_s * 2)}},
            "retention-tick": {"task": "cutpoint.retention_tick",
                               "schedule": settings.retention_interval_s,
                               "options": {"expires": settings.retention_interval_s}},
            "inventory-tick": {"task": "cutpoint.inventory_tick",
                               "schedule": settings.inventory_interval_s,
                               "options": {"expires": settings.inventory_interval_s}},
            "inventory-watch": {"task": "cutpoint.inventory_watch",
                                "schedule": settings.inventory_watch_s,
                                "options": {"expires": settings.inventory_watch_s}},
            "resolve-in-doubt": {"task": "cutpoint.resolve_in_doubt",
                                 "schedule": settings.resolve_interval_s,
                                 "options": {"expires": settings.resolve_interval_s}},
            "orphan-sweep": {"task": "cutpoint.orphan_sweep_tick",
                             "schedule": settings.orphan_sweep_interval_s,
                             "options": {"expires": settings.orphan_sweep_interval_s}},
            "webhook-deliveries": {"task": "cutpoint.webhook_tick",
                                   "schedule": settings.webhook_tick_s,
                                   "options": {"expires": max(2.0, settings.webhook_tick_s * 2)}},
            "drill-sweep": {"task": "cutpoint.drill_sweep_tick",
                            "schedule": settings.drill_sweep_interval_s,
                            "options": {"expires": settings.drill_sweep_interval_s}},
            "drill-schedule": {"task": "cutpoint.drill_tick",
                               "schedule": settings.drill_tick_s,
                               "options": {"expires": settings.drill_tick_s}},
            "history-prune": {"task": "cutpoint.history_prune_tick",
                              "schedule": settings.history_prune_interval_s,
                              "options": {"expires": settings.history_prune_interval_s}},
        },
    )
    return app


class _LazyCelery:
    """Build the Celery app on first use, so importing this module needs no settings."""

    _app: Celery | None = None

    def get(self) -> Celery:
        if self._app is None:
            self._app = make_celery(get_settings())
        return self._app


_lazy = _LazyCelery()


def __getattr__(name: str) -> Celery:
    if name == "celery_app":
        return _lazy.get()
    raise AttributeError(name)


_by_url: dict[str, Celery] = {}


def celery_for(settings: Settings) -> Celery:
    """A producer-side app for these settings (the API may not use the env settings)."""
    app = _by_url.get(settings.redis_url)
    if app is None:
        app = _by_url[settings.redis_url] = make_celery(settings)
    return app


DR_KINDS = frozenset({"replicate", "drill", "failover", "restore", "reprotect", "failback"})


def site_queue(site: str) -> str:
    """The queue of the DR jobs of groups protected to `site` (dr_site_queues)."""
    return f"cutpoint.site.{site}"


def send(kind: str, job_id: str, settings: Settings | None = None,
         queue: str | None = None) -> None:
    app = celery_for(settings) if settings is not None else _lazy.get()
    # Bounded retry: a request must fail fast (503) when the broker is down.
    app.send_task(f"cutpoint.{kind}", args=[job_id], queue=queue or QUEUES[kind], retry=True,
                  retry_policy={"max_retries": 2, "interval_start": 0.1,
                                "interval_step": 0.2, "interval_max": 0.5})
