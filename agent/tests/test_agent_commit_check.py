"""Commit checks that every member is still paused since prepare
(agent-protocol §4.4): a `resume` inside a live transaction, then a commit,
aborts the transaction instead of cutting a VM that has run on.

Real QEMU (qcow2 disks, qmp-transaction) and a real cutpointd: the
local_agent fixture of test_agent_local.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from cutpoint.agentclient import AgentReplyError
from test_agent_local import _client, local_agent

pytestmark = pytest.mark.lab
__all__ = ["local_agent"]          # the fixture, used by name


async def test_resume_inside_txn_then_commit_aborts(local_agent: dict[str, Any]) -> None:
    snaps = {f"{v}/disk0": "cp.rs.r1" for v in ("vm1", "vm2")}
    async with _client(local_agent) as c:
        await c.prepare("r1", ["vm1", "vm2"], 10000)
        await c.resume(["vm1"])                  # vm1 runs on inside r1
        with pytest.raises(AgentReplyError) as ei:
            await c.commit("r1", snaps, 5000)
        assert ei.value.code == "ABORTED", ei.value
        assert "vm1 was resumed after prepare" in ei.value.message
        # No cut was taken, and nothing is left paused.
        assert await c.snapshot_list("vm1/disk0") == []
        assert await c.snapshot_list("vm2/disk0") == []
        st = {v["name"]: v["state"] for v in (await c.inventory())["vms"]}
        assert st == {"vm1": "running", "vm2": "running"}
        with pytest.raises(AgentReplyError) as ei:
            await c.commit("r1", snaps, 5000)      # a retry gets the same answer
        assert ei.value.code == "ABORTED"
        # A txn whose members all stayed paused still commits.
        await c.prepare("r2", ["vm1", "vm2"], 10000)
        res = await c.commit("r2", {f"{v}/disk0": "cp.rs.r2" for v in ("vm1", "vm2")}, 5000)
        assert res["state"] == "committed"
        await c.abort("r2")
