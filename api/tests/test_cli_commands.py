"""`cutpoint` carries the operator's commands only; the test bed's are `cutpoint-lab`'s."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import typer
from cutpoint.api.cli.main import app

OPERATOR = {"snapshot", "server", "token", "group", "job", "rpo", "orphans", "site", "host",
            "drill", "dr", "vm", "restore", "webhook", "plan"}


def test_cutpoint_has_operator_commands_only() -> None:
    commands = set(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
    assert commands == OPERATOR
    exe = str(Path(sys.executable).with_name("cutpoint"))
    r = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, COLUMNS="120"), check=False)
    assert r.returncode == 0, r.stderr
    for name in OPERATOR:
        assert f"│ {name} " in r.stdout, (name, r.stdout)
    for name in ("lab", "bench", "check", "agent", "demo", "up", "down"):
        assert f"│ {name} " not in r.stdout, (name, r.stdout)
