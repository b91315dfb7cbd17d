"""The console's actions (POST forms): sign in and out, snapshot now, start
a drill, fail over.  Each is the REST route's call with the REST route's
role, plus the session's CSRF token; a success redirects (303) to the page
that follows it, a refusal is an HTML page with the REST API's status and
code.  Being POSTs, every one is in the audit log with its final status,
as the REST calls are (app.py's middleware).

Failover asks the operator to type the group's name: the server compares
it, and anything else is refused (400 `confirmation_mismatch`) before any
precondition is checked or any job exists.
"""

from __future__ import annotations

from typing import Annotated

from cutpoint.api.console import auth, views
from cutpoint.api.console.pages import safe_next
from cutpoint.api.console.render import ConsoleRoute, page
from cutpoint.api.deps import SessionDep, SettingsDep
from cutpoint.api.errors import ApiError, Unauthorized
from cutpoint.api.models import Role
from cutpoint.api.schemas.dr import DrillRequest, FailoverRequest
from cutpoint.api.services import drills, failover, groups, queue, snapshots
from fastapi import APIRouter, Form, Path, Request, Response
from fastapi.responses import RedirectResponse
from pydantic import ValidationError

router = APIRouter(prefix="/console", route_class=ConsoleRoute, include_in_schema=False)
GroupRef = Annotated[str, Path(max_length=64)]
Csrf = Annotated[str, Form(max_length=128)]


def _see(url: str) -> Response:
    return RedirectResponse(url, status_code=303)


def _invalid(exc: ValidationError) -> ApiError:
    detail = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
    return ApiError(detail, code="validation_error", status=422)


@router.post("/login")
def login(request: Request, session: SessionDep, settings: SettingsDep,
          token: Annotated[str, Form(max_length=512)] = "",
          nonce: Annotated[str, Form(max_length=128)] = "",
          next: Annotated[str, Form(max_length=200)] = "") -> Response:
    """Check the pasted token as the REST API would, then open the session."""
    auth.check_login_nonce(request, nonce)
    token = token.strip()
    try:
        if not token:
            raise Unauthorized("paste an API token", code="token_missing")
        auth.check_token(request, session, settings, token)
    except ApiError as exc:
        # The form again, with the refusal, to try another token.
        return page(request, "login.html", {
            "nonce": nonce, "next": safe_next(next), "error": exc.detail,
            "status": exc.status, "code": exc.code}, exc.status)
    resp = _see(safe_next(next))
    auth.start(request, resp, token)
    return resp


@router.post("/logout")
def logout(request: Request, user: auth.User, csrf: Csrf = "") -> Response:
    auth.check_csrf(user, csrf)
    resp = _see("/console/login")
    auth.end(request, resp)
    return resp


@router.post("/groups/{group}/snapshot")
def snapshot_now(request: Request, group: GroupRef, session: SessionDep,
                 settings: SettingsDep, user: auth.User, csrf: Csrf = "") -> Response:
    """POST /v1/groups/{g}/snapshots: operator."""
    user.need(Role.operator)
    auth.check_csrf(user, csrf)
    g = groups.resolve(session, group)
    job = snapshots.request(session, g, trigger="manual", actor=user.name)
    queue.enqueue(session, settings, job)
    return _see(f"/console/jobs/{job.id}")


@router.post("/groups/{group}/drill")
def start_drill(request: Request, group: GroupRef, session: SessionDep,
                settings: SettingsDep, user: auth.User, csrf: Csrf = "",
                recovery_point: Annotated[str, Form(max_length=64)] = "latest",
                checks: Annotated[str, Form(max_length=300)] = "writer") -> Response:
    """POST /v1/groups/{g}/drills: operator."""
    user.need(Role.operator)
    auth.check_csrf(user, csrf)
    try:
        data = DrillRequest(recovery_point=recovery_point.strip() or "latest",
                            checks=[c.strip() for c in checks.split(",") if c.strip()])
    except ValidationError as exc:
        raise _invalid(exc) from None
    g = groups.resolve(session, group)
    job = drills.request(session, g, data.recovery_point, list(data.checks), user.name,
                         settings.booter, settings)
    queue.enqueue(session, settings, job)
    return _see(f"/console/jobs/{job.id}")


@router.post("/groups/{group}/failover")
def start_failover(request: Request, group: GroupRef, session: SessionDep,
                   settings: SettingsDep, user: auth.User, csrf: Csrf = "",
                   confirm: Annotated[str, Form(max_length=128)] = "",
                   mode: Annotated[str, Form(max_length=16)] = "",
                   recovery_point: Annotated[str, Form(max_length=64)] = "latest") \
        -> Response:
    """POST /v1/groups/{g}/failover: admin, and the group's name typed."""
    import time

    requested_at = time.time()  # the RTO's origin, as the REST route takes it
    user.need(Role.admin)
    auth.check_csrf(user, csrf)
    g = groups.resolve(session, group)
    if confirm != g.name:
        return page(request, "failover.html", {
            "group": g.name, "target": g.policy.replication_target.name
            if g.policy and g.policy.replication_target else None,
            "points": views.dr_points(session, g), "mode": mode or "planned",
            "recovery_point": recovery_point, "code": "confirmation_mismatch",
            "error": f"Refused: type the group's name, {g.name}, exactly to confirm the "
                     "failover. Nothing was done."}, status=400)
    try:
        data = FailoverRequest(recovery_point=recovery_point.strip() or "latest",
                               mode=mode)  # type: ignore[arg-type]
    except ValidationError as exc:
        raise _invalid(exc) from None
    job = failover.request(session, settings, g, data.recovery_point, data.mode, data.workload,
                           user.name, requested_at=requested_at)
    queue.enqueue(session, settings, job)
    return _see(f"/console/jobs/{job.id}")
