"""Frozen never lingers (agent-protocol §4.3, §7): a failed thaw is retried
with backoff until the guest agent answers, a freeze answered after its
deadline is thawed at once, and a prepare that fails after a freeze leaves
no guest frozen.

A real QEMU and a real cutpointd; the guest agent is test_agent_local's
SlowFreezeGuestAgent (recorded qemu-guest-agent replies), which can fail
thaws and answer freezes late.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from cutpoint.agentclient import AgentReplyError
from test_agent_local import SlowFreezeGuestAgent, _client, slow_freeze_agent

pytestmark = pytest.mark.lab
__all__ = ["slow_freeze_agent"]      # the fixture, used by name

THAW = "guest-fsfreeze-thaw"


async def _until(cond: Any, what: str, log: Path, timeout: float = 20) -> None:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, f"{what}; log tail: " + \
            "\n".join(log.read_text().splitlines()[-15:])
        await asyncio.sleep(0.05)


async def test_failed_thaw_is_retried_until_it_succeeds(
        slow_freeze_agent: dict[str, Any]) -> None:
    a = slow_freeze_agent
    g: SlowFreezeGuestAgent = a["guest"]
    log, journal = a["dir"] / "agent.log", a["dir"] / "journal"
    g.answer_freeze, g.fail_thaws = True, 2
    thaws = g.commands.count(THAW)
    try:
        async with _client(a) as c:
            prep = await c.prepare("rt1", ["vq"], 60000, quiesce="fs-freeze", timeout=20)
            assert prep["vms"][0]["consistency"] == "fs-freeze"
            res = await c.commit("rt1", {"vq/disk0": "cp.rt.rt1"}, 5000, timeout=20)
        assert "Input/output error" in res["vms"][0]["thaw_error"], res
        assert g.frozen
        await _until(lambda: not g.frozen, "guest still frozen", log)
        assert g.commands.count(THAW) == thaws + 3
        await _until(lambda: journal.read_text() == "", "frozen entry not removed", log)
        text = log.read_text()
        first = text.index("event=thaw_failed vm=vq txn=rt1 retry=yes")
        second = text.index("event=thaw_retry vm=vq txn=rt1 attempt=2 result=failed")
        third = text.index("event=thaw_retry vm=vq txn=rt1 attempt=3 result=ok")
        assert first < second < third
    finally:
        g.answer_freeze, g.fail_thaws = False, 0


async def test_late_freeze_answer_is_thawed_at_once(
        slow_freeze_agent: dict[str, Any]) -> None:
    a = slow_freeze_agent
    g: SlowFreezeGuestAgent = a["guest"]
    log = a["dir"] / "agent.log"
    g.answer_freeze, g.freeze_delay = True, 0.8
    try:
        async with _client(a) as c:
            prep = await c.prepare("lf1", ["vq"], 60000, quiesce="fs-freeze",
                                   freeze_timeout_ms=300, timeout=20)
            v = prep["vms"][0]
            assert v["consistency"] == "crash" and v["freeze_error"], v
            # Still prepared (VM paused, lease 60 s): the freeze that
            # answered late was thawed before the prepare returned.  The
            # guest agent is serial, so that thaw ran after the freeze.
            thaws = g.commands.count(THAW)
            assert not g.frozen and thaws > 0
            assert g.commands[-3:] == ["guest-fsfreeze-freeze", "guest-sync-delimited", THAW]
            text = log.read_text()
            assert text.index("event=freeze_late_thaw vm=vq txn=lf1") < \
                text.index("event=thawed vm=vq txn=lf1") < text.index("event=prepared txn=lf1")
            await c.abort("lf1")
    finally:
        g.answer_freeze, g.freeze_delay = False, 0.0


async def test_prepare_failure_after_freeze_leaves_no_guest_frozen(
        slow_freeze_agent: dict[str, Any]) -> None:
    a = slow_freeze_agent
    g: SlowFreezeGuestAgent = a["guest"]
    log, journal = a["dir"] / "agent.log", a["dir"] / "journal"
    g.answer_freeze, g.fail_thaws = True, 1
    thaws = g.commands.count(THAW)
    os.kill(a["qemu_pid"], signal.SIGSTOP)        # the stop times out
    try:
        async with _client(a) as c:
            with pytest.raises(AgentReplyError) as ei:
                await c.prepare("pf1", ["vq"], 60000, quiesce="fs-freeze", timeout=20)
        assert ei.value.code == "QMP_TIMEOUT"
        assert g.frozen and g.commands.count(THAW) == thaws + 1
    finally:
        os.kill(a["qemu_pid"], signal.SIGCONT)
    try:
        await _until(lambda: not g.frozen, "guest left frozen after the failed prepare", log)
        await _until(lambda: journal.read_text() == "", "journal not empty", log)
        assert "event=thaw_retry vm=vq txn=pf1 attempt=2 result=ok" in log.read_text()
    finally:
        g.answer_freeze, g.fail_thaws = False, 0
