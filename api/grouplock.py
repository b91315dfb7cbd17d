"""The group lock: one worker at a time works on a group, and only it writes.

A Redis key per group and kind ("group": snapshots, retention, failover;
"replicate": one replication of the group at a time) with a TTL, refreshed
by a heartbeat thread, so that a killed worker frees the group within the
TTL.  A TTL lock alone does not keep two writers apart: a holder that is
paused, or cut off from Redis, keeps working after its key expired and a
second worker took the group.  So the lock also hands out a *fencing token*
and the database checks it (Kleppmann, "How to do distributed locking"):

    acquire   SET key NX PX ttl and INCR the group's token counter, in one
              script: every holder's token is larger than all earlier ones.
    fence(sf) records the token in `lock_fences` and returns a session
              factory whose every commit first runs
                  UPDATE lock_fences SET token = ours
                  WHERE kind, group_id AND token <= ours
              inside the same transaction; no row updated means a newer
              holder has written, and the commit is refused (LockLost).
    heartbeat refreshes the key every ttl/3 while it still holds our value.
              An error is retried every RETRY_S; the lease is counted from
              the last refresh that succeeded (from when it was sent, so
              it ends no later than the key), and once it has run out, or
              the key holds another value, the lock is lost: `lost` is set
              and every further commit through `fence(sf)` is refused.

The holder therefore stops writing by itself when it knows, and the
database refuses it when it does not know yet.  The coordinator's log takes
the same check (`TxLog.guarded`), so a stale holder cannot begin or move a
transaction either.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable

import redis
from cutpoint.api.models import LockFence, utcnow
from sqlalchemy import event, insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

log = logging.getLogger("cutpoint.grouplock")

# How often a failed refresh is tried again (at most; ttl/6 when shorter).
RETRY_S = 1.0
# session.info key: the locks whose tokens every commit of the session checks.
FENCES = "cutpoint_fences"

# KEYS: lock, token counter.  ARGV: our value, ttl ms.  -> token or 0.
_ACQUIRE = """
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('incr', KEYS[2])
end
return 0
"""
# KEYS: lock.  ARGV: our value, ttl ms.  -> 1 refreshed, 0 not ours.
_EXTEND = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"""
# KEYS: lock.  ARGV: our value.  -> 1 deleted, 0 not ours.
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0
"""
# The database knows a larger token than Redis handed out: Redis lost its
# counter (restarted without persistence).  While we still hold the lock,
# move the counter past the database's.  KEYS: lock, counter.  ARGV: our
# value, the smallest acceptable token.  -> the new token, or 0.
_BUMP = """
if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end
local cur = tonumber(redis.call('get', KEYS[2]) or '0')
if cur < tonumber(ARGV[2]) then
  redis.call('set', KEYS[2], ARGV[2])
  return tonumber(ARGV[2])
end
return redis.call('incr', KEYS[2])
"""


class LockLost(RuntimeError):
    """The holder may no longer work on the group: its lease ran out, or a
    newer holder's token reached the database first."""

    def __init__(self, key: str, why: str) -> None:
        self.key = key
        super().__init__(f"group lock {key} lost: {why}")


def retry_wait_s(retries: int, ttl_s: float) -> float:
    """Seconds before a job that found its group's lock held looks again:
    0.5 s, doubled at each look, at most a third of the lock's TTL.  The
    holder usually lets go within a second (`cutpoint-lab bench dr-rpo`,
    10 VMs: a replication holds the replicate lock 0.46 s p50); a fixed
    third of the TTL (10 s by default) once put 10 s into one point's lag
    at DR in that bench (2026-11-28), and so into the DR RPO.  The doubling
    keeps a long holder from being polled twice a second."""
    return min(max(1.0, ttl_s / 3), 0.5 * 2 ** min(retries, 16))


