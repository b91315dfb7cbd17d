"""The FastAPI application: `uvicorn --factory cutpoint.api.app:create_app`."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import redis
from cutpoint.api import console, errors, logs
from cutpoint.api.config import Settings, get_settings
from cutpoint.api.db import get_sessionmaker
from cutpoint.api.errors import Unavailable
from cutpoint.api.metrics import make_registry
from cutpoint.api.openapi_roles import declare_roles
from cutpoint.api.routes import (
    audit,
    groups,
    hosts,
    inventory,
    jobs,
    orphans,
    sites,
    snapshots,
    tokens,
    vm_definitions,
    webhooks,
)
from cutpoint.api.services import audit as audit_service
from cutpoint.api.version import VERSION
from fastapi import APIRouter, FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

log = logging.getLogger("cutpoint.api")
MUTATING = {"POST", "PUT", "PATCH", "DELETE"}


def create_app(settings: Settings | None = None,
               session_factory: sessionmaker[Session] | None = None) -> FastAPI:
    settings = settings or get_settings()
    logs.configure(settings.log_level)
    app = FastAPI(
        title="cutpoint", version=VERSION,
        description="Crash-consistent group snapshots of QEMU/KVM VMs, and DR built on them.",
        openapi_url="/v1/openapi.json", docs_url="/v1/docs", redoc_url=None,
    )
    app.state.settings = settings
    app.state.session_factory = session_factory or get_sessionmaker(settings.database_url)
    app.state.read_session_factory = session_factory or get_sessionmaker(
        settings.database_url, readonly=True)
    registry, http_requests, http_latency = make_registry(
        lambda: app.state.read_session_factory())
    errors.install(app)
    errors.document(app)

    v1 = APIRouter(prefix="/v1")
    for r in (sites, hosts, inventory, vm_definitions, groups, snapshots, orphans, jobs, audit,
              tokens, webhooks):
        declare_roles(r.router)
        v1.include_router(r.router)
    from cutpoint.api.routes import (  # DR
        drills,
        failover,
        replication,
        reprotect,
        restore,
    )
    for r in (replication, drills, failover, reprotect, restore):
        declare_roles(r.router)
        v1.include_router(r.router)
    app.include_router(v1)
    # The web console (/console): HTML over the same services, tokens and roles.
    console.mount(app)

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        """The process is up (no dependencies checked)."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"], responses={503: {"description": "Not ready"}})
    def readyz() -> dict[str, Any]:
        """The database and the broker both answer."""
        checks: dict[str, str] = {}
        try:
            with app.state.session_factory() as s:
                s.execute(text("SELECT 1"))
            checks["database"] = "ok"
        except Exception as exc:  # noqa: BLE001  any failure means not ready
            checks["database"] = f"{type(exc).__name__}: {exc}"[:300]
        try:
            r = redis.Redis.from_url(settings.redis_url, socket_timeout=1,
                                     socket_connect_timeout=1)
            r.ping()
            r.close()
            checks["broker"] = "ok"
        except Exception as exc:  # noqa: BLE001  any failure means not ready
            checks["broker"] = f"{type(exc).__name__}: {exc}"[:300]
        if any(v != "ok" for v in checks.values()):
            raise Unavailable("not ready: " + ", ".join(f"{k}={v}" for k, v in checks.items()),
                              code="not_ready", extra={"checks": checks})
        return {"status": "ok", "checks": checks}

    @app.get("/metrics", tags=["health"], response_class=Response)
    def metrics() -> Response:
        """Prometheus text format."""
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.middleware("http")
    async def _observe(request: Request,
                       call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        rid = request.headers.get("X-Request-Id") or str(uuid.uuid4())
        rid = rid[:36]
        request.state.actor = None
        request.state.role = None
        request.state.request_id = rid
        request.state.audit_id = None
        t0 = time.perf_counter()
        status = 500
        response: Response | None = None
        try:
            response = await call_next(request)
            status = response.status_code
        finally:
            route = request.scope.get("route")
            rpath = getattr(route, "path", "unmatched")
            http_requests.labels(request.method, rpath, str(status)).inc()
            http_latency.labels(request.method, rpath).observe(time.perf_counter() - t0)
            if request.method in MUTATING:
                refused = _audit(app, request, status, rid)
                if refused is not None and response is not None:
                    response = refused
        assert response is not None
        response.headers["X-Request-Id"] = rid
        return response

    return app


def _audit(app: FastAPI, request: Request, status: int, rid: str) -> Response | None:
    """Every mutating call is recorded, refused ones included (actor null if
    unknown).  A change was committed together with its row (services/audit.py);
    here the row gets the final status, or is written now for a call that
    committed nothing.  A successful call that could not be recorded at all
    is answered 503 instead (returned here)."""
    entry_id = request.state.audit_id
    try:
        with app.state.session_factory() as s:
            if entry_id is not None:
                audit_service.finish(s, entry_id, status)
            else:
                audit_service.record(
                    s, actor=request.state.actor, role=request.state.role,
                    method=request.method, path=request.url.path, status=status,
                    request_id=rid, remote=request.client.host if request.client else None,
                    detail={"query": str(request.url.query)[:500]} if request.url.query
                    else None)
    except Exception as exc:
        if entry_id is not None:
            # The change and its row are committed; only the final status
            # is missing (the row keeps the route's success status).
            log.exception("audit status update failed for %s %s (row %s)", request.method,
                          request.url.path, entry_id)
            return None
        log.exception("audit write failed for %s %s", request.method, request.url.path)
        if status < 400:
            return errors.problem(503, "audit_unavailable", "Service unavailable",
                                  str(audit_service.AuditUnavailable(exc)), request.url.path)
    return None
