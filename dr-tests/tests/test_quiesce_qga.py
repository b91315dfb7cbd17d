"""Unit tests of the fs-freeze quiesce prototype (cutpoint.checkers.quiesce).

The guest agent side replays ``data/qga_transcript.json``: the bytes that
qemu-guest-agent really sent in the Debian PostgreSQL guest during
``python -m cutpoint.checkers.quiesce`` (sync, fsfreeze-freeze, -thaw).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest
from cutpoint.checkers import quiesce

DATA = Path(__file__).parent / "data" / "qga_transcript.json"


class ReplayAgent(threading.Thread):
    """A UNIX socket that, for each line received, sends the next recorded
    reply; with ``replies=None`` it accepts and never answers."""

    def __init__(self, path: Path, replies: list[bytes] | None):
        super().__init__(daemon=True)
        self.replies = replies
        self.got: list[bytes] = []
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(str(path))
        self.srv.listen(1)

    def run(self) -> None:
        conn, _ = self.srv.accept()
        with conn:
            buf = b""
            while True:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    self.got.append(line)
                    if self.replies:
                        conn.sendall(self.replies.pop(0))


def _recorded() -> tuple[list[bytes], int]:
    t = json.loads(DATA.read_text())["live"][0]
    replies = [b.encode("latin-1") for d, b in t if d == "received"]
    sync = json.loads(next(b for d, b in t if d == "sent"))
    return replies, sync["arguments"]["id"]


class FakeVM:
    """Stands in for QMP only; it records the order of pause and resume."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float]] = []

    def qmp(self, cmd: str) -> None:
        self.calls.append((cmd, time.monotonic()))


def test_recorded_agent_freezes_and_thaws_after_cont(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    replies, rid = _recorded()
    monkeypatch.setattr(quiesce.random, "randint", lambda a, b: rid)
    agent = ReplayAgent(tmp_path / "qga.sock", replies)
    agent.start()
    vm = FakeVM()
    snaps: list[float] = []
    rec = quiesce.quiesced_snapshot(vm.qmp, tmp_path / "qga.sock",
                                    lambda: snaps.append(time.monotonic()))
    assert rec.consistency == "fs-freeze" and rec.freeze_error is None
    assert rec.frozen_fs > 0 and rec.thaw_error is None
    cmds = [json.loads(g)["execute"] for g in agent.got]
    assert cmds == ["guest-sync-delimited", "guest-fsfreeze-freeze",
                    "guest-fsfreeze-thaw"]
    assert [c for c, _ in vm.calls] == ["stop", "cont"]
    assert vm.calls[0][1] <= snaps[0] <= vm.calls[1][1]


def test_agent_that_never_answers_falls_back_to_crash(tmp_path: Path) -> None:
    agent = ReplayAgent(tmp_path / "qga.sock", None)
    agent.start()
    vm = FakeVM()
    rec = quiesce.quiesced_snapshot(vm.qmp, tmp_path / "qga.sock",
                                    lambda: None, sync_timeout=0.2,
                                    freeze_timeout=0.2, thaw_timeout=0.2)
    assert rec.consistency == "crash"
    assert rec.freeze_error and "timed out" in rec.freeze_error
    assert [c for c, _ in vm.calls] == ["stop", "cont"]
    # The freeze never got as far as being sent; the snapshot still ran.
    assert json.loads(agent.got[0])["execute"] == "guest-sync-delimited"


def test_no_agent_socket_falls_back_to_crash(tmp_path: Path) -> None:
    vm = FakeVM()
    rec = quiesce.quiesced_snapshot(vm.qmp, tmp_path / "absent.sock",
                                    lambda: None)
    assert rec.consistency == "crash" and rec.freeze_error
    assert [c for c, _ in vm.calls] == ["stop", "cont"]


def test_crash_mode_never_touches_the_agent(tmp_path: Path) -> None:
    vm = FakeVM()
    rec = quiesce.quiesced_snapshot(vm.qmp, tmp_path / "absent.sock",
                                    lambda: None, mode="crash")
    assert rec.consistency == "crash" and rec.freeze_error is None


def test_bad_mode_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="crash or fs-freeze"):
        quiesce.quiesced_snapshot(FakeVM().qmp, tmp_path / "x", lambda: None,
                                  mode="vss")