class GroupLock:
    """Redis lock per group with a fencing token; see the module docstring."""

    def __init__(self, r: redis.Redis, group_id: int, ttl_s: float,
                 kind: str = "group") -> None:
        self.r = r
        self.kind, self.group_id = kind, group_id
        self.key = f"cutpoint:lock:{kind}:{group_id}"
        self.counter = f"cutpoint:fence:{kind}:{group_id}"
        self.ttl = ttl_s
        self.token: int | None = None
        self.lost = threading.Event()
        self._why = ""
        self._value = uuid.uuid4().hex
        self._valid_until = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- Redis side ----------------------------------------------------------
    def acquire(self) -> bool:
        t = time.monotonic()
        token = int(self.r.eval(_ACQUIRE, 2, self.key, self.counter, self._value,
                                int(self.ttl * 1000)))  # type: ignore[arg-type]
        if not token:
            return False
        self.token = token
        self._valid_until = t + self._lease_s()
        self._thread = threading.Thread(target=self._beat, name=f"beat {self.key}",
                                        daemon=True)
        self._thread.start()
        return True

    def _lease_s(self) -> float:
        # A little short of the TTL: the key lives ttl from when Redis ran
        # the refresh, which is after we sent it.
        return self.ttl * 0.9

    def held(self) -> bool:
        """True while the lease is certainly ours (no other holder can exist)."""
        if self.lost.is_set():
            return False
        if time.monotonic() >= self._valid_until:
            self._lose(f"the heartbeat could not refresh it within its TTL ({self.ttl:g} s)")
            return False
        return True

    def _lose(self, why: str) -> None:
        if not self.lost.is_set():
            self._why = why
            self.lost.set()
            log.error("lock=%s token=%s event=lock_lost why=%r", self.key, self.token, why)

    def _beat(self) -> None:
        retry = min(RETRY_S, self.ttl / 6)
        wait = self.ttl / 3
        while not self._stop.wait(max(0.0, min(wait, self._valid_until - time.monotonic()))):
            if not self.held():
                return
            t = time.monotonic()
            try:
                ours = self.r.eval(_EXTEND, 1, self.key, self._value,
                                   int(self.ttl * 1000))  # type: ignore[arg-type]
            except redis.RedisError as exc:
                log.warning("lock=%s event=heartbeat_failed error=%r lease_left_s=%.1f",
                            self.key, exc, self._valid_until - time.monotonic())
                wait = retry
                continue
            if not ours:
                self._lose("its key expired or was removed, and may be another worker's now")
                return
            self._valid_until = t + self._lease_s()
            wait = self.ttl / 3

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(2)
        try:
            if not self.r.eval(_RELEASE, 1, self.key, self._value):  # type: ignore[arg-type]
                log.warning("lock=%s event=release_not_held (expired or another's)", self.key)
        except redis.RedisError as exc:  # it expires with its TTL
            log.warning("lock=%s event=release_failed error=%r", self.key, exc)

    # -- database side -------------------------------------------------------
    def fence(self, sf: sessionmaker[Session]) -> sessionmaker[Session]:
        """Record our token now, and return a session factory whose every
        commit checks it (in the same transaction) before writing."""
        with sf() as s:
            self._claim(s)
            s.commit()
        info = dict(sf.kw.get("info") or {})
        info[FENCES] = (*info.get(FENCES, ()), self)
        return sessionmaker(class_=sf.class_, **{**sf.kw, "info": info})

    def _claim(self, s: Session) -> None:
        if not self.held():
            raise LockLost(self.key, self._why)
        t = LockFence.__table__
        where = (t.c.kind == self.kind, t.c.group_id == self.group_id)
        cur = s.execute(select(t.c.token).where(*where).with_for_update()).scalar()
        if cur is None:
            try:
                with s.begin_nested():
                    s.execute(insert(t).values(kind=self.kind, group_id=self.group_id,
                                               token=self.token, claimed_at=utcnow()))
                return
            except IntegrityError:  # another holder claimed first: compare with it
                cur = s.execute(select(t.c.token).where(*where)).scalar()
        assert self.token is not None
        if cur is not None and cur > self.token:
            bumped = int(self.r.eval(_BUMP, 2, self.key, self.counter, self._value,
                                     int(cur) + 1))  # type: ignore[arg-type]
            if not bumped:
                self._lose("its key expired before the token was recorded")
                raise LockLost(self.key, self._why)
            log.warning("lock=%s event=token_counter_behind redis=%s database=%s new=%s",
                        self.key, self.token, cur, bumped)
            self.token = bumped
        s.execute(update(t).where(*where).values(token=self.token, claimed_at=utcnow()))

    def check(self, conn: Connection) -> None:
        """Refuse the write of `conn`'s transaction unless we still hold the group."""
        if not self.held():
            raise LockLost(self.key, self._why)
        t = LockFence.__table__
        n = conn.execute(update(t).where(t.c.kind == self.kind, t.c.group_id == self.group_id,
                                         t.c.token <= self.token)
                         .values(token=self.token)).rowcount
        if n != 1:
            newer = conn.execute(select(t.c.token).where(
                t.c.kind == self.kind, t.c.group_id == self.group_id)).scalar()
            self._lose(f"a newer holder wrote with fencing token {newer} (ours {self.token})")
            raise LockLost(self.key, self._why)


def fences_of(sf: sessionmaker[Session]) -> tuple[GroupLock, ...]:
    return tuple(sf.kw.get("info", {}).get(FENCES, ()))


def guard_of(sf: sessionmaker[Session]) -> Callable[[Connection], None] | None:
    """A check for writes made outside `sf`'s sessions (the coordinator's log)."""
    locks = fences_of(sf)
    if not locks:
        return None

    def guard(conn: Connection) -> None:
        for lock in locks:
            lock.check(conn)
    return guard


@event.listens_for(Session, "before_commit")
def _check_fences(session: Session) -> None:
    locks = session.info.get(FENCES)
    if locks:
        conn = session.connection()
        for lock in locks:
            lock.check(conn)


def group_locked(r: redis.Redis, group_id: int) -> bool:
    return bool(r.exists(f"cutpoint:lock:group:{group_id}"))

