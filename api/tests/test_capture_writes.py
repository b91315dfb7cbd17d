"""How many times a group snapshot writes the database (issue 19, goal 7).

The coordinator must record each state before the next phase goes out
(DESIGN.md invariant 4).  The control plane's own rows (the snapshot's
state, start and cut, the job's progress) go into the same transactions
(TxLog.hooked), so a capture commits once per protocol state plus once for
its outcome, and only once inside the pause window: the commit decision.
An in-process agent-protocol peer over mutual TLS; real SQLite and
PostgreSQL.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import redis
from cutpoint.api import services_local
from cutpoint.api.db import get_engine
from cutpoint.api.grouplock import GroupLock
from cutpoint.api.models import GroupSnapshot, Job, SnapState
from cutpoint.api.services import capture
from peergroup import PeerGroup  # api/tests/peergroup.py
from sqlalchemy import event
from sqlalchemy.engine import Connection


def test_a_capture_commits_once_per_state_and_once_in_the_pause(
        db_url: str, local_services: services_local.Endpoints, tmp_path: Path) -> None:
    with PeerGroup(db_url, local_services.redis_url, tmp_path,
                   {"h1": {"vm1": ["disk0", "disk1"]}, "h2": {"vm2": ["disk0"]}}) as pg:
        job_id, sid = pg.request()
        r = redis.Redis.from_url(local_services.redis_url)
        lock = GroupLock(r, pg.gid, 30.0)
        assert lock.acquire()
        commits: list[float] = []
        sent: list[tuple[str, float]] = []
        mu = threading.Lock()

        # A write transaction's commit (a read-only one writes nothing to
        # the log: PostgreSQL's reads commit too, and are not counted).
        def on_execute(conn: Connection, _cur: object, stmt: str, *_: object) -> None:
            if stmt.lstrip().split(None, 1)[0].upper() in ("INSERT", "UPDATE", "DELETE"):
                conn.info["wrote"] = True

        def on_commit(conn: Connection) -> None:
            if conn.info.pop("wrote", False):
                with mu:
                    commits.append(time.monotonic())

        def on_rollback(conn: Connection) -> None:
            conn.info.pop("wrote", None)

        for p in pg.peers.values():
            p.on_request = lambda req: sent.append((str(req.get("cmd")), time.monotonic()))
        engine = get_engine(db_url)
        try:
            fsf = lock.fence(pg.sf)
            hooks = {"before_cursor_execute": on_execute, "commit": on_commit,
                     "rollback": on_rollback}
            for name, fn in hooks.items():
                event.listen(engine, name, fn)
            try:
                out = capture.run(fsf, pg.settings, sid)
            finally:
                for name, fn in hooks.items():
                    event.remove(engine, name, fn)
        finally:
            lock.release()
        assert out["state"] == "committed", out
        first_prepare = min(t for c, t in sent if c == "prepare")
        last_prepare = max(t for c, t in sent if c == "prepare")
        first_commit = min(t for c, t in sent if c == "commit")
        in_pause = [t for t in commits if first_prepare < t < first_commit]
        print(f"\ncommits: {len(commits)}, between PREPARE and COMMIT: {len(in_pause)}; "
              f"agents saw {[c for c, _ in sent]}")
        # PREPARING, COMMITTING, COMMITTED and the outcome (members, RPO).
        # Before: 9 (the snapshot's start, and each phase's progress mark,
        # committed on their own).
        assert len(commits) == 4, commits
        # Inside every VM's pause: the commit decision alone (before: also
        # the "prepared" and "committing" progress marks).
        assert len(in_pause) == 1, in_pause
        assert last_prepare < in_pause[0]
        # What the separate writes used to record is still there.
        with pg.sf() as s:
            snap = s.get(GroupSnapshot, sid)
            job = s.get(Job, job_id)
            assert snap is not None and job is not None
            assert snap.state == SnapState.committed and snap.quiesce == "crash"
            assert snap.started_at is not None and snap.cut_at is not None
            assert snap.started_at <= snap.cut_at <= snap.finished_at
            assert len(snap.members) == 3 and snap.inflight_group_id is None
            assert (job.message, job.progress) == ("committed", 0.9)
