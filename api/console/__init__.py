"""The web console: server-rendered pages over the API's services, under the
API's token authentication and roles (README.md)."""

from __future__ import annotations

from fastapi import FastAPI


def mount(app: FastAPI) -> None:
    """Serve the console under /console (outside the OpenAPI document)."""
    from cutpoint.api.console import actions, assets, pages, pages_inventory

    for r in (pages.router, pages_inventory.router, actions.router, assets.router):
        app.include_router(r)
