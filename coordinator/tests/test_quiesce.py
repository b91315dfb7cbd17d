"""quiesce through the coordinator: group spec / group file
→ PREPARE → per-member consistency in the result and the transaction log.

The agent side replays `data/quiesce_replies.json`: the prepare and commit
replies of the real `cutpointd` driving the Debian PostgreSQL VM with its
qemu-guest-agent live ("live") and stopped inside the guest ("dead"),
recorded by `cutpoint-lab bench quiesce` (cutpoint.bench.quiesce.record_replies).
"""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from cutpoint.coordinator import (
    GroupFileError,
    GroupSnapshotResult,
    GroupSpec,
    SpecError,
    TxLog,
    load_group_file,
    take_group_snapshot,
)
from cutpoint.coordinator.groupfile import dump_group_spec
from cutpoint.coordinator.results import weakest
from cutpoint.coordinator.twophase import _stale_at
from cutpoint.coordinator.txlog import COMMITTED

DATA = Path(__file__).parent / "data" / "quiesce_replies.json"
# Recorded by record_thaw_failed.py: a commit reply whose thaw failed.
THAW_DATA = Path(__file__).parent / "data" / "thaw_failed_replies.json"
FACTS = ("consistency", "freeze_ms", "thaw_ms", "freeze_error")


def recorded(which: str) -> dict[str, Any]:
    """The per-VM quiesce facts of the recorded commit reply."""
    v = json.loads(DATA.read_text())[which]["commit"]["vms"][0]
    return {k: v[k] for k in FACTS}


# -- the spec ------------------------------------------------------------------
def test_spec_quiesce_defaults_and_validation(make_spec: Any) -> None:
    spec = GroupSpec.from_dict({"group": "g", "agents": [
        {"address": "10.0.0.1", "vms": [{"name": "v", "disks": ["disk0"]}]}]})
    assert spec.quiesce == "crash" and spec.freeze_allowance_ms == 0
    assert spec.prepare_wait_ms == spec.effective_prepare_timeout_ms == 1000
    with pytest.raises(SpecError, match="quiesce: 'app' must be one of crash, fs-freeze"):
        GroupSpec.from_dict({**spec.to_dict(), "quiesce": "app"})
    with pytest.raises(SpecError, match="freeze_timeout_ms"):
        GroupSpec.from_dict({**spec.to_dict(), "quiesce": "fs-freeze",
                             "freeze_timeout_ms": 0})


def test_fs_freeze_extends_prepare_wait_not_the_lease_bound() -> None:
    d = {"group": "g", "lease_ms": 2000, "quiesce": "fs-freeze", "freeze_timeout_ms": 3000,
         "agents": [{"address": "10.0.0.1", "vms": [{"name": "v", "disks": ["disk0"]}]}]}
    spec = GroupSpec.from_dict(d)
    # sync 1 s + freeze 3 s + margin 1 s in front of the lease-bound part.
    assert spec.freeze_allowance_ms == 5000
    assert spec.prepare_wait_ms == 1000 + 5000
    assert spec.thaw_allowance_ms == 1000 + 5000 + 1000
    # The part after the pause begins must still be below the lease.
    with pytest.raises(SpecError, match="below lease_ms"):
        GroupSpec.from_dict({**d, "prepare_timeout_ms": 2000})
    assert GroupSpec.from_dict(spec.to_dict()) == spec


def test_group_file_carries_quiesce(tmp_path: Path) -> None:
    for f in ("ca.pem", "c.pem", "c.key"):
        (tmp_path / f).write_text("x")
    g = tmp_path / "g.yaml"
    g.write_text("group: db\nquiesce: fs-freeze\nfreeze_timeout_ms: 2000\n"
                 "tls: {ca: ca.pem, cert: c.pem, key: c.key}\n"
                 "agents: [{address: 10.0.0.1, vms: [{name: v, disks: [disk0]}]}]\n")
    spec = load_group_file(g)
    assert (spec.quiesce, spec.freeze_timeout_ms) == ("fs-freeze", 2000)
    g.write_text(dump_group_spec(spec))
    assert load_group_file(g) == spec
    g.write_text(g.read_text().replace("fs-freeze", "fsfreeze"))
    with pytest.raises(GroupFileError, match="quiesce: 'fsfreeze'"):
        load_group_file(g)


