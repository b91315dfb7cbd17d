"""The coordinator's state machine against in-process protocol peers.

Each test starts from a known state, injects at most one fault, and checks
one outcome: the final state, what remains on the agents, and the order of
log writes and protocol messages (docs/design.md §5, rules R1-R5).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from cutpoint.agentclient import AgentPool
from cutpoint.agentclient.tls import client_context
from cutpoint.coordinator import (
    GroupBusy,
    TxLog,
    TxLogError,
    resolve_in_doubt,
    take_group_snapshot,
)
from cutpoint.coordinator.txlog import ABORTED, COMMITTED, COMMITTING, PREPARING


def running(*peers: Any) -> bool:
    return all(v.state == "running" for p in peers for v in p.vms.values())


def remaining(txn: str, *peers: Any) -> list[str]:
    return [f"{d}@{n}" for p in peers for d, names in p.all_snapshots().items()
            for n in names if txn in n]


def log_state_at(txlog: TxLog, seen: list[tuple[str, str | None]], peer: Any) -> None:
    """Record, at the instant each request reaches the peer, the txn's state
    in the coordinator's log."""
    def hook(req: dict[str, Any]) -> None:
        txn = (req.get("args") or {}).get("txn")
        rec = txlog.get(txn) if txn else None
        seen.append((req["cmd"], rec.state if rec else None))
    peer.on_request = hook


async def test_commit_two_agents(peers: Any, make_spec: Any, txlog: TxLog) -> None:
    a = await peers("h1", {"vm1": ["disk0", "disk1"]})
    b = await peers("h2", {"vm2": ["disk0", "disk1"]})
    seen: list[tuple[str, str | None]] = []
    log_state_at(txlog, seen, a)
    log_state_at(txlog, seen, b)
    res = await take_group_snapshot(make_spec([a, b]), txlog, txn="t1")
    assert res.state == COMMITTED, res.errors
    name = "cp.g1.t1"
    assert res.snapshots == {"vm1/disk0": name, "vm1/disk1": name,
                             "vm2/disk0": name, "vm2/disk1": name}
    assert a.all_snapshots() == {"vm1/disk0": {name}, "vm1/disk1": {name}}
    assert b.all_snapshots() == {"vm2/disk0": {name}, "vm2/disk1": {name}}
    assert running(a, b)
    # R1/R2: PREPARE only under a durable PREPARING, COMMIT under COMMITTING.
    phases = sorted(x for x in seen if x[0] in ("prepare", "commit"))
    assert phases == [("commit", COMMITTING)] * 2 + [("prepare", PREPARING)] * 2
    # R3: every member snapshot was listed before COMMITTED was written.
    assert sorted(x for x in seen if x[0] == "snapshot.list") == [("snapshot.list", None)] * 4
    rec = txlog.get("t1")
    assert rec is not None and rec.states == [PREPARING, COMMITTING, COMMITTED]
    assert {s["state"] for s in rec.snapshots} == {"created"}
    # Timings per VM and per group are recorded.
    assert {v.vm for v in res.vms} == {"vm1", "vm2"}
    for v in res.vms:
        assert v.paused_ms is not None and v.snapshot_ms is not None
        assert v.overhead_ms is not None and v.overhead_ms >= 0
    assert {r["vm"] for r in rec.vms} == {"vm1", "vm2"}
    assert all(r["paused_ms"] is not None for r in rec.vms)
    for k in ("prepare_ms", "commit_ms", "total_ms", "pause_max_ms"):
        assert res.timings[k] is not None


async def test_cut_no_vm_resumes_before_all_paused(peers: Any, make_spec: Any,
                                                   txlog: TxLog) -> None:
    """Invariant 1, observed on the peers' shared clock."""
    ps = [await peers(f"h{i}", {f"vm{i}a": ["disk0"], f"vm{i}b": ["disk0"]})
          for i in range(3)]
    res = await take_group_snapshot(make_spec(ps), txlog)
    assert res.state == COMMITTED
    stops = [t for p in ps for v in p.vms.values() for e, t in v.history if e == "stop"]
    conts = [t for p in ps for v in p.vms.values() for e, t in v.history if e == "cont"]
    assert len(stops) == len(conts) == 6
    assert max(stops) < min(conts)


async def test_prepare_refused_aborts(peers: Any, make_spec: Any, txlog: TxLog) -> None:
    a = await peers("h1", {"vm1": ["disk0"]})
    b = await peers("h2", {"vm2": ["disk0"]})
    b.refuse["prepare"] = "QMP_TIMEOUT"
    res = await take_group_snapshot(make_spec([a, b]), txlog, txn="t2")
    assert res.state == ABORTED
    assert "prepare on h2: QMP_TIMEOUT" in (res.reason or "")
    assert running(a, b)
    assert remaining("t2", a, b) == []
    assert "commit" not in a.cmds() + b.cmds()
    assert a.cmds()[-1] == "abort" and b.cmds()[-1] == "abort"
    err = next(e for e in res.errors if e["agent"] == "h2")
    assert err["sent"]["cmd"] == "prepare" and err["received"]["error"]["code"] == "QMP_TIMEOUT"
    assert txlog.get("t2").states == [PREPARING, "aborting", ABORTED]  # type: ignore[union-attr]


