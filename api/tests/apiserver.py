"""A real `cutpoint server` process on a fresh SQLite database, for CLI tests.

    with api_server(tmp_path) as srv:
        srv.cli("site", "list")        # `cutpoint site list` against it
        srv.log()                      # what the server printed
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

EXE = str(Path(sys.executable).with_name("cutpoint"))


@dataclass
class Server:
    url: str
    token: str
    env: dict[str, str]
    log_path: Path

    def cli(self, *args: str, timeout: float = 180, columns: int = 250,
            stdin: str = "") -> subprocess.CompletedProcess[str]:
        """Run `cutpoint ARGS`; stdin is a pipe holding `stdin` (never a terminal)."""
        env = dict(self.env, CUTPOINT_URL=self.url, CUTPOINT_TOKEN=self.token,
                   COLUMNS=str(columns))
        return subprocess.run([EXE, *args], env=env, capture_output=True, text=True,
                              input=stdin, timeout=timeout, check=False)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def api_server(tmp: Path) -> Iterator[Server]:
    """The API alone (no worker: site routes need none), log level DEBUG."""
    env = dict(os.environ, CUTPOINT_DATABASE_URL=f"sqlite:///{tmp}/cli.db",
               CUTPOINT_TOKEN_SECRET="cli-test-secret-0123456789",
               CUTPOINT_REDIS_URL="redis://127.0.0.1:1/0", CUTPOINT_LOG_LEVEL="DEBUG")
    env.pop("CUTPOINT_CONFIG", None)
    subprocess.run([EXE, "server", "migrate"], env=env, check=True, capture_output=True)
    tok = json.loads(subprocess.run([EXE, "token", "create", "cli", "--role", "admin",
                                     "--json"], env=env, check=True, capture_output=True,
                                    text=True).stdout)["token"]
    port = _free_port()
    log_path = tmp / "api.log"
    with open(log_path, "wb") as log:
        p = subprocess.Popen([EXE, "server", "--host", "127.0.0.1", "--port", str(port)],
                             env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if p.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(log_path.read_text()) from None
                    time.sleep(0.3)
            yield Server(f"http://127.0.0.1:{port}", tok, env, log_path)
        finally:
            p.terminate()
            p.wait(timeout=20)
