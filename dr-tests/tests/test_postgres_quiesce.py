"""fs-freeze quiesce on the real Debian PostgreSQL guest (issue 8 item 4).

Boots the debian-pg VM under load with a live qemu-guest-agent, then one
with the agent masked (its port exists, nothing answers).  Slow: two TCG
boots.  The measured figures live in docs/benchmarks.md.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cutpoint.checkers import quiesce

pytestmark = [pytest.mark.lab, pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]


def test_fs_freeze_reached_and_dead_agent_falls_back(tmp_path: Path) -> None:
    res = quiesce.measure(tmp_path / "q", rounds=1, freeze_timeout=5.0,
                          dead_rounds=1)
    live = {r["mode"]: r for r in res["rounds"]}
    assert live["crash"]["consistency"] == "crash"
    assert live["fs-freeze"]["consistency"] == "fs-freeze"
    # root, WAL, data and journal filesystems
    assert live["fs-freeze"]["frozen_fs"] == 4
    assert live["fs-freeze"]["thaw_error"] is None
    dead = res["dead_agent"][0]
    assert dead["consistency"] == "crash"
    assert "timed out" in dead["freeze_error"]
    # The dead agent costs time before the pause, never inside it.
    assert dead["pause_ms"] < dead["freeze_ms"]
