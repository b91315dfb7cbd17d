"""One beat per deployment (api/beat_lock.py), with real Redis and real
`cutpoint server beat` processes: a beat that finds the lock held stands by
and queues nothing; it starts ticking once the lock is free; when the
ticking beat is killed with -9, a standby takes over within the lock's TTL;
and a beat stopped cleanly frees the lock at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis
from cutpoint.api import beat_lock

EXE = str(Path(sys.executable).with_name("cutpoint"))
TTL = 3
TICKS = "cutpoint.scheduler"  # the queue the scheduler tick goes to every second


def _beat(env: dict[str, str], tmp: Path, name: str) -> tuple[subprocess.Popen[bytes], Path]:
    log = tmp / f"{name}.log"
    with open(log, "wb") as f:
        p = subprocess.Popen([EXE, "server", "beat", "--schedule", str(tmp / f"{name}.db")],
                             env=env, stdout=f, stderr=subprocess.STDOUT,
                             start_new_session=True)
    return p, log


def _wait_for(log: Path, text: str, timeout: float, p: subprocess.Popen[bytes]) -> float:
    t0 = time.monotonic()
    while text not in log.read_text(errors="replace"):
        assert p.poll() is None, log.read_text(errors="replace")
        assert time.monotonic() - t0 < timeout, f"no {text!r} in {timeout} s:\n{log.read_text()}"
        time.sleep(0.2)
    return time.monotonic() - t0


def test_one_beat_ticks_and_a_standby_takes_over(local_services: Any, tmp_path: Path) -> None:
    url = local_services.redis_url.rsplit("/", 1)[0] + "/7"  # a database of its own
    r = redis.Redis.from_url(url)
    r.flushdb()
    env = dict(os.environ, CUTPOINT_REDIS_URL=url, CUTPOINT_BEAT_LOCK_TTL_S=str(TTL),
               CUTPOINT_DATABASE_URL=f"sqlite:///{tmp_path}/db.sqlite",
               CUTPOINT_TOKEN_SECRET="beat-test-secret-0123456789")
    env.pop("CUTPOINT_CONFIG", None)
    procs = []
    try:
        # Someone else holds the lock: the beat stands by and queues nothing.
        other = r.lock(beat_lock.KEY, timeout=60, thread_local=False)
        assert other.acquire(blocking=False, token="elsewhere:1:test")
        a, alog = _beat(env, tmp_path, "a")
        procs.append(a)
        _wait_for(alog, "event=beat_lock_waiting holder=elsewhere:1:test", 60, a)
        time.sleep(4)
        assert r.llen(TICKS) == 0, "a standby beat queued ticks"
        other.release()
        took = _wait_for(alog, "event=beat_lock_acquired", 30, a)
        print(f"standby a took the free lock after {took:.1f} s")
        deadline = time.monotonic() + 30
        while r.llen(TICKS) == 0:
            assert time.monotonic() < deadline, "the holding beat queued no tick"
            time.sleep(0.2)

        # A second beat stands by behind a; kill -9 a; b takes over within the TTL.
        b, blog = _beat(env, tmp_path, "b")
        procs.append(b)
        _wait_for(blog, "event=beat_lock_waiting", 60, b)
        assert "event=beat_lock_acquired" not in blog.read_text()
        os.killpg(a.pid, signal.SIGKILL)
        a.wait()
        t_kill = time.monotonic()
        _wait_for(blog, "event=beat_lock_acquired", TTL + 30, b)
        took = time.monotonic() - t_kill
        print(f"beat b took over {took:.1f} s after kill -9 of a (lock TTL {TTL} s)")
        assert took < TTL + 5, took

        # A clean stop frees the lock at once, without waiting out the TTL.
        os.killpg(b.pid, signal.SIGTERM)
        assert b.wait(timeout=30) == 0, blog.read_text()
        assert "event=beat_lock_released" in blog.read_text(), blog.read_text()
        assert r.get(beat_lock.KEY) is None
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
        r.flushdb()
