"""One runner per job, whatever the broker redelivers.

With Redis as the broker, a message whose task has not been acknowledged
within `broker_visibility_timeout_s` is handed out again, though the first
worker is still running it: a replication or a failover easily takes
longer than that.  So the worker that runs a job holds a claim on it in
Redis (`cutpoint:job:<id>:runner`, SET NX with a TTL of `job_claim_ttl_s`,
renewed every third of it on a thread).  A delivery that finds the claim
held does not run the job: it checks again later (a Celery retry) until
the job has finished (then it has nothing to do) or the claim has expired
because its holder died (then it runs the job, as any redelivery would).
"""

from __future__ import annotations

import logging
import os
import socket
import threading

import redis
from redis.exceptions import LockError, LockNotOwnedError

log = logging.getLogger("cutpoint.jobclaim")


def key(job_id: str) -> str:
    return f"cutpoint:job:{job_id}:runner"


class JobClaim:
    """Held while this process runs the job; `release()` when it is done."""

    def __init__(self, r: redis.Redis, job_id: str, ttl_s: float, attempt: int) -> None:
        self.job_id, self.ttl_s = job_id, ttl_s
        self.me = f"{socket.gethostname()}:{os.getpid()}:attempt-{attempt}"
        self._lock = r.lock(key(job_id), timeout=ttl_s, thread_local=False)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> bool:
        if not self._lock.acquire(blocking=False, token=self.me):
            return False
        self._thread = threading.Thread(target=self._renew, name=f"claim {self.job_id}",
                                        daemon=True)
        self._thread.start()
        return True

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                self._lock.reacquire()
            except LockNotOwnedError:
                # Expired (Redis was away longer than the TTL) and maybe taken:
                # another delivery may run the job now; the job's attempt
                # counter decides whose result stands (tasks._finish).
                log.error("job=%s event=claim_lost holder=%s", self.job_id, self.me)
                return
            except (redis.RedisError, LockError) as exc:
                log.warning("job=%s event=claim_renew_failed error=%r", self.job_id, exc)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        try:
            self._lock.release()
        except (redis.RedisError, LockError):
            pass  # expired already; nothing to free


def holder(r: redis.Redis, job_id: str) -> str | None:
    v = r.get(key(job_id))
    return v.decode(errors="replace") if v else None
