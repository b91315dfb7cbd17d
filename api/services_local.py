"""Start and stop the project's own Redis and PostgreSQL on loopback.

Tests, the embedded server and operators on a single machine use this instead
of the system services: every instance lives in a state directory of its own,
listens on 127.0.0.1 only, and is stopped by the same module that started it.

    python -m cutpoint.api.services_local start --state-dir DIR [--redis-port N] [--pg-port N]
    python -m cutpoint.api.services_local env   --state-dir DIR   # prints export lines
    python -m cutpoint.api.services_local stop  --state-dir DIR

PostgreSQL refuses to run as root, so `initdb` and `pg_ctl` run as the
Debian `postgres` user; the data directory is owned by it.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

PG_BIN = Path(os.environ.get("CUTPOINT_PG_BIN", "/usr/lib/postgresql/15/bin"))
REDIS_SERVER = os.environ.get("CUTPOINT_REDIS_SERVER", "redis-server")
PG_USER = "postgres"
DB_NAME = "cutpoint"
DB_ROLE = "cutpoint"


class ServiceError(RuntimeError):
    """A local service could not be started or stopped; carries the command and its output."""

    def __init__(self, what: str, argv: list[str] | None = None, output: str = "") -> None:
        self.argv = argv or []
        self.output = output
        msg = what
        if argv:
            msg += f"\n  command: {' '.join(argv)}"
        if output:
            msg += f"\n  output: {output.strip()[-2000:]}"
        super().__init__(msg)


@dataclass
class Endpoints:
    state_dir: str
    redis_port: int | None = None
    pg_port: int | None = None

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    @property
    def database_url(self) -> str:
        return f"postgresql+psycopg://{DB_ROLE}@127.0.0.1:{self.pg_port}/{DB_NAME}"

    def admin_url(self, db: str = "postgres") -> str:
        return f"postgresql+psycopg://{DB_ROLE}@127.0.0.1:{self.pg_port}/{db}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(argv: list[str], *, user: str | None = None, check: bool = True) -> str:
    if user is not None and os.geteuid() == 0:
        argv = ["runuser", "-u", user, "--", *argv]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    out = proc.stdout + proc.stderr
    if check and proc.returncode != 0:
        raise ServiceError(f"command failed with status {proc.returncode}", argv, out)
    return out


def _wait_port(port: int, timeout: float, what: str, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
    raise ServiceError(f"{what} did not listen on 127.0.0.1:{port} within {timeout}s", None, tail)


def _meta_path(state: Path) -> Path:
    return state / "services.json"


def load(state_dir: str | Path) -> Endpoints:
    path = _meta_path(Path(state_dir))
    if not path.exists():
        raise ServiceError(f"no services recorded in {path}; run `start` first")
    return Endpoints(**json.loads(path.read_text()))


def start_redis(state: Path, port: int) -> None:
    rdir = state / "redis"
    rdir.mkdir(parents=True, exist_ok=True)
    log = rdir / "redis.log"
    _run([
        REDIS_SERVER, "--bind", "127.0.0.1", "--port", str(port),
        "--dir", str(rdir), "--daemonize", "yes",
        "--pidfile", str(rdir / "redis.pid"), "--logfile", str(log),
        # Broker state is disposable in tests and embedded mode; persistence
        # would only add fsyncs and files to clean up.
        "--save", "", "--appendonly", "no", "--protected-mode", "yes",
    ])
    _wait_port(port, 10, "redis-server", log)


def _chown_tree(path: Path, user: str) -> None:
    if os.geteuid() != 0:
        return
    pw = pwd.getpwnam(user)
    os.chown(path, pw.pw_uid, pw.pw_gid)


def start_postgres(state: Path, port: int) -> None:
    pdir = state / "pg"
    data = pdir / "data"
    pdir.mkdir(parents=True, exist_ok=True)
    # The postgres user must be able to reach its directory through ours.
    os.chmod(state, 0o755)
    os.chmod(pdir, 0o755)
    _chown_tree(pdir, PG_USER)
    user = PG_USER if os.geteuid() == 0 else None
    if not (data / "PG_VERSION").exists():
        _run([str(PG_BIN / "initdb"), "-D", str(data), "-U", DB_ROLE, "-A", "trust",
              "-E", "UTF8", "--no-sync"], user=user)
    log = pdir / "postgres.log"
    opts = (f"-p {port} -c listen_addresses=127.0.0.1 -k {pdir} "
            "-c fsync=off -c synchronous_commit=off -c max_connections=200")
    _run([str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", opts, "-w",
          "-t", "30", "start"], user=user)
    _wait_port(port, 30, "postgres", log)
    out = _run([str(PG_BIN / "psql"), "-h", "127.0.0.1", "-p", str(port), "-U", DB_ROLE,
                "-d", "postgres", "-tAc", f"SELECT 1 FROM pg_database WHERE datname='{DB_NAME}'"],
               user=user)
    if out.strip() != "1":
        _run([str(PG_BIN / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", DB_ROLE,
              DB_NAME], user=user)


def start(state_dir: str | Path, *, redis: bool = True, postgres: bool = True,
          redis_port: int | None = None, pg_port: int | None = None) -> Endpoints:
    """Start the requested services (idempotently) and record their ports."""
    state = Path(state_dir)
    state.mkdir(parents=True, exist_ok=True)
    try:
        ep = load(state)
    except ServiceError:
        ep = Endpoints(state_dir=str(state))
    if redis and (ep.redis_port is None or not _listening(ep.redis_port)):
        ep.redis_port = redis_port or ep.redis_port or free_port()
        start_redis(state, ep.redis_port)
    if postgres and (ep.pg_port is None or not _listening(ep.pg_port)):
        ep.pg_port = pg_port or ep.pg_port or free_port()
        start_postgres(state, ep.pg_port)
    _meta_path(state).write_text(json.dumps(asdict(ep)))
    return ep


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.3):
            return True
    except OSError:
        return False


def stop(state_dir: str | Path) -> None:
    """Stop whatever `start` left running in the state directory."""
    state = Path(state_dir)
    pidfile = state / "redis" / "redis.pid"
    if pidfile.exists():
        try:
            pid = int(pidfile.read_text().strip())
            os.kill(pid, 15)
            for _ in range(100):
                os.kill(pid, 0)
                time.sleep(0.05)
        except (ProcessLookupError, ValueError):
            pass
        pidfile.unlink(missing_ok=True)
    data = state / "pg" / "data"
    if (data / "postmaster.pid").exists():
        user = PG_USER if os.geteuid() == 0 else None
        _run([str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
             user=user, check=False)


def destroy(state_dir: str | Path) -> None:
    stop(state_dir)
    shutil.rmtree(state_dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="cutpoint-services", description=__doc__.split("\n")[0])
    p.add_argument("action", choices=["start", "stop", "env", "destroy"])
    p.add_argument("--state-dir", default=os.environ.get(
        "CUTPOINT_SERVICES_DIR", "/var/lib/cutpoint/services"))
    p.add_argument("--redis-port", type=int)
    p.add_argument("--pg-port", type=int)
    p.add_argument("--no-postgres", action="store_true")
    p.add_argument("--no-redis", action="store_true")
    a = p.parse_args(argv)
    try:
        if a.action == "start":
            ep = start(a.state_dir, redis=not a.no_redis, postgres=not a.no_postgres,
                       redis_port=a.redis_port, pg_port=a.pg_port)
            print(json.dumps(asdict(ep)))
        elif a.action == "env":
            ep = load(a.state_dir)
            if ep.redis_port:
                print(f"export CUTPOINT_REDIS_URL={ep.redis_url}")
            if ep.pg_port:
                print(f"export CUTPOINT_DATABASE_URL={ep.database_url}")
        elif a.action == "stop":
            stop(a.state_dir)
        else:
            destroy(a.state_dir)
    except ServiceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