# -- pass-through and recording ----------------------------------------------
async def test_fs_freeze_reaches_agents_and_is_recorded(peers: Any, make_spec: Any,
                                                        txlog: TxLog) -> None:
    """Two agents: one whose guest agent froze (recorded live reply), one
    whose guest agent did not answer (recorded dead reply).  Both commit;
    each VM's level and fallback reason is in the result and the log, and
    the group is only as consistent as its weakest member."""
    a = await peers("h1", {"vm1": ["disk0", "disk1"]})
    b = await peers("h2", {"vm2": ["disk0"]})
    a.quiesce_facts["vm1"] = recorded("live")
    b.quiesce_facts["vm2"] = recorded("dead")
    spec = make_spec([a, b], quiesce="fs-freeze")
    res = await take_group_snapshot(spec, txlog, txn="q1")
    assert res.state == COMMITTED, res.errors
    for p in (a, b):
        prep = [r for r in p.requests if r["cmd"] == "prepare"]
        assert [r["args"].get("quiesce") for r in prep] == ["fs-freeze"]
    vms = {v.vm: v for v in res.vms}
    assert vms["vm1"].consistency == "fs-freeze" and vms["vm1"].freeze_error is None
    assert vms["vm1"].freeze_ms == recorded("live")["freeze_ms"]
    assert vms["vm1"].thaw_ms == recorded("live")["thaw_ms"]
    assert vms["vm2"].consistency == "crash"
    assert "guest-sync-delimited" in (vms["vm2"].freeze_error or "")
    assert res.quiesce == "fs-freeze" and res.consistency == "crash"
    d = res.to_dict()
    assert d["consistency"] == "crash" and d["vms"][0]["consistency"] in ("fs-freeze", "crash")
    # The log keeps the same facts, and an idempotent repeat returns them.
    rec = txlog.get("q1")
    assert rec is not None
    logged = {v["vm"]: v for v in rec.vms}
    assert logged["vm1"]["consistency"] == "fs-freeze"
    assert logged["vm2"]["freeze_error"] == vms["vm2"].freeze_error
    again = await take_group_snapshot(spec, txlog, txn="q1")
    assert again.from_log and again.quiesce == "fs-freeze"
    assert {v.vm: (v.consistency, v.freeze_error) for v in again.vms} == \
        {v.vm: (v.consistency, v.freeze_error) for v in res.vms}


async def test_crash_sends_no_quiesce_and_records_crash(peers: Any, make_spec: Any,
                                                        txlog: TxLog) -> None:
    a = await peers("h1", {"vm1": ["disk0"]})
    a.quiesce_facts["vm1"] = recorded("live")       # would freeze if asked
    res = await take_group_snapshot(make_spec([a]), txlog, txn="c1")
    assert res.state == COMMITTED
    assert "quiesce" not in next(r for r in a.requests if r["cmd"] == "prepare")["args"]
    assert res.vms[0].consistency == "crash" and res.vms[0].freeze_error is None
    assert res.consistency == "crash" and res.quiesce == "crash"


async def test_vm_without_guest_agent_falls_back(peers: Any, make_spec: Any,
                                                 txlog: TxLog) -> None:
    a = await peers("h1", {"vm1": ["disk0"]})       # no facts: no qga socket
    res = await take_group_snapshot(make_spec([a], quiesce="fs-freeze"), txlog, txn="n1")
    assert res.state == COMMITTED
    assert res.vms[0].consistency == "crash"
    assert res.vms[0].freeze_error == "no qga socket configured for vm vm1"


