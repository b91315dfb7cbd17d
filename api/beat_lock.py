"""One beat per deployment: the beat process ticks only while it holds a
lock in Redis.

A second beat (started by mistake, or kept as a standby on another control
host) waits at start and says who holds the lock; when the holder dies,
its lock expires after `beat_lock_ttl_s` and the standby takes over.  Two
beats ticking at once would queue every scheduled snapshot twice.  The
holder renews the lock every third of the TTL; a holder that cannot renew
it within the TTL (Redis gone, or the lock taken meanwhile) exits at once,
before a standby may start ticking, and its supervisor restarts it as a
standby.

The lock is taken in Celery's `beat_init` signal, which beat sends before
its first tick, and released when the process exits cleanly.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

import redis
from celery.signals import beat_init
from redis.exceptions import LockError, LockNotOwnedError

KEY = "cutpoint:lock:beat"
EXIT_LOST = 3  # the beat's exit status when it lost the lock
log = logging.getLogger("cutpoint.beat")


def _renew(lock: Any, ttl_s: float) -> None:
    """Renew every ttl/3; exit the process if the lock cannot be kept."""
    last_ok = time.monotonic()
    while True:
        time.sleep(ttl_s / 3)
        try:
            lock.reacquire()
            last_ok = time.monotonic()
        except LockNotOwnedError:
            log.critical("event=beat_lock_lost why=taken_over key=%s: exiting", KEY)
            os._exit(EXIT_LOST)
        except (redis.RedisError, LockError) as exc:
            if time.monotonic() - last_ok >= ttl_s * 2 / 3:
                log.critical("event=beat_lock_lost why=unrenewable key=%s error=%r: exiting",
                             KEY, exc)
                os._exit(EXIT_LOST)
            log.warning("event=beat_lock_renew_failed error=%r", exc)


def _release(lock: Any, me: str) -> None:
    """On a clean stop (SIGTERM, Ctrl-C), free the lock at once: a standby
    or a restarted beat need not wait out the TTL."""
    try:
        lock.release()
        log.warning("event=beat_lock_released holder=%s", me)
    except (redis.RedisError, LockError):
        pass  # lost or expired already; the TTL frees it


def hold(redis_url: str, ttl_s: float) -> str:
    """Block until this process holds the beat lock, then keep it renewed
    on a daemon thread.  Returns the holder id (host:pid:nonce)."""
    r = redis.Redis.from_url(redis_url, socket_timeout=5)
    me = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    lock = r.lock(KEY, timeout=ttl_s, thread_local=False)
    said = None
    while not lock.acquire(blocking=False, token=me):
        holder = r.get(KEY)
        holder_s = holder.decode(errors="replace") if holder else "?"
        if holder_s != said:
            log.warning("event=beat_lock_waiting holder=%s ttl_s=%.0f: another beat is "
                        "ticking; this one stands by", holder_s, ttl_s)
            said = holder_s
        time.sleep(min(1.0, ttl_s / 3))
    log.warning("event=beat_lock_acquired holder=%s ttl_s=%.0f", me, ttl_s)
    atexit.register(_release, lock, me)
    threading.Thread(target=_renew, args=(lock, ttl_s), name="beat-lock",
                     daemon=True).start()
    return me


@beat_init.connect
def _hold_at_beat_start(sender: Any = None, **_: Any) -> None:
    from cutpoint.api.config import get_settings

    st = get_settings()
    hold(st.redis_url, st.beat_lock_ttl_s)
