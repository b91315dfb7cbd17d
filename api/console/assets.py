"""The console's two files: its style sheet (in the repository, assets/) and
htmx, which scripts/setup.sh fetches from npm's registry, pinned, into the
git-ignored static/.  Without htmx the pages still work; only the live
progress does not refresh (the job page says so)."""

from __future__ import annotations

from cutpoint.api.console.render import HERE, ConsoleRoute
from cutpoint.api.errors import NotFound
from fastapi import APIRouter
from fastapi.responses import FileResponse

router = APIRouter(prefix="/console", route_class=ConsoleRoute, include_in_schema=False)
HTMX = HERE / "static" / "htmx.min.js"
CSS = HERE / "assets" / "console.css"


@router.get("/static/htmx.min.js")
def htmx() -> FileResponse:
    if not HTMX.is_file():
        raise NotFound("htmx is not installed here: run `make setup` (scripts/setup.sh)",
                       code="asset_missing")
    return FileResponse(HTMX, media_type="text/javascript",
                        headers={"Cache-Control": "public, max-age=3600"})


@router.get("/assets/console.css")
def css() -> FileResponse:
    return FileResponse(CSS, media_type="text/css",
                        headers={"Cache-Control": "public, max-age=3600"})
