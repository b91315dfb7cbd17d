"""The console's pages (GET): groups with their RPO at each site, a group
(recovery points per site, replication lag, drills, actions by role; its
RPO and points polled by htmx), jobs
with live progress (htmx polls a fragment), a drill report, and the
failover form.  Each reads through the services the REST routes use; every
page needs a session (auth.User), with the viewer role as on GET /v1/...
"""

from __future__ import annotations

from typing import Annotated

from cutpoint.api.console import auth, views
from cutpoint.api.console.render import HEADERS, ConsoleRoute, page
from cutpoint.api.deps import SessionDep, SettingsDep
from cutpoint.api.errors import NotFound
from cutpoint.api.models import Job, Role
from cutpoint.api.services import drill_reports, groups
from cutpoint.api.services.common import get_or_404
from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse

router = APIRouter(prefix="/console", route_class=ConsoleRoute, include_in_schema=False)
GroupRef = Annotated[str, Path(max_length=64)]
JobRef = Annotated[str, Path(max_length=36)]


def safe_next(nxt: str | None) -> str:
    """Where to go after signing in: a console page, nothing else."""
    if nxt and nxt.startswith("/console/") and "//" not in nxt and "\\" not in nxt:
        return nxt
    return "/console/groups"


@router.get("")
@router.get("/")
def home() -> Response:
    return RedirectResponse("/console/groups", status_code=303)


@router.get("/login")
def login_form(request: Request,
               next: Annotated[str | None, Query(max_length=200)] = None,
               expired: Annotated[int, Query(ge=0, le=1)] = 0) -> Response:
    nonce = auth.new_login_nonce()
    resp = page(request, "login.html", {
        "nonce": nonce, "next": safe_next(next),
        "error": "Your session's token is unknown or revoked; sign in again." if expired
        else None})
    auth.set_login_nonce(request, resp, nonce)
    return resp


@router.get("/groups")
def group_list(request: Request, session: SessionDep, user: auth.User) -> Response:
    user.need(Role.viewer)
    return page(request, "groups.html", {"groups": views.overview(session)})


@router.get("/groups/{group}")
def group_detail(request: Request, group: GroupRef, session: SessionDep,
                 settings: SettingsDep, user: auth.User) -> Response:
    user.need(Role.viewer)
    g = groups.resolve(session, group)
    return page(request, "group.html", {"g": views.group_page(session, settings, g)})


@router.get("/groups/{group}/live")
def group_live(request: Request, group: GroupRef, session: SessionDep,
               user: auth.User) -> Response:
    """RPO at each site and the recovery points, which the group page polls."""
    user.need(Role.viewer)
    return page(request, "_group_live.html",
                {"g": views.group_live(session, groups.resolve(session, group))})


@router.get("/groups/{group}/failover")
def failover_form(request: Request, group: GroupRef, session: SessionDep,
                  user: auth.User) -> Response:
    user.need(Role.viewer)
    g = groups.resolve(session, group)
    return page(request, "failover.html", {
        "group": g.name, "target": g.policy.replication_target.name
        if g.policy and g.policy.replication_target else None,
        "points": views.dr_points(session, g), "error": None, "mode": "planned",
        "recovery_point": "latest"})


@router.get("/jobs")
def job_list(request: Request, session: SessionDep, user: auth.User) -> Response:
    user.need(Role.viewer)
    rows = views.job_list(session)
    names = views.group_names(session, {r["group_id"] for r in rows if r["group_id"]})
    return page(request, "jobs.html", {"jobs": rows, "names": names})


@router.get("/jobs/rows")
def job_rows(request: Request, session: SessionDep, user: auth.User) -> Response:
    """The jobs table's body, which the jobs page polls."""
    user.need(Role.viewer)
    rows = views.job_list(session)
    names = views.group_names(session, {r["group_id"] for r in rows if r["group_id"]})
    return page(request, "_job_rows.html", {"jobs": rows, "names": names})


@router.get("/jobs/{job_id}")
def job_detail(request: Request, job_id: JobRef, session: SessionDep,
               user: auth.User) -> Response:
    user.need(Role.viewer)
    job = views.job_page(session, get_or_404(session, Job, job_id, "job"))
    return page(request, "job.html", {"job": job})


@router.get("/jobs/{job_id}/status")
def job_status(request: Request, job_id: JobRef, session: SessionDep,
               user: auth.User) -> Response:
    """The job's state, progress and steps, which its page polls until it ends."""
    user.need(Role.viewer)
    job = views.job_page(session, get_or_404(session, Job, job_id, "job"))
    return page(request, "_job_status.html", {"job": job})


@router.get("/drills/{job_id}")
def drill_report(request: Request, job_id: JobRef, session: SessionDep,
                 user: auth.User) -> Response:
    user.need(Role.viewer)
    job = get_or_404(session, Job, job_id, "job")
    if job.kind != "drill":
        raise NotFound(f"job {job_id} is a {job.kind} job, not a drill", code="not_a_drill")
    return page(request, "drill.html", views.drill_report(session, job))


@router.get("/drills/{job_id}/report.html")
def drill_report_page(job_id: JobRef, session: SessionDep, user: auth.User) -> Response:
    """The auditor's one-page report (as GET /v1/drills/{id}/report?format=html)."""
    user.need(Role.viewer)
    ev = drill_reports.evidence(session, drill_reports.drill_job(session, job_id))
    return HTMLResponse(drill_reports.as_html(ev), headers=HEADERS)