async def test_agent_with_an_unpinned_certificate_gets_nothing(
        peers: Any, make_spec: Any, txlog: TxLog, pki: Any) -> None:
    """h2's pinned fingerprint is not the certificate its agent presents
    (signed by the same CA): the group aborts and h2 receives no request."""
    import dataclasses
    import hashlib
    import ssl

    a = await peers("h1", {"vm1": ["disk0"]})
    b = await peers("h2", {"vm2": ["disk0"]})
    spec = make_spec([a, b])
    other = hashlib.sha256(ssl.PEM_cert_to_DER_cert(
        Path(pki["coordinator"]["cert"]).read_text())).hexdigest()
    spec = dataclasses.replace(spec, agents=(
        spec.agents[0], dataclasses.replace(spec.agents[1], cert_sha256=other)))
    res = await take_group_snapshot(spec, txlog, txn="tpin")
    assert res.state == ABORTED
    assert "CERT_MISMATCH" in (res.reason or ""), res.reason
    assert b.cmds() == [] and running(a, b)
    assert remaining("tpin", a, b) == []


async def test_prepare_timeout_aborts(peers: Any, make_spec: Any, txlog: TxLog) -> None:
    a = await peers("h1", {"vm1": ["disk0"]})
    b = await peers("h2", {"vm2": ["disk0"]})
    b.hang.add("prepare")
    spec = make_spec([a, b], lease_ms=5000, prepare_timeout_ms=300)
    res = await take_group_snapshot(spec, txlog, txn="t3")
    assert res.state == ABORTED
    assert "TIMEOUT" in (res.reason or "")
    assert running(a, b)  # a was resumed by ABORT, not by its 5 s lease
    assert remaining("t3", a, b) == []
    assert "commit" not in a.cmds() + b.cmds()


async def test_snapshot_fails_on_one_disk(peers: Any, make_spec: Any, txlog: TxLog) -> None:
    a = await peers("h1", {"vm1": ["disk0", "disk1"]})
    b = await peers("h2", {"vm2": ["disk0", "disk1"]})
    b.fail_snapshot.add("vm2/disk1")
    res = await take_group_snapshot(make_spec([a, b]), txlog, txn="t4")
    assert res.state == ABORTED
    assert "SNAPSHOT_FAILED" in (res.reason or "")
    assert running(a, b)
    # The member snapshots that were created (vm1/*, vm2/disk0) are gone.
    assert remaining("t4", a, b) == []
    rec = txlog.get("t4")
    assert rec is not None and rec.states == [PREPARING, COMMITTING, "aborting", ABORTED]
    assert "snapshot.list" in a.cmds()  # cleanup was verified, not assumed


async def test_snapshot_reported_but_missing_aborts(peers: Any, make_spec: Any,
                                                    txlog: TxLog) -> None:
    """An agent answers COMMITTED but one member snapshot does not exist:
    the coordinator's check (design §5 R3) aborts the group."""
    a = await peers("h1", {"vm1": ["disk0", "disk1"]})
    b = await peers("h2", {"vm2": ["disk0"]})
    b.lie_snapshot.add("vm2/disk0")
    res = await take_group_snapshot(make_spec([a, b]), txlog, txn="tl")
    assert res.state == ABORTED
    assert "vm2/disk0@cp.g1.tl is not listed" in (res.reason or ""), res.reason
    assert running(a, b) and remaining("tl", a, b) == []


async def test_lease_expiry_before_commit_aborts(peers: Any, make_spec: Any,
                                                 txlog: TxLog) -> None:
    a = await peers("h1", {"vm1": ["disk0"]})
    b = await peers("h2", {"vm2": ["disk0"]})

    async def slow(txn: str, phase: str) -> None:
        if phase == "prepared":
            await asyncio.sleep(0.4)  # longer than the 200 ms lease

    spec = make_spec([a, b], lease_ms=200, prepare_timeout_ms=100)
    res = await take_group_snapshot(spec, txlog, txn="t5", on_event=slow)
    assert res.state == ABORTED
    assert "EXPIRED" in (res.reason or "")
    assert running(a, b) and remaining("t5", a, b) == []


async def test_database_unavailable_pauses_nothing(peers: Any, make_spec: Any) -> None:
    a = await peers("h1", {"vm1": ["disk0"]})
    log = TxLog("postgresql+psycopg://cp:secret@127.0.0.1:1/cutpoint", create=False)
    with pytest.raises(TxLogError) as ei:
        await take_group_snapshot(make_spec([a]), log, txn="t6")
    assert "127.0.0.1:1" in str(ei.value) and "secret" not in str(ei.value)
    assert a.requests == []
    assert running(a)


