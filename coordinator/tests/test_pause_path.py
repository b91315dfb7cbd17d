"""The pause path of each member (agent-protocol §5.1): which path the
agent cut the VM on, and why a VM that can take the redirect cut was cut
in the pause, from the agent's replies to the transaction log.

The reply entries are the agent's (agent/prepare.c prepare_done,
agent/txn_vm.c): the prepare reply carries pause_path_why when the VM fell
back, the commit reply carries pause_path alone.
"""

from __future__ import annotations

from cutpoint.coordinator import TxLog
from cutpoint.coordinator.results import VMTiming

WHY = "the overlays of its next cut were still being made"


def prepare_entry(path: str, why: str | None = None) -> dict[str, object]:
    e: dict[str, object] = {"vm": "vm1", "stop_ms": 0.4, "overrun_ms": 0, "pause_path": path}
    if why is not None:
        e["pause_path_why"] = why
    return e


def test_why_from_the_prepare_reply_survives_the_commit_reply() -> None:
    t = VMTiming(vm="vm1", agent="h1")
    t.update(prepare_entry("in_pause", WHY))
    assert (t.pause_path, t.pause_path_why) == ("in_pause", WHY)
    t.update({"vm": "vm1", "pause_path": "in_pause", "paused_ms": 41.0})
    assert (t.pause_path, t.pause_path_why) == ("in_pause", WHY)


def test_redirect_has_no_why() -> None:
    t = VMTiming(vm="vm1", agent="h1")
    t.update(prepare_entry("in_pause", WHY))
    t.update(prepare_entry("redirect"))
    assert (t.pause_path, t.pause_path_why) == ("redirect", None)
    # an empty or non-string reason is no reason
    t.update(prepare_entry("in_pause", ""))
    assert t.pause_path_why is None
    t.update({"vm": "vm1", "pause_path": "in_pause", "pause_path_why": 3})
    assert t.pause_path_why is None


def test_why_is_kept_in_the_log(txlog: TxLog) -> None:
    t = VMTiming(vm="vm1", agent="h1")
    t.update(prepare_entry("in_pause", WHY))
    txlog.begin("pp1", "g", {}, [], lease_ms=1, budget_ms=1)
    txlog.transition("pp1", "aborting", vms=[{"vm": t.vm, "agent": t.agent,
                                              "pause_path": t.pause_path,
                                              "pause_path_why": t.pause_path_why}])
    rec = txlog.get("pp1")
    assert rec is not None
    assert (rec.vms[0]["pause_path"], rec.vms[0]["pause_path_why"]) == ("in_pause", WHY)
    back = VMTiming(vm="vm1", agent="h1")
    back.update(rec.vms[0])
    assert back.pause_path_why == WHY
