"""`cutpoint-sync --serve` driven from the test bed: one session connected to
the lab's two sites as the admin client, one copy per `copy()` call
(docs/replication.md, "Serve mode").  The sync lab tests and the
replication benchmark use it; the control plane has its own
(coordinator/dr/replicate.py)."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Sequence
from typing import Any, Self

from cutpoint.bench.replication import SYNC_STATE_DIR, ReplicationError, SyncRun
from cutpoint.coordinator.dr.replicate import end_session, site_args, sync_binary


def serve_argv(status: dict[str, Any], extra: Sequence[str] = (),
               state_dir: str = SYNC_STATE_DIR) -> list[str]:
    """argv of a serve session primary -> DR as the lab's admin client."""
    from cutpoint.lab.sites import ceph_site

    src, dst = ceph_site(status, "primary", "admin"), ceph_site(status, "dr", "admin")
    return [sync_binary(), *site_args("src", src, "rbd", state_dir),
            *site_args("dst", dst, "rbd", state_dir), "--serve", "--state-dir", state_dir,
            *extra]


class SyncSession:
    """One `cutpoint-sync --serve` process; `copy()` sends one request and
    returns its events once its `done` or `error` event has come."""

    def __init__(self, status: dict[str, Any], extra: Sequence[str] = (),
                 state_dir: str = SYNC_STATE_DIR, timeout: float = 60) -> None:
        self.argv = serve_argv(status, extra, state_dir)
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, bufsize=1)
        self.stderr: list[str] = []
        threading.Thread(target=self._drain, daemon=True).start()
        self.n = 0
        self.ready = self._next(time.monotonic() + timeout)
        if self.ready.get("event") != "ready":
            self.close()
            raise ReplicationError(self.argv, self.proc.returncode or -1,
                                   json.dumps(self.ready), "".join(self.stderr[-5:]))

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)

    def _next(self, deadline: float) -> dict[str, Any]:
        """The next event; the session is killed if none comes by the deadline."""
        assert self.proc.stdout is not None
        timer = threading.Timer(max(0.0, deadline - time.monotonic()), self.proc.kill)
        timer.start()
        try:
            line = self.proc.stdout.readline()
        finally:
            timer.cancel()
        if not line:
            rc = self.proc.wait()
            raise ReplicationError(self.argv, rc, "", "session ended (killed at the deadline "
                                   "if rc -9): " + "".join(self.stderr[-5:]))
        ev = json.loads(line)
        if not isinstance(ev, dict):
            raise ReplicationError(self.argv, 0, line, "not a JSON object")
        return ev

    def send(self, request: dict[str, Any] | str) -> None:
        assert self.proc.stdin is not None
        line = request if isinstance(request, str) else json.dumps(request)
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def copy(self, image: str, snap: str, base: str | None = None, check: bool = True,
             timeout: float = 900, **fields: Any) -> SyncRun:
        """Copy image@snap (from base) through the session; fields are
        other request keys (dst_pool, rate_mbps, ...).  Timed from the
        request to its last event."""
        self.n += 1
        rid = f"r{self.n}"
        req = {"id": rid, "image": image, "snap": snap, "base": base, **fields}
        t0 = time.monotonic()
        self.send(req)
        events: list[dict[str, Any]] = []
        while True:
            ev = self._next(t0 + timeout)
            if ev.get("id") not in (rid, None):
                continue
            events.append(ev)
            if ev.get("event") in ("done", "error"):
                break
        run = SyncRun(self.argv + [json.dumps(req)], int(events[-1].get("exit", 0)), events,
                      "", time.monotonic() - t0)
        if check and events[-1].get("event") == "error":
            raise ReplicationError(run.argv, run.returncode, json.dumps(events[-1]),
                                   "".join(self.stderr[-5:]))
        return run

    def close(self, timeout: float = 30) -> int:
        """EOF: the session ends; returns its exit code."""
        return end_session(self.proc, timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
