"""docs/dr.md's walkthrough cannot rot: `cutpoint-lab dr-walkthrough` runs
every DR step as a real `cutpoint` command on a lab of its own (register
sites and hosts, protect a group, drill, fail over, re-protect, fail back,
restore as clones and in place), and every step must exit as documented:
0, except the in-place restore while the VMs run, refused with
`409 vms_running` and exit status 1.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.lab

LAB_EXE = str(Path(sys.executable).with_name("cutpoint-lab"))

# Every step docs/dr.md's walkthrough shows, by its command's first words.
COMMANDS = [("site", "add"), ("site", "check"), ("host", "add"), ("host", "list"),
            ("group", "create"), ("group", "add-vm"), ("group", "snapshot"),
            ("dr", "status"), ("drill", "run"), ("drill", "list"), ("drill", "show"),
            ("dr", "failover"), ("dr", "re-protect"), ("dr", "failback"),
            ("restore", "clone"), ("restore", "in-place")]


def test_every_walkthrough_step_exits_as_documented(lab_session: Any, tmp_path: Path) -> None:
    lab_session.down()  # holds the lab lock (the walkthrough sees it held) and frees the lab
    steps_file, doc = tmp_path / "steps.json", tmp_path / "walkthrough.md"
    r = subprocess.run([LAB_EXE, "dr-walkthrough", "--json", str(steps_file), "--out", str(doc)],
                       capture_output=True, text=True, timeout=600, check=False)
    print(r.stdout[-20000:])
    steps = json.loads(steps_file.read_text())["steps"]
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for s in steps:
        assert s["rc"] == s["expect"], s
    assert {tuple(s["argv"][:2]) for s in steps} >= set(COMMANDS)
    refused = [s for s in steps if s["expect"] != 0]
    assert len(refused) == 1 and refused[0]["argv"][:2] == ["restore", "in-place"], refused
    assert refused[0]["rc"] == 1 and "409 vms_running" in refused[0]["output"], refused
    done = [s for s in steps if s["argv"][:2] == ["restore", "in-place"] and s["rc"] == 0]
    assert done and ("rolled back to" in done[0]["output"]
                     or "unchanged since" in done[0]["output"]), done
    assert doc.read_text().count("$ cutpoint ") == len(steps)
