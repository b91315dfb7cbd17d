"""Problem-style JSON errors (RFC 9457) with a stable `code`.

Services raise `ApiError` subclasses; the handlers below turn them, and
FastAPI's own validation and HTTP errors, into `application/problem+json`:

    {"type": "https://cutpoint.dev/problems/<code>", "title": "...",
     "status": 409, "code": "disk_in_other_group", "detail": "...",
     "instance": "/v1/groups/3/members"}

Clients switch on `code`; `title`/`detail` are for humans and may change.
"""

from __future__ import annotations

import logging
from typing import Any

from cutpoint.coordinator.dr.ceph_errors import CephError
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("cutpoint.api")
PROBLEM = "application/problem+json"
TYPE_BASE = "https://cutpoint.dev/problems/"


class ApiError(Exception):
    status = 400
    code = "bad_request"
    title = "Bad request"

    def __init__(self, detail: str, *, code: str | None = None, status: int | None = None,
                 extra: dict[str, Any] | None = None, headers: dict[str, str] | None = None):
        super().__init__(detail)
        self.detail = detail
        if code:
            self.code = code
        if status:
            self.status = status
        self.extra = extra or {}
        self.headers = headers or {}


class NotFound(ApiError):
    status, code, title = 404, "not_found", "Not found"


class Conflict(ApiError):
    status, code, title = 409, "conflict", "Conflict"


class PreconditionFailed(ApiError):
    status, code, title = 412, "precondition_failed", "Precondition failed"


class Unauthorized(ApiError):
    status, code, title = 401, "unauthorized", "Unauthorized"

    def __init__(self, detail: str, **kw: Any) -> None:
        kw.setdefault("headers", {"WWW-Authenticate": 'Bearer realm="cutpoint"'})
        super().__init__(detail, **kw)


class Forbidden(ApiError):
    status, code, title = 403, "forbidden", "Forbidden"


class Unavailable(ApiError):
    status, code, title = 503, "unavailable", "Service unavailable"


_HTTP_CODES = {
    400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
    405: "method_not_allowed", 406: "not_acceptable", 409: "conflict",
    412: "precondition_failed", 413: "too_large", 415: "unsupported_media_type",
    422: "validation_error", 429: "too_many_requests",
}


# A Ceph failure that reaches a route (docs/api.md, "Ceph errors").  The
# Ceph object is never the resource the URL names, so a missing one is a
# conflict with what the request needs, not 404; the rest are the site's
# cluster failing the control plane: a bad gateway, unavailable, or a
# gateway timeout.
CEPH_STATUS = {"ceph_not_found": 409, "ceph_exists": 409, "ceph_permission_denied": 502,
               "ceph_unreachable": 503, "ceph_timeout": 504, "ceph_error": 502}


def ceph_problem_extra(exc: CephError) -> dict[str, Any]:
    return {"site": exc.site, "op": exc.op, "object": exc.obj, "errno": exc.errno}


def problem(status: int, code: str, title: str, detail: str, instance: str,
            extra: dict[str, Any] | None = None,
            headers: dict[str, str] | None = None) -> JSONResponse:
    body: dict[str, Any] = {"type": TYPE_BASE + code, "title": title, "status": status,
                            "code": code, "detail": detail, "instance": instance}
    if extra:
        body.update(extra)
    return JSONResponse(body, status_code=status, media_type=PROBLEM, headers=headers)


class Problem(BaseModel):
    """An error response (RFC 9457), as every route and handler here sends it."""

    model_config = ConfigDict(extra="allow")
    type: str
    title: str
    status: int
    code: str = Field(description="Stable machine-readable error code")
    detail: str
    instance: str


# Which problems an operation can answer with, and why (what document() adds).
_PROBLEMS = {
    400: "Bad request (a body that is not JSON, a cursor this API did not hand out, ...)",
    401: "No valid bearer token",
    403: "The token's role may not do this",
    404: "A resource named in the path, query or body does not exist",
    409: "Conflict with the current state (a name taken, a snapshot in flight, ...)",
    412: "If-Match does not match the resource's current ETag",
    422: "Invalid request (the fields that failed are in `errors`)",
    503: "A dependency is unavailable (the job broker, the audit log): nothing was done",
}


def _statuses(method: str, op: dict[str, Any]) -> list[int]:
    out = [400, 401, 403, 404, 422]
    if method in ("post", "put", "patch", "delete"):
        out += [409, 503]
    if any(p.get("in") == "header" and p.get("name", "").lower() == "if-match"
           for p in op.get("parameters", [])):
        out.append(412)
    return sorted(out)


def document(app: FastAPI, prefix: str = "/v1/") -> None:
    """Describe in the OpenAPI document every error an operation under
    `prefix` can answer, as the problem+json document it really is (FastAPI
    alone documents only a 422 of its own, as application/json)."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = generate()
        comps = schema.setdefault("components", {}).setdefault("schemas", {})
        comps["Problem"] = Problem.model_json_schema()
        ref = {"content": {PROBLEM: {"schema": {"$ref": "#/components/schemas/Problem"}}}}
        for path, ops in schema.get("paths", {}).items():
            for method, op in ops.items():
                responses = op.setdefault("responses", {})
                statuses = _statuses(method, op) if path.startswith(prefix) else [
                    int(st) for st in responses if str(st).isdigit() and int(st) >= 400]
                for st in statuses:
                    responses[str(st)] = {"description": _PROBLEMS.get(
                        st, responses.get(str(st), {}).get("description", "Error")), **ref}
        for name in ("HTTPValidationError", "ValidationError"):
            comps.pop(name, None)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return problem(exc.status, exc.code, exc.title, exc.detail, request.url.path,
                       exc.extra, exc.headers)

    @app.exception_handler(CephError)
    async def _ceph(request: Request, exc: CephError) -> JSONResponse:
        return problem(CEPH_STATUS.get(exc.code, 502), exc.code, "Ceph call failed", str(exc),
                       request.url.path, ceph_problem_extra(exc))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")),
                   "type": str(e.get("type", ""))} for e in exc.errors()]
        return problem(422, "validation_error", "Invalid request",
                       "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors),
                       request.url.path, {"errors": errors})

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _HTTP_CODES.get(exc.status_code, f"http_{exc.status_code}")
        return problem(exc.status_code, code, code.replace("_", " ").capitalize(),
                       str(exc.detail), request.url.path, None,
                       dict(exc.headers) if exc.headers else None)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return problem(500, "internal", "Internal error",
                       f"{type(exc).__name__}; see the server log", request.url.path)
