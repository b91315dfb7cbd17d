"""docs/cli.md is the commands' own --help, regenerated: it fails when a
command, option or help text changed and `make docs` was not run."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_cli_reference_matches_the_code(tmp_path: Path) -> None:
    out = tmp_path / "cli.md"
    subprocess.run([str(ROOT / "scripts/cli-docs.sh"), str(out)], check=True, timeout=120,
                   capture_output=True)
    want = out.read_text()
    have = (ROOT / "docs/cli.md").read_text()
    assert have == want, "docs/cli.md is out of date: run `make docs`"
    for cmd in ("cutpoint dr failover", "cutpoint group delete", "cutpoint drill show",
                "--install-completion"):
        assert cmd in have, cmd
