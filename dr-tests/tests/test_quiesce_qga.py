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
