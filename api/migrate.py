"""Run Alembic migrations programmatically (setup, `cutpoint server migrate`, tests).

Migrations run under a lock, so that two processes started at once (two
API replicas, an Ansible run on two control hosts) never upgrade the same
database side by side: a PostgreSQL advisory lock held for the whole
upgrade, or for SQLite an exclusive `flock` on `<db>.migrate.lock`.  The
second one waits, then finds the schema at head and does nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import time
from collections.abc import Iterator
from pathlib import Path

from alembic import command
from alembic.config import Config

HERE = Path(__file__).resolve().parent
# The advisory lock's key: any fixed bigint that nothing else on the
# database uses ("cutpoint" in ASCII).
PG_LOCK_KEY = 0x6375747030696E74
log = logging.getLogger("cutpoint.migrate")


def alembic_config(database_url: str) -> Config:
    cfg = Config(str(HERE / "alembic.ini"))
    cfg.set_main_option("script_location", str(HERE / "alembic"))
    cfg.attributes["database_url"] = database_url
    return cfg


def _sqlite_path(database_url: str) -> Path | None:
    if database_url.startswith("sqlite:///") and not database_url.startswith("sqlite:///:"):
        return Path(database_url[len("sqlite:///"):])
    return None


@contextlib.contextmanager
def migration_lock(database_url: str, on_wait: object = None) -> Iterator[None]:
    """Hold the deployment's migration lock; `on_wait()` is called once if
    another process holds it (so a caller can say it is waiting)."""
    path = _sqlite_path(database_url)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_name(path.name + ".migrate.lock"), "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if callable(on_wait):
                    on_wait()
                fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
        return
    if not database_url.startswith("postgresql"):
        yield  # an in-memory SQLite database belongs to one process
        return
    from sqlalchemy import create_engine, text

    eng = create_engine(database_url)
    try:
        with eng.connect() as c:
            got = c.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": PG_LOCK_KEY}).scalar()
            if not got:
                if callable(on_wait):
                    on_wait()
                c.execute(text("SELECT pg_advisory_lock(:k)"), {"k": PG_LOCK_KEY})
            c.commit()
            try:
                yield
            finally:
                c.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": PG_LOCK_KEY})
                c.commit()
    finally:
        eng.dispose()


def upgrade(database_url: str, revision: str = "head", on_wait: object = None) -> None:
    t0 = time.monotonic()
    with migration_lock(database_url, on_wait):
        waited = time.monotonic() - t0
        if waited > 1:
            log.info("event=migration_lock_acquired waited_s=%.1f", waited)
        command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str, revision: str = "base") -> None:
    with migration_lock(database_url):
        command.downgrade(alembic_config(database_url), revision)


def current_heads() -> tuple[str, ...]:
    from alembic.script import ScriptDirectory

    return tuple(ScriptDirectory.from_config(alembic_config("sqlite://")).get_heads())


def current_revision(database_url: str) -> str | None:
    """The database's schema revision (None: never migrated)."""
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy import create_engine

    eng = create_engine(database_url)
    try:
        with eng.connect() as c:
            return MigrationContext.configure(c).get_current_revision()
    finally:
        eng.dispose()