async def test_prepare_wait_covers_a_slow_freeze(peers: Any, make_spec: Any,
                                                 txlog: TxLog) -> None:
    """A freeze longer than the plain prepare timeout (lease/2 = 1 s) still
    commits: the wait for PREPARED includes the freeze deadline.  The same
    agent delay in front of a crash-mode PREPARE would abort."""
    a = await peers("h1", {"vm1": ["disk0"]})
    a.quiesce_facts["vm1"] = recorded("live")
    a.freeze_delay_s = 1.5
    spec = make_spec([a], quiesce="fs-freeze", freeze_timeout_ms=1000)
    assert spec.effective_prepare_timeout_ms < a.freeze_delay_s * 1000 < spec.prepare_wait_ms
    res = await take_group_snapshot(spec, txlog, txn="s1")
    assert res.state == COMMITTED, res.reason
    assert res.timings["prepare_ms"] is not None and res.timings["prepare_ms"] >= 1500
    # Negative control: without the allowance the coordinator gives up.
    a.hang.add("prepare")
    res2 = await take_group_snapshot(make_spec([a]), txlog, txn="s2")
    assert res2.state != COMMITTED and "TIMEOUT" in (res2.reason or "")
    assert res2.timings["prepare_ms"] < 1500


def thaw_failed_reply() -> dict[str, Any]:
    """The recorded commit reply of cutpointd for a VM whose thaw failed."""
    return dict(json.loads(THAW_DATA.read_text())["thaw_failed"]["commit"]["vms"][0])


async def test_prepare_sends_the_freeze_timeout_it_waits_for(peers: Any, make_spec: Any,
                                                             txlog: TxLog) -> None:
    """fs-freeze PREPARE carries the freeze timeout the coordinator sized its
    wait on (the agent uses min(its own, this)); crash PREPARE carries none,
    so agents that predate the argument still accept it."""
    a = await peers("h1", {"vm1": ["disk0"]})
    a.quiesce_facts["vm1"] = recorded("live")
    spec = make_spec([a], quiesce="fs-freeze", freeze_timeout_ms=1700)
    assert (await take_group_snapshot(spec, txlog, txn="ft1")).state == COMMITTED
    prep = [r["args"] for r in a.requests if r["cmd"] == "prepare"]
    assert [p.get("freeze_timeout_ms") for p in prep] == [1700]
    assert spec.prepare_wait_ms >= spec.effective_prepare_timeout_ms + 1000 + 1700
    a.requests.clear()
    assert (await take_group_snapshot(make_spec([a]), txlog, txn="ft2")).state == COMMITTED
    prep = [r["args"] for r in a.requests if r["cmd"] == "prepare"]
    assert prep and all("freeze_timeout_ms" not in p for p in prep)


