"""`.ci/run`, CI's entry point, with a `make` on PATH that plays the stages
(no lab): a stage after `make test` is stopped at CI's limit less the
margin and says so, and a failed stage ends the run with its status."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

CI_RUN = Path(__file__).resolve().parents[2] / ".ci" / "run"


def _run(tmp_path: Path, make_body: str, **env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / ".ci").mkdir()
    shutil.copy(CI_RUN, tmp_path / ".ci" / "run")
    (tmp_path / "bin").mkdir()
    make = tmp_path / "bin" / "make"
    make.write_text(f"#!/bin/bash\necho \"fake make $1\"\n{make_body}\n")
    make.chmod(0o755)
    e = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", **env}
    return subprocess.run(["bash", str(tmp_path / ".ci" / "run")], env=e, text=True,
                          capture_output=True, timeout=120, check=False)


def test_a_stage_past_the_limit_is_stopped_and_named(tmp_path: Path) -> None:
    r = _run(tmp_path, '[ "$1" = drills ] && exec sleep 60; exit 0',
             CI_LIMIT="123", CI_MARGIN="120")
    assert r.returncode == 124, r.stdout + r.stderr
    assert "running make drills (at most 3s)" in r.stdout
    assert "ci: make drills stopped after 3s, CI's limit less 120s" in r.stdout
    assert "ci: total" not in r.stdout      # the run failed there


def test_a_failed_stage_ends_the_run_with_its_status(tmp_path: Path) -> None:
    r = _run(tmp_path, '[ "$1" = faults ] && exit 3; exit 0')
    assert r.returncode == 3, r.stdout + r.stderr
    assert "fake make faults" in r.stdout
    assert "fake make faults-slow" not in r.stdout
    assert "stopped after" not in r.stdout


def test_every_stage_runs_and_prints_its_time(tmp_path: Path) -> None:
    r = _run(tmp_path, "exit 0")
    assert r.returncode == 0, r.stdout + r.stderr
    for stage in ("test", "faults", "faults-slow", "drills"):
        assert f"fake make {stage}\n" in r.stdout
        assert f"ci: make {stage} took" in r.stdout
    assert "ci: total" in r.stdout
