"""Quiesce through the QEMU guest agent: spec and Python prototype.

Issue 8 item 4.  ``quiesce: fs-freeze`` adds a guest filesystem freeze
around the pause of the group snapshot, with a timeout and an automatic
fallback to crash-consistent; the level reached is recorded per member.

``cutpointd`` implements this since a2f21dd (prepare arg ``quiesce``) and
the coordinator passes a group's ``quiesce`` through (GroupSpec.quiesce);
the pause with and without fs-freeze through the real coordinator and
agent is measured by ``cutpoint-lab bench quiesce`` (cutpoint.bench.quiesce).
This module stays as the reference of the sequence and as a QGA client.

Spec (for the agent, ``cutpointd``; this module is the reference behaviour)
-------------------------------------------------------------------------
Per VM, inside PREPARE, *before* QMP ``stop`` (a paused guest cannot answer)::

    qga connect (virtio-serial chardev socket of the VM)
    guest-sync-delimited {id: R}   -- discard bytes up to 0xFF, expect
                                      {"return": R}; deadline T_sync
    guest-fsfreeze-freeze          -- deadline T_freeze; returns the number
                                      of filesystems frozen
      ok      -> level "fs-freeze"
      timeout / error / no agent -> level "crash", reason recorded, and a
                 best-effort guest-fsfreeze-thaw is queued for after cont
                 (a slow agent may still freeze after we gave up)
    QMP stop ... snapshot ... cont     (unchanged crash-consistent path)
    guest-fsfreeze-thaw            -- after cont, deadline T_thaw; on
                                      failure retry until the lease ends,
                                      then report THAW_FAILED (a guest left
                                      frozen is an outage, never silent)

- The freeze deadline counts against nothing but itself: the VM is still
  running while it waits, so a dead agent delays the snapshot by at most
  T_sync + T_freeze and never lengthens the pause window.
- ABORT and lease expiry thaw as well as resume.
- Reply fields per VM: ``consistency`` (``fs-freeze``|``crash``),
  ``freeze_ms``, ``thaw_ms``, ``freeze_error`` (string or null).
- Defaults: T_sync 1000 ms, T_freeze 5000 ms, T_thaw 5000 ms.
"""

from __future__ import annotations

import json
import random
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


class QGAError(RuntimeError):
    """A guest agent command failed or timed out; keeps sent/received."""

    def __init__(self, sent: dict[str, Any], received: Any, why: str):
        self.sent, self.received, self.why = sent, received, why
        super().__init__(f"guest agent {sent.get('execute')}: {why}; "
                         f"received={received!r}")


class QGA:
    """Client for qemu-guest-agent over the VM's chardev socket.

    Every call has a deadline; a sync with a random id before the first
    command discards stale replies from earlier, timed-out calls (QEMU guest
    agent protocol, ``guest-sync-delimited``)."""

    def __init__(self, path: Path, timeout: float = 1.0):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(str(path))
        self.buf = b""
        # (direction, bytes) of every exchange: the unit tests replay it.
        self.transcript: list[tuple[str, bytes]] = []

    def _send(self, data: bytes) -> None:
        self.transcript.append(("sent", data))
        self.sock.sendall(data)

    def _recv(self) -> bytes:
        chunk = self.sock.recv(65536)
        self.transcript.append(("received", chunk))
        return chunk

    def close(self) -> None:
        self.sock.close()

    def _line(self, sent: dict[str, Any], deadline: float) -> dict[str, Any]:
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise QGAError(sent, self.buf.decode(errors="replace"),
                               "timed out")
            self.sock.settimeout(left)
            try:
                chunk = self._recv()
            except TimeoutError as e:
                raise QGAError(sent, self.buf.decode(errors="replace"),
                               "timed out") from e
            if not chunk:
                raise QGAError(sent, self.buf.decode(errors="replace"),
                               "socket closed")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        try:
            msg: dict[str, Any] = json.loads(line.strip(b"\xff"))
        except json.JSONDecodeError as e:
            raise QGAError(sent, line, "reply is not JSON") from e
        return msg

    def sync(self, timeout: float) -> None:
        rid = random.randint(1, 2**31)
        sent = {"execute": "guest-sync-delimited", "arguments": {"id": rid}}
        deadline = time.monotonic() + timeout
        self.sock.settimeout(timeout)
        self._send(json.dumps(sent).encode() + b"\n")
        # The reply is preceded by 0xFF; drop everything before it.
        while b"\xff" not in self.buf:
            self.buf = b""
            left = deadline - time.monotonic()
            if left <= 0:
                raise QGAError(sent, None, "timed out")
            self.sock.settimeout(left)
            try:
                chunk = self._recv()
            except TimeoutError as e:
                raise QGAError(sent, None, "timed out") from e
            if not chunk:
                raise QGAError(sent, None, "socket closed")
            self.buf = chunk
        self.buf = self.buf[self.buf.rindex(b"\xff") + 1:]
        while True:
            msg = self._line(sent, deadline)
            if msg.get("return") == rid:
                return

    def execute(self, cmd: str, timeout: float,
                args: dict[str, Any] | None = None) -> Any:
        sent: dict[str, Any] = {"execute": cmd}
        if args is not None:
            sent["arguments"] = args
        deadline = time.monotonic() + timeout
        self._send(json.dumps(sent).encode() + b"\n")
        msg = self._line(sent, deadline)
        if "error" in msg:
            raise QGAError(sent, msg, msg["error"].get("desc", "error"))
        return msg.get("return")