async def test_failed_thaw_is_recorded_and_logged(peers: Any, make_spec: Any, txlog: TxLog,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    """A thaw that failed after `cont` (recorded cutpointd reply) does not
    fail the group snapshot, but its reason reaches the result, the log and
    the coordinator log; a VM whose thaw worked has none."""
    a = await peers("h1", {"vm1": ["disk0"], "vm2": ["disk0"]})
    a.quiesce_facts["vm1"] = recorded("live")
    a.quiesce_facts["vm2"] = {k: v for k, v in thaw_failed_reply().items()
                              if k in (*FACTS, "thaw_error")}
    caplog.set_level("WARNING", logger="cutpoint.coordinator")
    res = await take_group_snapshot(make_spec([a], quiesce="fs-freeze"), txlog, txn="th1")
    assert res.state == COMMITTED, res.errors
    vms = {v.vm: v for v in res.vms}
    want = "guest-sync-delimited: guest agent did not answer before the deadline"
    assert vms["vm2"].thaw_error == want and vms["vm1"].thaw_error is None
    assert res.to_dict()["vms"][1]["thaw_error"] == want
    rec = txlog.get("th1")
    assert rec is not None
    assert {v["vm"]: v["thaw_error"] for v in rec.vms} == {"vm1": None, "vm2": want}
    lines = [r.getMessage() for r in caplog.records if "event=thaw_failed" in r.getMessage()]
    assert len(lines) == 1 and "vm=vm2" in lines[0] and "txn=th1" in lines[0], lines
    again = await take_group_snapshot(make_spec([a], quiesce="fs-freeze"), txlog, txn="th1")
    assert again.from_log and {v.vm: v.thaw_error for v in again.vms} == \
        {"vm1": None, "vm2": want}


async def test_failed_thaw_after_abort_is_recorded(peers: Any, make_spec: Any,
                                                    txlog: TxLog) -> None:
    """One agent refuses PREPARE, so the group aborts; the other agent's
    abort reply says its thaw after cont failed: the result and the log
    keep it, though no snapshot was taken."""
    a = await peers("h1", {"vm1": ["disk0"]})
    b = await peers("h2", {"vm2": ["disk0"]})
    a.quiesce_facts["vm1"] = {k: v for k, v in thaw_failed_reply().items()
                              if k in (*FACTS, "thaw_error")}
    b.refuse["prepare"] = "BUSY"
    res = await take_group_snapshot(make_spec([a, b], quiesce="fs-freeze"), txlog, txn="ab1")
    assert res.state != COMMITTED
    vms = {v.vm: v for v in res.vms}
    assert vms["vm1"].thaw_error == thaw_failed_reply()["thaw_error"]
    assert vms["vm2"].thaw_error is None
    rec = txlog.get("ab1")
    assert rec is not None
    assert {v["vm"]: v["thaw_error"] for v in rec.vms}["vm1"] == vms["vm1"].thaw_error


def test_thaw_error_only_from_a_reply_that_carries_the_thaw() -> None:
    from cutpoint.coordinator.results import VMTiming

    t = VMTiming(vm="vm1", agent="h1")
    t.update(thaw_failed_reply())
    assert t.thaw_error and t.thaw_ms is not None
    t.update(json.loads(THAW_DATA.read_text())["thaw_failed"]["prepare"]["vms"][0])
    assert t.thaw_error, "a PREPARE reply says nothing about the thaw"
    t.update({**thaw_failed_reply(), "thaw_error": None})
    assert t.thaw_error is None


def test_stale_time_includes_freeze_and_thaw(txlog: TxLog, make_spec: Any) -> None:
    spec = GroupSpec.from_dict({"group": "g", "lease_ms": 2000, "budget_ms": 1000,
                                "quiesce": "fs-freeze", "agents": [
                                    {"address": "10.0.0.1",
                                     "vms": [{"name": "v", "disks": ["disk0"]}]}]})
    txlog.begin("st1", "g", spec.to_dict(), [], lease_ms=2000, budget_ms=1000)
    rec = txlog.get("st1")
    assert rec is not None
    extra = (_stale_at(rec) - rec.updated_at) - dt.timedelta(milliseconds=3000)
    assert extra.total_seconds() * 1000 >= spec.freeze_allowance_ms + spec.thaw_allowance_ms


def test_weakest_level() -> None:
    assert weakest(["fs-freeze", "fs-freeze"]) == "fs-freeze"
    assert weakest(["fs-freeze", "crash"]) == "crash"
    assert weakest(["fs-freeze", None]) is None
    assert weakest(["fs-freeze", "app-consistent"]) == "app-consistent"
    assert GroupSnapshotResult("t", "g", COMMITTED).consistency is None


def test_old_standalone_log_gains_the_quiesce_columns(tmp_path: Path) -> None:
    """A coordinator.db made before these columns existed still opens: the
    stand-alone log adds them (the control plane's gets them from Alembic)."""
    db = tmp_path / "old.db"
    log = TxLog(f"sqlite:///{db}")
    log.dispose()
    con = sqlite3.connect(db)
    con.execute("DROP TABLE coord_txn_vm")
    con.execute("CREATE TABLE coord_txn_vm (id INTEGER PRIMARY KEY, txn VARCHAR(128) NOT NULL,"
                " vm VARCHAR(128) NOT NULL, agent VARCHAR(255) NOT NULL, stop_ms FLOAT,"
                " barrier_ms FLOAT, snapshot_ms FLOAT, cont_ms FLOAT, paused_ms FLOAT,"
                " method VARCHAR(32))")
    con.commit()
    con.close()
    log = TxLog(f"sqlite:///{db}")
    log.begin("o1", "g", {}, [], lease_ms=1, budget_ms=1)
    log.transition("o1", "aborting", vms=[{"vm": "v", "agent": "a", "consistency": "crash",
                                           "freeze_error": "why", "thaw_error": "frozen"}])
    rec = log.get("o1")
    log.dispose()
    assert rec is not None and rec.vms[0]["freeze_error"] == "why"
    assert rec.vms[0]["thaw_error"] == "frozen"
