"""The HTTP client the CLI commands use: base URL and token from options or env.

    CUTPOINT_URL    default http://127.0.0.1:8470
    CUTPOINT_TOKEN  a bearer token (`cutpoint token create`)
"""

from __future__ import annotations

import json
import os
from typing import Any

import httpx
import typer
from rich.console import Console

DEFAULT_URL = "http://127.0.0.1:8470"

UrlOpt = typer.Option(None, "--url", envvar="CUTPOINT_URL", help="API base URL")
TokenOpt = typer.Option(None, "--token", envvar="CUTPOINT_TOKEN", help="API bearer token")
JsonOpt = typer.Option(False, "--json", help="print JSON instead of a table")

err = Console(stderr=True)


class ApiCallError(RuntimeError):
    def __init__(self, method: str, path: str, status: int, body: Any) -> None:
        self.method, self.path, self.status, self.body = method, path, status, body
        code = body.get("code") if isinstance(body, dict) else None
        detail = body.get("detail") if isinstance(body, dict) else str(body)[:500]
        super().__init__(f"{method} {path} -> {status} {code or ''}: {detail}")


class Api:
    def __init__(self, url: str | None, token: str | None) -> None:
        self.url = (url or os.environ.get("CUTPOINT_URL") or DEFAULT_URL).rstrip("/")
        self.token = token or os.environ.get("CUTPOINT_TOKEN")
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def call(self, method: str, path: str, **kw: Any) -> Any:
        try:
            r = self.http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise ApiCallError(method, path, 0, f"cannot reach {self.url}: {exc}") from exc
        if r.status_code >= 400:
            try:
                body = r.json()
            except ValueError:
                body = r.text
            raise ApiCallError(method, path, r.status_code, body)
        if r.status_code == 204 or not r.content:
            return None
        return r.json()

    def get(self, path: str, **kw: Any) -> Any:
        return self.call("GET", path, **kw)

    def post(self, path: str, **kw: Any) -> Any:
        return self.call("POST", path, **kw)

    def patch(self, path: str, **kw: Any) -> Any:
        return self.call("PATCH", path, **kw)

    def put(self, path: str, **kw: Any) -> Any:
        return self.call("PUT", path, **kw)

    def all(self, path: str, **params: Any) -> list[Any]:
        items: list[Any] = []
        cursor = None
        while True:
            q = {**params, "limit": 500, **({"cursor": cursor} if cursor else {})}
            page = self.get(path, params=q)
            items += page["items"]
            cursor = page.get("next_cursor")
            if not cursor:
                return items


def run(fn: Any) -> Any:
    """Call fn(); turn an API error into a one-line message and exit status 1."""
    try:
        return fn()
    except ApiCallError as exc:
        err.print(f"[red]error:[/red] {exc}", markup=True, highlight=False)
        raise typer.Exit(1) from None


def print_json(obj: Any) -> None:
    typer.echo(json.dumps(obj, indent=2, default=str))