# -- through the real agent and coordinator (lab marker: QEMU + cutpointd) -----
@pytest.mark.lab
def test_coordinator_fs_freeze_through_cutpointd_falls_back(tmp_path: Path) -> None:
    """`quiesce: fs-freeze` from a group spec reaches the real agent; a
    guest agent that does not answer (vm1) and a VM without one (vm2) both
    fall back to crash; the group still commits and the coordinator records
    the level and the reason per VM, in its result and its log.  A crash
    group on the same VMs records no freeze at all."""
    import asyncio
    import tempfile

    from cutpoint.bench.quiesce import start_local_rig
    from cutpoint.coordinator import (
        AgentSpec,
        GroupSpec,
        TlsSpec,
        TxLog,
        VMSpec,
        take_group_snapshot,
    )

    d = Path(tempfile.mkdtemp(prefix="cpqz.", dir="/tmp"))  # short UNIX paths
    rig = start_local_rig(d)
    port, certs = rig.port, rig.certs
    try:
        def spec(q: str) -> GroupSpec:
            return GroupSpec(
                name="qz", lease_ms=3000, budget_ms=3000, quiesce=q, freeze_timeout_ms=1000,
                tls=TlsSpec(str(certs / "ca.pem"), str(certs / "coordinator.pem"),
                            str(certs / "coordinator.key")),
                agents=(AgentSpec("local", "127.0.0.1", port,
                                  (VMSpec("vm1", ("disk0",)), VMSpec("vm2", ("disk0",)))),))
        txlog = TxLog(f"sqlite:///{tmp_path}/c.db")
        res = asyncio.run(take_group_snapshot(spec("fs-freeze"), txlog, txn="f1"))
        crash = asyncio.run(take_group_snapshot(spec("crash"), txlog, txn="c1"))
        rec = txlog.get("f1")
        txlog.dispose()
    finally:
        log = rig.stop()
    assert res.state == "committed", (res.reason, log[-2000:])
    v = {t.vm: t for t in res.vms}
    assert v["vm1"].consistency == "crash"
    assert "guest-sync-delimited" in (v["vm1"].freeze_error or "")
    assert v["vm1"].freeze_ms is not None and v["vm1"].freeze_ms >= 999
    # The freeze never got past the sync, so it cannot have frozen the
    # guest: no thaw is queued for it (agent-protocol §4.3).
    assert v["vm1"].thaw_ms is None
    assert v["vm2"].freeze_error == "no qga socket configured for vm vm2"
    # The freeze wait is not inside the pause window.
    assert v["vm1"].paused_ms is not None and v["vm1"].paused_ms < v["vm1"].freeze_ms
    assert res.quiesce == "fs-freeze" and res.consistency == "crash"
    assert rec is not None
    assert {r["vm"]: r["consistency"] for r in rec.vms} == {"vm1": "crash", "vm2": "crash"}
    assert all(r["freeze_error"] for r in rec.vms)
    assert "event=freeze_failed" in log
    assert crash.state == "committed"
    assert all(t.consistency == "crash" and t.freeze_error is None for t in crash.vms)


def test_bench_rows_summary_and_table_from_recorded_replies() -> None:
    """cutpoint-lab bench quiesce's row/summary/table on results built from the
    recorded cutpointd replies (coordinator/tests/data/quiesce_replies.json)."""
    from cutpoint.bench import quiesce as bench
    from cutpoint.coordinator.results import GroupSnapshotResult, VMTiming

    rec = json.loads((Path(__file__).resolve().parents[2] / "coordinator" / "tests" / "data"
                      / "quiesce_replies.json").read_text())
    rows = []
    for phase, which, q in (("live", "live", "fs-freeze"), ("dead-agent", "dead", "fs-freeze")):
        t = VMTiming(vm="qz-vm", agent="qz-host")
        t.update(rec[which]["commit"]["vms"][0])
        res = GroupSnapshotResult("t", "qz", "committed", quiesce=q, vms=[t],
                                  timings={"prepare_ms": 1.0, "total_ms": 2.0})
        rows.append(bench.row(res, phase))
    s = {(x["phase"], x["quiesce"]): x for x in bench.summarize(rows)}
    assert s[("live", "fs-freeze")]["consistency"] == {"fs-freeze": 1}
    assert s[("dead-agent", "fs-freeze")]["consistency"] == {"crash": 1}
    assert rows[1]["freeze_error"].startswith("guest-sync-delimited")
    table = bench.table({"summary": bench.summarize(rows)})
    assert table.splitlines()[2].startswith("live | fs-freeze | 1 | fs-freeze x1")
    assert "dead-agent | fs-freeze | 1 | crash x1" in table