async def test_idempotent_by_txn(peers: Any, make_spec: Any, txlog: TxLog) -> None:
    a = await peers("h1", {"vm1": ["disk0"]})
    spec = make_spec([a])
    first = await take_group_snapshot(spec, txlog, txn="t7")
    n = len(a.requests)
    again = await take_group_snapshot(spec, txlog, txn="t7")
    assert first.state == again.state == COMMITTED
    assert again.from_log and again.snapshots == first.snapshots
    assert len(a.requests) == n  # nothing sent the second time


async def test_connections_are_reused(peers: Any, make_spec: Any, txlog: TxLog,
                                      pki: Any) -> None:
    a = await peers("h1", {"vm1": ["disk0"]})
    spec = make_spec([a])
    async with AgentPool(client_context(pki["ca"]["cert"], pki["coordinator"]["cert"],
                                        pki["coordinator"]["key"])) as pool:
        for _ in range(3):
            assert (await take_group_snapshot(spec, txlog, pool=pool)).committed
        assert pool.get(a.address, a.port).connects == 1


async def test_group_busy(peers: Any, make_spec: Any, txlog: TxLog) -> None:
    a = await peers("h1", {"vm1": ["disk0"]})
    spec = make_spec([a])
    txlog.begin("live", "g1", spec.to_dict(), [], lease_ms=2000, budget_ms=1000)
    with pytest.raises(GroupBusy):
        await take_group_snapshot(spec, txlog)
    assert a.requests == []


async def _pool(pki: Any) -> AgentPool:
    return AgentPool(client_context(pki["ca"]["cert"], pki["coordinator"]["cert"],
                                    pki["coordinator"]["key"]))


@pytest.mark.parametrize("phase", ["prepared", "committing"])
async def test_coordinator_kill9_between_prepare_and_commit(
        peers: Any, make_spec: Any, tmp_path: Path, pki: Any, phase: str) -> None:
    """A real coordinator process is killed -9 after every agent PREPARED
    (before the COMMITTING write, or after it but before COMMIT is sent).
    The VMs run again within lease + 100 ms; a restarted coordinator marks
    the txn aborted and no member snapshot remains."""
    a = await peers("h1", {"vm1": ["disk0", "disk1"]})
    b = await peers("h2", {"vm2": ["disk0"]})
    lease_ms = 400
    spec = make_spec([a, b], lease_ms=lease_ms, budget_ms=200, prepare_timeout_ms=300)
    (tmp_path / "spec.json").write_text(json.dumps(spec.to_dict()))
    url = f"sqlite:///{tmp_path}/coordinator.db"
    marker = tmp_path / "marker"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(Path(__file__).with_name("coord_child.py")),
        str(tmp_path / "spec.json"), url, "tk", phase, str(marker))
    try:
        while not marker.exists():
            assert proc.returncode is None, "coordinator exited early"
            await asyncio.sleep(0.005)
        assert not running(a, b)  # every VM is paused at the kill
        proc.kill()
        t_kill = time.monotonic()
        await proc.wait()
        while not running(a, b):
            await asyncio.sleep(0.002)
        waited_ms = (time.monotonic() - t_kill) * 1000
        assert waited_ms <= lease_ms + 100
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert "commit" not in a.cmds() + b.cmds()
    txlog = TxLog(url)
    rec = txlog.get("tk")
    assert rec is not None and rec.state == (PREPARING if phase == "prepared" else COMMITTING)
    async with await _pool(pki) as pool:
        out = await resolve_in_doubt(txlog, pool)
    assert [r.txn for r in out] == ["tk"] and out[0].state == ABORTED
    assert txlog.get("tk").state == ABORTED  # type: ignore[union-attr]
    assert running(a, b) and remaining("tk", a, b) == []
    txlog.dispose()


async def test_in_doubt_committing_is_finished(peers: Any, make_spec: Any, txlog: TxLog,
                                               pki: Any) -> None:
    """COMMIT reached every agent but COMMITTED was never written."""
    a = await peers("h1", {"vm1": ["disk0"]})
    spec = make_spec([a], lease_ms=300, budget_ms=100, prepare_timeout_ms=200)
    res = await take_group_snapshot(spec, txlog, txn="t9")
    assert res.committed
    from cutpoint.coordinator.txlog import coord_txn, coord_txn_event
    from sqlalchemy import delete, update
    with txlog.engine.begin() as c:
        c.execute(update(coord_txn).where(coord_txn.c.txn == "t9").values(state=COMMITTING))
        c.execute(delete(coord_txn_event).where(coord_txn_event.c.txn == "t9",
                                                coord_txn_event.c.state == COMMITTED))
    async with await _pool(pki) as pool:
        out = await resolve_in_doubt(txlog, pool)
    assert out[0].state == COMMITTED
    assert a.all_snapshots() == {"vm1/disk0": {"cp.g1.t9"}}


