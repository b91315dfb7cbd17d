"""`log_level` reaches the API's own log lines (api/logs.py): in a fresh
process, as under uvicorn (no root handler), a `cutpoint.*` DEBUG line is
printed at DEBUG and dropped at WARNING."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PROG = """
import logging
from cutpoint.api.app import create_app
create_app()
logging.getLogger("cutpoint.api.test").debug("a debug line")
logging.getLogger("cutpoint.api.test").warning("a warning line")
"""


@pytest.mark.parametrize("level,debug_shown", [("DEBUG", True), ("WARNING", False)])
def test_log_level_reaches_the_api_log(tmp_path: Path, level: str, debug_shown: bool) -> None:
    env = dict(os.environ, CUTPOINT_LOG_LEVEL=level,
               CUTPOINT_DATABASE_URL=f"sqlite:///{tmp_path}/db.sqlite",
               CUTPOINT_TOKEN_SECRET="logs-test-secret-0123456789")
    env.pop("CUTPOINT_CONFIG", None)
    r = subprocess.run([sys.executable, "-c", PROG], env=env, capture_output=True, text=True,
                       timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    assert "WARNING cutpoint.api.test a warning line" in r.stderr, r.stderr
    assert ("DEBUG cutpoint.api.test a debug line" in r.stderr) is debug_shown, r.stderr
