"""A drill job's report as evidence: the drill's own report (what
coordinator.dr.drill wrote into the job's result) with what only the
control plane knows, the group, the recovery point's cut and so its age
when the drill was asked for (the RPO the drill proved), and the RTO from
the request to the last VM ready.  Served as JSON and as one HTML page.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from cutpoint.api.errors import Conflict, NotFound
from cutpoint.api.models import Group, GroupSnapshot, Job, as_utc
from cutpoint.api.schemas.drill_report import DrillReport
from cutpoint.api.services.common import get_or_404
from cutpoint.coordinator.dr import drill_report, drill_timeline
from sqlalchemy.orm import Session

DONE = ("succeeded", "failed")
# The page has no script and no external asset: nothing else may load.
HTML_HEADERS = {"Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'",
                "X-Content-Type-Options": "nosniff"}
CHECK_FIELDS = ("name", "ok", "summary", "seconds")



def drill_job(s: Session, job_id: str) -> Job:
    job = get_or_404(s, Job, job_id, "job")
    if job.kind != "drill":
        raise NotFound(f"job {job_id} is a {job.kind} job, not a drill", code="not_a_drill")
    return job


def _rto_s(rep: dict[str, Any], requested: dt.datetime, rows: list[dict[str, Any]]) -> float | None:
    """Request -> the last VM ready, on the wall clock the drill stamped its events with."""
    start = next((e for e in rep.get("timeline") or [] if e.get("step") == "start"), None)
    ready = [r["ready_s"] for r in rows]
    if start is None or not ready or None in ready:
        return None
    last_ready_at = float(start["at"]) + max(ready) - float(start["t_s"])
    return round(last_ready_at - requested.timestamp(), 3)


def evidence(s: Session, job: Job) -> DrillReport:
    rep = dict(job.result or {})
    state = job.state.value
    if not rep and state not in DONE:
        raise Conflict(f"drill job {job.id} is {state}: its report is written when it ends",
                       code="drill_not_finished")
    snap = s.get(GroupSnapshot, job.snapshot_id) if job.snapshot_id else None
    group = s.get(Group, job.group_id) if job.group_id else None
    requested = as_utc(job.created_at)
    assert requested is not None  # a job always has its creation time
    cut = as_utc(snap.cut_at) if snap else None
    rows = drill_timeline.vm_rows(rep)
    checks = [{**{k: c.get(k) for k in CHECK_FIELDS},
               "summary": str(c.get("summary") or ""), "ok": bool(c.get("ok")),
               "output": {k: v for k, v in c.items() if k not in CHECK_FIELDS}}
              for c in rep.get("checks") or []]
    return DrillReport(
        job_id=job.id, drill_id=rep.get("drill_id"), group=group.name if group else None,
        state=state, verdict=rep.get("verdict") or ("pending" if state not in DONE else "none"),
        error=rep.get("error") or job.error, recovery_point=rep.get("recovery_point"),
        point_cut_at=cut,
        point_age_s=round((requested - cut).total_seconds(), 3) if cut else None,
        requested_at=requested, finished_at=as_utc(job.finished_at),
        rto_s=_rto_s(rep, requested, rows), booter=rep.get("booter"), vms=rows,  # type: ignore[arg-type]
        checks=checks, cleanup=rep.get("cleanup") or {},  # type: ignore[arg-type]
        boot_order=list(rep.get("boot_order") or []),
        timeline=list(rep.get("timeline") or []))


def as_html(r: DrillReport) -> str:
    return drill_report.render_evidence(r.model_dump(mode="json"))
