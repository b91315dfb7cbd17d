"""A failover's timeline: every step as a job event, and where the RTO went.

    steps = Steps(sf, job_id, t_request)
    steps.mark("fence", {"stopped": [...]})          # an event now, t_s from the request
    steps.timeline                                    # the result's timeline
    breakdown(timeline)                               # RTO split between milestones

Each step is written to `job_events` as it happens (`GET /v1/jobs/{id}/events`),
so a failover that fails or is killed still shows how far it got; the
result's `timeline` holds the same steps.  `t_s` counts from the HTTP request
(`t_request` is that instant on this process's monotonic clock).
"""

from __future__ import annotations

import time
from typing import Any

# Timeline milestones and the breakdown key of the span that ends at each.
MILESTONES = {"worker_start": "queue_wait_s", "preconditions": "preconditions_s",
              "final_snapshot": "final_snapshot_s", "replicated": "replication_s",
              "fence": "fence_s", "stopped_snapshot": "stopped_snapshot_s",
              "stopped_replicated": "stopped_replication_s", "epoch": "epoch_s",
              "failover_start": "setup_s", "rollback": "rollback_s", "running": "boot_s"}


class Steps:
    """The job's own steps: appended to `timeline` and written as job events."""

    def __init__(self, sf: Any, job_id: str, t_request: float) -> None:
        self.sf, self.job_id, self.t_request = sf, job_id, t_request
        self.timeline: list[dict[str, Any]] = [{"t_s": 0.0, "step": "request"}]

    def now(self) -> float:
        return round(time.monotonic() - self.t_request, 3)

    def mark(self, step: str, detail: dict[str, Any] | None = None, *,
             status: str = "ok") -> dict[str, Any]:
        e = {"t_s": self.now(), "step": step, **(detail or {})}
        if status != "ok":
            e["status"] = status
        self.timeline.append(e)
        self.record(step, e["t_s"], detail, status)
        return e

    def record(self, step: str, t_s: float | None, detail: dict[str, Any] | None,
               status: str = "ok") -> None:
        """A job event only (the coordinator's steps: their timeline is its own)."""
        from cutpoint.api.services import jobs

        with self.sf() as s:
            jobs.add_event(s, self.job_id, step, status=status, t_s=t_s, detail=detail)


def breakdown(timeline: list[dict[str, Any]]) -> dict[str, float | None]:
    """Where the RTO went: each milestone minus the one before it (`t_s` from the request).

    A step absent from this run (unplanned: no final snapshot) is None."""
    out: dict[str, float | None] = dict.fromkeys(MILESTONES.values())
    prev = 0.0
    seen: set[str] = set()
    for e in sorted(timeline, key=lambda e: e["t_s"]):
        step = str(e["step"])
        if step in MILESTONES and step not in seen:
            seen.add(step)
            out[MILESTONES[step]] = round(float(e["t_s"]) - prev, 3)
            prev = float(e["t_s"])
    return out
