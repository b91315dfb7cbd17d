"""fs-freeze quiesce on the real Debian PostgreSQL guest (issue 8 item 4),
through the real coordinator and agent.

One debian-pg VM (qemu-guest-agent inside) under load, one cutpointd with
the VM's guest-agent socket configured (`qga`), group snapshots by
`take_group_snapshot` with `quiesce: crash` and `quiesce: fs-freeze`; then
the guest agent is stopped inside the guest (SIGSTOP through guest-exec: its
port stays open, nothing answers) and fs-freeze must fall back to crash,
recorded per member.  Slow: one TCG boot of the Debian image (2.5-4 min
here).  The benchmark figures come from `cutpoint-lab bench quiesce`
(docs/benchmarks.md), the same code with more rounds.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cutpoint.bench import quiesce

pytestmark = [pytest.mark.lab, pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]


def test_fs_freeze_reached_and_dead_agent_falls_back(tmp_path: Path) -> None:
    doc = quiesce.run(tmp_path / "q", rounds=1, dead_rounds=1, record=True)
    print(quiesce.table(doc))
    rows = {(r["phase"], r["quiesce"]): r for r in doc["rows"]}
    assert all(r["state"] == "committed" for r in doc["rows"]), doc["rows"]
    live_c, live_f = rows[("live", "crash")], rows[("live", "fs-freeze")]
    assert live_c["consistency"] == "crash" and live_c["freeze_error"] is None
    assert live_f["consistency"] == "fs-freeze" and live_f["freeze_error"] is None
    assert live_f["thaw_ms"] is not None
    # The coordinator's log holds what the agent replied.
    assert live_f["log"]["consistency"] == "fs-freeze"
    dead = rows[("dead-agent", "fs-freeze")]
    assert dead["consistency"] == "crash"
    assert "guest-sync-delimited" in dead["freeze_error"]
    assert dead["log"]["freeze_error"] == dead["freeze_error"]
    # The dead agent costs time before the pause (the sync deadline), not in it.
    assert dead["freeze_ms"] >= 999 and dead["paused_ms"] < dead["freeze_ms"]
    assert rows[("dead-agent", "crash")]["consistency"] == "crash"
    assert (tmp_path / "q" / "agent-replies.json").exists()
