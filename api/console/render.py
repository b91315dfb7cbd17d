"""Rendering: the Jinja2 templates, their filters, the security headers of
every console response, and the console's routes' error pages.

`ConsoleRoute` is the route class of the console's router: an error a
service raises (the REST API's problems: 403 role_insufficient, 409
snapshot_in_flight, ...) becomes an HTML page with the same status, code
and detail instead of problem JSON, and a request without a valid session
goes to the sign-in page (an htmx fragment request gets 401 and an
`HX-Redirect` there instead).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from cutpoint.api.console.auth import LoginRequired
from cutpoint.api.errors import CEPH_STATUS, ApiError
from cutpoint.coordinator.dr.ceph_errors import CephError
from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import RedirectResponse
from fastapi.routing import APIRoute
from fastapi.templating import Jinja2Templates

HERE = Path(__file__).resolve().parent
templates = Jinja2Templates(directory=str(HERE / "templates"))

# Only the console's own files; no inline script, no eval (htmx's polling
# and forms need neither), nothing framed.  Inline style attributes carry
# progress bar widths.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
       "img-src 'self' data:; connect-src 'self'; form-action 'self'; "
       "frame-ancestors 'none'; base-uri 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Frame-Options": "DENY",
           "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin",
           "Cache-Control": "no-store"}


def duration(seconds: float | None) -> str:
    """12.3 s, 4 min 05 s, 2 h 07 min, 3 d 04 h."""
    if seconds is None:
        return "-"
    s = float(seconds)
    sign = "-" if s < 0 else ""
    s = abs(s)
    if s < 60:
        return f"{sign}{s:.1f} s"
    m, sec = divmod(int(s), 60)
    if m < 60:
        return f"{sign}{m} min {sec:02d} s"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{sign}{h} h {m:02d} min"
    d, h = divmod(h, 24)
    return f"{sign}{d} d {h:02d} h"


def stamp(t: dt.datetime | str | None) -> str:
    """UTC, to the second, always whole (never cut)."""
    if t is None:
        return "-"
    if isinstance(t, str):
        try:
            t = dt.datetime.fromisoformat(t)
        except ValueError:
            return t
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return t.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def epoch_stamp(t: float | None) -> str:
    return "-" if t is None else stamp(dt.datetime.fromtimestamp(float(t), dt.UTC))


def size(n: int | None) -> str:
    """Bytes in binary units, as rbd prints them: 512 B, 64 MiB, 1.5 GiB."""
    if n is None:
        return "-"
    v = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if v < 1024 or unit == "TiB":
            return f"{int(v)} {unit}" if v == int(v) else f"{v:.1f} {unit}"
        v /= 1024
    return f"{n} B"  # not reached


templates.env.filters["duration"] = duration
templates.env.filters["size"] = size
templates.env.filters["stamp"] = stamp
templates.env.filters["epoch_stamp"] = epoch_stamp
templates.env.filters["pct"] = lambda p: f"{100 * float(p or 0):.0f}"


def page(request: Request, name: str, context: dict[str, Any], status: int = 200) -> Response:
    ctx = {"user": getattr(request.state, "console_user", None), **context}
    return templates.TemplateResponse(request, name, ctx, status_code=status)


def error_page(request: Request, status: int, code: str, detail: str) -> Response:
    return page(request, "error.html", {"status": status, "code": code, "detail": detail},
                status)


def to_login(request: Request, reason: str) -> Response:
    htmx = bool(request.headers.get("HX-Request"))
    # Back to the page afterwards: an htmx poll's page is the one it names
    # in HX-Current-URL, not the fragment's.
    back = urlsplit(request.headers.get("HX-Current-URL", "")).path if htmx \
        else request.url.path if request.method == "GET" else ""
    target = "/console/login"
    if reason:
        target += "?expired=1"
    elif back.startswith("/console/") and back != "/console/login":
        target += "?next=" + quote(back, safe="/")
    if htmx:
        return Response(status_code=401, headers={"HX-Redirect": target})
    return RedirectResponse(target, status_code=303)


class ConsoleRoute(APIRoute):
    """Every console route: HTML errors, the sign-in redirect, security headers."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def run(request: Request) -> Response:
            try:
                response = await handler(request)
            except LoginRequired as exc:
                response = to_login(request, exc.reason)
            except ApiError as exc:
                response = error_page(request, exc.status, exc.code, exc.detail)
            except CephError as exc:
                response = error_page(request, CEPH_STATUS.get(exc.code, 502), exc.code,
                                      str(exc))
            except RequestValidationError as exc:
                detail = "; ".join(f"{'.'.join(map(str, e.get('loc', ())))}: {e.get('msg')}"
                                   for e in exc.errors())
                response = error_page(request, 422, "validation_error", detail)
            for k, v in HEADERS.items():
                response.headers.setdefault(k, v)
            return response

        return run
