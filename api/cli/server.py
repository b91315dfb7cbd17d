"""`cutpoint server`: the control plane processes.

    cutpoint server --embedded [--state-dir DIR]   API + one worker + beat, on
        SQLite and a Redis it starts itself (all on loopback), in one command
    cutpoint server [--migrate]                    the API only (production); refuses
        a database not at the code's schema unless --migrate
    cutpoint server worker | beat                  one Celery worker / the beat
    cutpoint server migrate                        Alembic upgrade to head, under the
        migration lock (once per deployment and upgrade)

Embedded mode keeps everything in the state directory: `cutpoint.toml`
(settings; the token secret is generated once, mode 0600), `cutpoint.db`,
`services/` (Redis), `beat-schedule`, and `logs/`.  Point other commands at
it with `CUTPOINT_CONFIG=DIR/cutpoint.toml`.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="Run the control plane (API, worker, beat).",
                  invoke_without_command=True)
ALL_QUEUES = "cutpoint.snapshots,cutpoint.default,cutpoint.scheduler,cutpoint.inventory"
DEFAULT_STATE = Path("/var/lib/cutpoint/embedded")
DEFAULT_SCHEDULE = Path("/var/lib/cutpoint/beat-schedule")
CELERY = [sys.executable, "-m", "celery", "-A", "cutpoint.api.worker:celery_app"]


def _toml_str(v: str) -> str:
    return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_embedded_config(state: Path, agent_certs: Path | None) -> Path:
    """Create DIR/cutpoint.toml once; later runs keep it (and its secret)."""
    from cutpoint.api import services_local

    cfg = state / "cutpoint.toml"
    if cfg.exists():
        return cfg
    lines = {
        "database_url": f"sqlite:///{state / 'cutpoint.db'}",
        "redis_url": f"redis://127.0.0.1:{services_local.free_port()}/0",
        "token_secret": secrets.token_urlsafe(32),
    }
    if agent_certs is not None:
        lines |= {"agent_ca": str(agent_certs / "ca.pem"),
                  "agent_cert": str(agent_certs / "coordinator.pem"),
                  "agent_key": str(agent_certs / "coordinator.key")}
    fd = os.open(cfg, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("# cutpoint embedded settings (generated; keep private)\n")
        for k, v in lines.items():
            f.write(f"{k} = {_toml_str(v)}\n")
    return cfg


def _settings():  # type: ignore[no-untyped-def]
    from cutpoint.api.config import ConfigFileError, get_settings
    from pydantic import ValidationError

    get_settings.cache_clear()
    try:
        return get_settings()
    except (ValidationError, ConfigFileError) as exc:
        typer.echo(f"cutpoint server: bad settings: {exc}", err=True)
        raise typer.Exit(2) from None


@app.callback()
def server(
    ctx: typer.Context,
    embedded: Annotated[bool, typer.Option(
        "--embedded", help="API + worker + beat + local Redis, on SQLite")] = False,
    state_dir: Annotated[Path, typer.Option(
        "--state-dir", help="embedded mode's directory")] = DEFAULT_STATE,
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port")] = 8470,
    agent_certs: Annotated[Path | None, typer.Option(
        "--agent-certs", help="directory with ca.pem and coordinator.pem/.key "
        "(embedded mode, first start)")] = None,
    admin_token_file: Annotated[Path | None, typer.Option(
        "--admin-token-file", help="embedded: create an admin token into this file if it "
        "does not exist yet")] = None,
    concurrency: Annotated[int, typer.Option(
        "--concurrency", min=1, max=32, help="worker processes (embedded)")] = 2,
    tls_cert: Annotated[Path | None, typer.Option(
        "--tls-cert", help="serve HTTPS with this certificate (PEM; with --tls-key)")] = None,
    tls_key: Annotated[Path | None, typer.Option(
        "--tls-key", help="the certificate's private key (PEM)")] = None,
    migrate_first: Annotated[bool, typer.Option(
        "--migrate", help="migrate the database (under the lock) before serving; "
        "otherwise a database not at the code's schema stops the start")] = False,
) -> None:
    """Run the API (or, with --embedded, everything)."""
    if ctx.invoked_subcommand is not None:
        return
    if (tls_cert is None) != (tls_key is None):
        raise typer.BadParameter("give both --tls-cert and --tls-key, or neither",
                                 param_hint="--tls-cert / --tls-key")
    if embedded:
        raise typer.Exit(run_embedded(state_dir, host, port, agent_certs, admin_token_file,
                                      concurrency))
    st = _settings()
    if migrate_first:
        _migrate(st.database_url)
    else:
        _require_head(st.database_url)
    import uvicorn

    uvicorn.run("cutpoint.api.app:create_app", factory=True, host=host, port=port,
                ssl_certfile=str(tls_cert) if tls_cert else None,
                ssl_keyfile=str(tls_key) if tls_key else None)


def _migrate(database_url: str) -> None:
    from cutpoint.api.migrate import current_heads, upgrade

    def waiting() -> None:
        typer.echo("cutpoint server migrate: another process is migrating this database; "
                   "waiting for it", err=True)

    upgrade(database_url, on_wait=waiting)
    typer.echo(f"database at head ({' '.join(current_heads())})")


def _require_head(database_url: str) -> None:
    """The API serves only a database at the code's schema: migrations are a
    step of their own (`cutpoint server migrate`, once per deployment and
    upgrade, under a lock), not a side effect of starting a replica."""
    from cutpoint.api.migrate import current_heads, current_revision

    have, want = current_revision(database_url), current_heads()
    if have not in want:
        typer.echo(f"cutpoint server: the database is at schema revision {have or 'none'}, "
                   f"this code needs {' '.join(want)}: run `cutpoint server migrate` first "
                   "(or start with --migrate)", err=True)
        raise typer.Exit(2)


@app.command("migrate")
def migrate() -> None:
    """Upgrade the database to the newest schema (Alembic), under the migration lock."""
    _migrate(_settings().database_url)


@app.command("worker")
def worker(concurrency: int = typer.Option(2, "--concurrency", "-c", min=1),
           pool: str = typer.Option("prefork", "--pool", "-P",
                                    help="prefork (processes) or threads: a threads "
                                    "worker of cutpoint.snapshots runs many group "
                                    "snapshots at once in one process, their agent "
                                    "calls pipelined per host (docs/operations.md)"),
           queues: str = typer.Option(ALL_QUEUES, "--queues", "-Q"),
           sites: str = typer.Option("", "--sites", help="also take the DR jobs of these "
                                     "sites (comma-separated; with dr_site_queues): give "
                                     "this worker their Ceph access")) -> None:
    """Run one Celery worker."""
    from cutpoint.api.worker import site_queue

    if pool not in ("prefork", "threads"):
        raise typer.BadParameter(f"--pool wants prefork or threads, got {pool!r}")
    queues = ",".join([queues, *(site_queue(x.strip()) for x in sites.split(",") if x.strip())])
    st = _settings()
    from cutpoint.api.worker_metrics import multiproc_dir

    os.environ.update(multiproc_dir(st.worker_metrics_port))
    os.execv(sys.executable, [*CELERY, "worker", "-Q", queues, "-c", str(concurrency),
                              "-P", pool, "--loglevel", st.log_level])


@app.command("beat")
def beat(schedule: Annotated[Path, typer.Option("--schedule")] = DEFAULT_SCHEDULE) -> None:
    """Run the beat (exactly one per deployment): the RPO scheduler's clock."""
    st = _settings()
    os.execv(sys.executable, [*CELERY, "beat", "-s", str(schedule), "--loglevel", st.log_level])


