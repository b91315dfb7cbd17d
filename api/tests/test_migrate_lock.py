"""Migrations are a step of their own, under a lock (api/migrate.py), on
SQLite and PostgreSQL: `cutpoint server migrate` waits while another
process holds the migration lock and upgrades once it is free, and the API
refuses to start on a database that is not at the code's schema."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from cutpoint.api.migrate import current_heads, current_revision, migration_lock

EXE = str(Path(sys.executable).with_name("cutpoint"))


def _env(url: str) -> dict[str, str]:
    env = dict(os.environ, CUTPOINT_DATABASE_URL=url,
               CUTPOINT_TOKEN_SECRET="migrate-test-secret-0123456789",
               CUTPOINT_REDIS_URL="redis://127.0.0.1:1/0")
    env.pop("CUTPOINT_CONFIG", None)
    return env


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_migrate_waits_for_the_lock(empty_db: Any, kind: str, tmp_path: Path) -> None:
    url = empty_db(kind)
    err = tmp_path / "migrate.err"
    with migration_lock(url):  # another process's migration, as far as it can tell
        with open(err, "wb") as f:
            p = subprocess.Popen([EXE, "server", "migrate"], env=_env(url), stdout=f, stderr=f)
        deadline = time.monotonic() + 60
        while "waiting for it" not in err.read_text() and time.monotonic() < deadline:
            assert p.poll() is None, err.read_text()
            time.sleep(0.2)
        assert "another process is migrating this database" in err.read_text()
        time.sleep(2)
        assert p.poll() is None, "migrated while another process held the lock"
        assert current_revision(url) is None
    assert p.wait(timeout=120) == 0, err.read_text()
    assert current_revision(url) in current_heads()
    assert "database at head" in err.read_text()


def test_the_api_refuses_a_database_behind_the_code(empty_db: Any) -> None:
    url = empty_db("sqlite")
    r = subprocess.run([EXE, "server", "--port", "1"], env=_env(url), capture_output=True,
                       text=True, timeout=120, check=False)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "schema revision none" in r.stderr and "cutpoint server migrate" in r.stderr, r.stderr