@dataclass
class QuiesceRecord:
    mode: str                 # requested: crash | fs-freeze
    consistency: str          # reached:   crash | fs-freeze
    freeze_ms: float
    pause_ms: float           # QMP stop .. cont return
    snapshot_ms: float
    thaw_ms: float
    stall_ms: float           # freeze start .. thaw end (guest I/O blocked)
    frozen_fs: int
    freeze_error: str | None
    thaw_error: str | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def quiesced_snapshot(qmp_exec: Callable[..., Any], qga_path: Path,
                      snapshot: Callable[[], None], mode: str = "fs-freeze",
                      sync_timeout: float = 1.0, freeze_timeout: float = 5.0,
                      thaw_timeout: float = 5.0,
                      transcripts: list[Any] | None = None) -> QuiesceRecord:
    """One member snapshot with optional fs-freeze and crash fallback.

    ``qmp_exec(cmd)`` runs a QMP command on the VM; ``snapshot()`` takes the
    member snapshot while the VM is paused."""
    if mode not in ("crash", "fs-freeze"):
        raise ValueError(f"quiesce mode must be crash or fs-freeze: {mode!r}")
    level, err, nfs, freeze_ms = "crash", None, 0, 0.0
    qga: QGA | None = None
    t_start = time.monotonic()
    if mode == "fs-freeze":
        try:
            qga = QGA(qga_path, sync_timeout)
            qga.sync(sync_timeout)
            nfs = int(qga.execute("guest-fsfreeze-freeze", freeze_timeout))
            level = "fs-freeze"
        except (QGAError, OSError) as e:
            err = str(e)
        freeze_ms = (time.monotonic() - t_start) * 1e3
    thaw: dict[str, Any] = {"err": None, "ms": 0.0}

    def _thaw() -> None:
        # Thaw even after a failed freeze (a slow agent may have frozen
        # after we stopped waiting; thaw of a thawed guest returns 0) and
        # even if stop, the snapshot or cont raised: a guest must never be
        # left frozen.
        if qga is None:
            return
        t4 = time.monotonic()
        try:
            if err is not None:
                qga.sync(sync_timeout)
            qga.execute("guest-fsfreeze-thaw", thaw_timeout)
        except (QGAError, OSError) as e:
            thaw["err"] = None if err is not None else str(e)
        thaw["ms"] = (time.monotonic() - t4) * 1e3
        qga.close()
        if transcripts is not None:
            transcripts.append([(d, b.decode("latin-1"))
                                for d, b in qga.transcript])

    try:
        t0 = time.monotonic()
        qmp_exec("stop")
        t1 = time.monotonic()
        try:
            snapshot()
        finally:
            t2 = time.monotonic()
            qmp_exec("cont")
            t3 = time.monotonic()
    finally:
        _thaw()
    thaw_err, thaw_ms = thaw["err"], float(thaw["ms"])
    t_end = time.monotonic()
    return QuiesceRecord(
        mode=mode, consistency=level, freeze_ms=round(freeze_ms, 2),
        pause_ms=round((t3 - t0) * 1e3, 2),
        snapshot_ms=round((t2 - t1) * 1e3, 2), thaw_ms=round(thaw_ms, 2),
        stall_ms=round(((t_end - t_start) if level == "fs-freeze"
                        else (t3 - t0)) * 1e3, 2),
        frozen_fs=nfs, freeze_error=err, thaw_error=thaw_err)