def run_embedded(state: Path, host: str, port: int, agent_certs: Path | None,
                 admin_token_file: Path | None, concurrency: int) -> int:
    from cutpoint.api import services_local
    from cutpoint.api.migrate import upgrade
    from cutpoint.api.worker_metrics import multiproc_dir

    state.mkdir(parents=True, exist_ok=True)
    cfg = write_embedded_config(state.resolve(), agent_certs)
    os.environ["CUTPOINT_CONFIG"] = str(cfg)
    st = _settings()
    redis_port = int(st.redis_url.rsplit(":", 1)[1].split("/")[0])
    services_local.start(state / "services", postgres=False, redis_port=redis_port)
    upgrade(st.database_url)
    if admin_token_file is not None and not admin_token_file.exists():
        from cutpoint.api.db import session_scope
        from cutpoint.api.models import Role
        from cutpoint.api.services import tokens

        with session_scope(st.database_url) as s:
            _, tok = tokens.create(s, f"admin-{secrets.token_hex(3)}", Role.admin,
                                   st.token_secret.get_secret_value())
        fd = os.open(admin_token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(tok + "\n")
    logs = state / "logs"
    logs.mkdir(exist_ok=True)
    env = {**os.environ, "CUTPOINT_CONFIG": str(cfg)}
    specs = {
        "api": [sys.executable, "-m", "uvicorn", "--factory", "cutpoint.api.app:create_app",
                "--host", host, "--port", str(port), "--no-access-log"],
        "worker": [*CELERY, "worker", "-Q", ALL_QUEUES, "-c", str(concurrency),
                   "-n", f"embedded-{os.getpid()}@%h", "--loglevel", st.log_level],
        "beat": [*CELERY, "beat", "-s", str(state / "beat-schedule"), "--loglevel",
                 st.log_level],
    }
    procs: dict[str, subprocess.Popen[bytes]] = {}
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    rc = 0
    try:
        for name, argv in specs.items():
            out = open(logs / f"{name}.log", "ab")  # noqa: SIM115  owned by the child
            penv = {**env, **multiproc_dir(st.worker_metrics_port)} if name == "worker" else env
            procs[name] = subprocess.Popen(argv, env=penv, stdout=out, stderr=subprocess.STDOUT,
                                           start_new_session=True)
        typer.echo(f"cutpoint embedded: API http://{host}:{port}/v1 (docs /v1/docs), "
                   f"config {cfg}, logs {logs}", err=True)
        while not stopping:
            for name, p in procs.items():
                if p.poll() is not None:
                    typer.echo(f"cutpoint embedded: {name} exited with {p.returncode}; "
                               f"see {logs / (name + '.log')}", err=True)
                    stopping, rc = True, 1
            time.sleep(0.5)
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for p in procs.values():
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        services_local.stop(state / "services")
    return rc
