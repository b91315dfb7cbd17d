"""The API served over real HTTP from a background thread, for tests that
drive the `cutpoint` command line (which speaks HTTP) against it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from cutpoint.api import services_local
from cutpoint.api.app import create_app


@contextmanager
def serve(settings: Any, session_factory: Any = None) -> Iterator[str]:
    """Yield the base URL of the API for `settings` while it is served."""
    port = services_local.free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings, session_factory),
                                           host="127.0.0.1", port=port, log_level="warning"))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not t.is_alive():
            raise RuntimeError("the API did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        t.join(10)


def cli(*args: str) -> tuple[int, str]:
    """Run `cutpoint ARGS` in-process: (exit code, output)."""
    from cutpoint.api.cli.main import app
    from typer.testing import CliRunner

    r = CliRunner().invoke(app, list(args))
    return r.exit_code, r.output