def _member_snapshot(vm: Any, name: str) -> Callable[[], None]:
    def snap() -> None:
        vm.qmp.execute("transaction", {"actions": [
            {"type": "blockdev-snapshot-internal-sync",
             "data": {"device": vm.node_of[s], "name": name}}
            for s in ("cpwal", "cpdata", "cpjournal")]})
    return snap


def measure(workdir: Path, rounds: int = 5, freeze_timeout: float = 5.0,
            dead_rounds: int = 2) -> dict[str, Any]:
    """Pause with and without fs-freeze on one loaded PostgreSQL VM (same
    run, alternating), then the same with a guest agent that never answers
    (qemu-guest-agent masked on the kernel command line)."""
    import shutil

    from cutpoint.checkers.guestvm import DebianVM
    from cutpoint.checkers.pgdrill import BOOT_TIMEOUT, group_disks
    from cutpoint.lab.debian_image import build

    image = build("debian-pg")
    shutil.rmtree(workdir, ignore_errors=True)
    out: dict[str, Any] = {"rounds": [], "dead_agent": [],
                           "freeze_timeout_s": freeze_timeout}
    transcripts: dict[str, list[Any]] = {"live": [], "dead": []}
    for dead, n in ((False, rounds), (True, dead_rounds)):
        extra = "cp.mode=load"
        if dead:
            extra += " systemd.mask=qemu-guest-agent.service"
        wd = workdir / ("dead-agent" if dead else "live-agent")
        vm = DebianVM(image, wd, group_disks(wd), extra)
        vm.start()
        try:
            vm.wait_console(r"CPSTATE ledger-start", BOOT_TIMEOUT)
            time.sleep(3)
            for i in range(n):
                modes = ["fs-freeze"] if dead else ["crash", "fs-freeze"]
                for mode in modes:
                    rec = quiesced_snapshot(
                        vm.qmp.execute, vm.qga_path,  # type: ignore[union-attr]
                        _member_snapshot(vm, f"q{int(dead)}.{i}.{mode}"),
                        mode=mode, freeze_timeout=freeze_timeout,
                        transcripts=transcripts["dead" if dead else "live"])
                    out["dead_agent" if dead else "rounds"].append(
                        rec.as_dict())
                    time.sleep(1)
        finally:
            vm.kill()
    (workdir / "qga-transcripts.json").write_text(
        json.dumps(transcripts, indent=1))
    return out


def _table(rows: list[dict[str, Any]]) -> str:
    cols = ("mode", "consistency", "freeze_ms", "pause_ms", "snapshot_ms",
            "thaw_ms", "stall_ms", "frozen_fs")
    lines = ["  ".join(f"{c:>11}" for c in cols)]
    for r in rows:
        lines.append("  ".join(f"{r[c]!s:>11}" for c in cols))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse
    import statistics
    import sys

    ap = argparse.ArgumentParser(prog="python -m cutpoint.checkers.quiesce")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/cp-quiesce"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--freeze-timeout", type=float, default=5.0)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    res = measure(a.workdir, a.rounds, a.freeze_timeout)
    print(_table(res["rounds"] + res["dead_agent"]))
    summary = {}
    for label, rows in (
            ("crash", [r for r in res["rounds"] if r["mode"] == "crash"]),
            ("fs-freeze", [r for r in res["rounds"]
                           if r["mode"] == "fs-freeze"]),
            ("fs-freeze, dead agent", res["dead_agent"])):
        if rows:
            summary[label] = {
                k: round(statistics.median(r[k] for r in rows), 2)
                for k in ("pause_ms", "freeze_ms", "thaw_ms", "stall_ms")}
            summary[label]["levels"] = sorted({r["consistency"]
                                               for r in rows})
    res["median"] = summary
    print(json.dumps(summary, indent=1))
    if a.json:
        a.json.write_text(json.dumps(res, indent=2))
    ok = (all(r["consistency"] == r["mode"] for r in res["rounds"])
          and all(r["consistency"] == "crash" for r in res["dead_agent"]))
    print("levels as expected" if ok else "UNEXPECTED consistency levels",
          file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
