"""Drills (test failover) at the DR site."""

from __future__ import annotations

from typing import Annotated, Literal

from cutpoint.api.deps import Operator, SessionDep, SettingsDep, Viewer
from cutpoint.api.schemas.dr import DrillRequest, PlanPublic
from cutpoint.api.schemas.drill_report import DrillReport
from cutpoint.api.schemas.jobs import JobPublic
from cutpoint.api.services import drill_reports, drills, groups, jobs, plans, queue
from fastapi import APIRouter, Header, Path, Query, Response
from fastapi.responses import HTMLResponse

router = APIRouter(tags=["drills"])
GroupRef = Annotated[str, Path(max_length=64, description="Group id or name")]


@router.post("/groups/{group}/drills", status_code=202, response_model=JobPublic,
             responses={404: {"description": "No such group or recovery point"},
                        409: {"description": "Not a DR recovery point, or the configured "
                                             "booter cannot boot a drill"}})
def start_drill(group: GroupRef, data: DrillRequest, session: SessionDep, token: Operator,
                settings: SettingsDep, response: Response) -> JobPublic:
    """Clone a DR recovery point, boot it isolated at DR, run the checks, clean up.

    Follow the job (`GET /v1/jobs/{id}`); its result is the drill report."""
    g = groups.resolve(session, group)
    checks = None if data.checks is None else [
        c if isinstance(c, str) else c.model_dump(exclude_none=True) for c in data.checks]
    job = drills.request(session, g, data.recovery_point, checks, token.name,
                         settings.booter, settings,
                         readiness={vm: r.model_dump(exclude_none=True)
                                    for vm, r in data.readiness.items()},
                         plan=data.plan)
    queue.enqueue(session, settings, job)
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    return jobs.public(job)


@router.get("/drills/{job_id}/report", response_model=DrillReport,
            responses={200: {"content": {"text/html": {"schema": {"type": "string"}}},
                             "description": "The report, as JSON or as one HTML page"},
                       404: {"description": "No such job, or it is not a drill"},
                       409: {"description": "The drill has not ended yet"}})
def drill_report(job_id: Annotated[str, Path(max_length=36, description="The drill's job id")],
                 session: SessionDep, token: Viewer,
                 format: Annotated[Literal["json", "html"] | None, Query(
                     description="html or json; without it, the Accept header decides "
                                 "(JSON unless text/html is asked for)")] = None,
                 accept: Annotated[str | None, Header(max_length=1024)] = None,
                 ) -> DrillReport | HTMLResponse:
    """A drill's evidence: the recovery point and its age when the drill was asked for,
    the RTO (request to the last VM ready), a timeline with one row per VM, each
    check's result and output, and the cleanup."""
    report = drill_reports.evidence(session, drill_reports.drill_job(session, job_id))
    wants_html = format == "html" or (format is None and accept is not None
                                      and "text/html" in accept)
    if wants_html:
        return HTMLResponse(drill_reports.as_html(report), headers=drill_reports.HTML_HEADERS)
    return report


def _plan_public(g_name: str, row: object) -> PlanPublic:
    return PlanPublic.model_validate({**{k: getattr(row, k) for k in (
        "version", "body", "sha256", "created_by", "created_at")}, "group": g_name})


@router.put("/groups/{group}/plan", response_model=PlanPublic,
            responses={400: {"description": "Not a usable plan, or it names a VM that is "
                                            "not a member of the group"},
                       404: {"description": "No such group"}})
def put_plan(group: GroupRef, body: dict[str, object], session: SessionDep,
             token: Operator) -> PlanPublic:
    """Store a new version of the group's recovery plan (boot groups with readiness
    and delays, hooks, the network map per purpose, drill checks: docs/drills.md).
    The same plan as the newest version is that version again."""
    g = groups.resolve(session, group)
    row = plans.put(session, g, dict(body), token.name)
    return _plan_public(g.name, row)


@router.get("/groups/{group}/plan", response_model=PlanPublic,
            responses={404: {"description": "No such group, or it has no plan (or no "
                                            "such version)"}})
def get_plan(group: GroupRef, session: SessionDep, token: Viewer,
             version: Annotated[int | None, Query(ge=1, le=1_000_000)] = None) -> PlanPublic:
    """The group's recovery plan: its newest version, or the one asked for."""
    g = groups.resolve(session, group)
    row = plans.get(session, g, version)
    return _plan_public(g.name, row)


@router.get("/groups/{group}/plan/versions", response_model=list[PlanPublic],
            responses={404: {"description": "No such group"}})
def plan_versions(group: GroupRef, session: SessionDep, token: Viewer) -> list[PlanPublic]:
    """Every version of the group's recovery plan, newest first."""
    g = groups.resolve(session, group)
    return [_plan_public(g.name, r) for r in plans.versions(session, g)]
