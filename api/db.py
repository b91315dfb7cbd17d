"""Engine and session factory.

One engine per database URL per process.  SQLite gets foreign keys, WAL and a
busy timeout (the API, a worker and beat share one file in embedded mode),
and the pysqlite workaround that lets SAVEPOINT work (SQLAlchemy docs,
"Serializable isolation / Savepoints / Transactional DDL").
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

from sqlalchemy import Engine, create_engine, event, make_url
from sqlalchemy.orm import Session, sessionmaker


@lru_cache(maxsize=16)
def get_engine(url: str, immediate: bool = True) -> Engine:
    """The engine for `url`.  On SQLite, `immediate=False` gives read
    transactions (plain deferred BEGIN) that never take the write lock, for
    read-only paths: GET requests, the scheduler's assessment, metrics."""
    if url.startswith("sqlite"):
        # A threads-pool worker runs many group snapshots at once: enough
        # connections for its threads and the coordinator log's.
        memory = make_url(url).database in (None, "", ":memory:")
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False},
                               # (an in-memory database has one connection per thread)
                               **({} if memory else {"pool_size": 20, "max_overflow": 40}))
        gate = _WriteGate() if immediate else None

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _rec: Any) -> None:
            # Let SQLAlchemy, not pysqlite, decide where transactions begin.
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Any) -> None:
            # IMMEDIATE takes the write lock up front, so two writers wait on
            # busy_timeout instead of failing with "database is locked" on
            # lock upgrade.
            if gate is None:
                conn.exec_driver_sql("BEGIN")
                return
            gate.enter(conn)
            try:
                conn.exec_driver_sql("BEGIN IMMEDIATE")
            except BaseException:
                gate.leave(conn)
                raise

        if gate is not None:
            event.listen(engine, "commit", gate.leave)
            event.listen(engine, "rollback", gate.leave)
        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


class _WriteGate:
    """The writers of one process take turns here before `BEGIN IMMEDIATE`.

    SQLite has one write lock per database.  A writer that finds it taken
    waits in SQLite's busy handler, which sleeps 1, 2, 5, ... up to 100 ms
    between tries: with the many threads of a threads-pool worker that
    turned every short wait into tens of milliseconds and made convoys
    (seen: a third of a worker's samples in BEGIN IMMEDIATE).  Waiting on a
    lock of our own hands the turn over as soon as the holder commits; only
    writers of other processes (the API, beat, other workers) still meet in
    the busy handler.  A thread already holding the turn (a second session
    opened inside a first) does not wait for itself: SQLite decides, as
    before.  Released at the transaction's commit or rollback, from
    whichever thread ends it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.owner: int | None = None

    def enter(self, conn: Any) -> None:
        if self.owner == threading.get_ident():
            return
        if not self.lock.acquire(timeout=30):
            raise TimeoutError("no turn to write the database within 30 s")
        self.owner = threading.get_ident()
        conn.info["cutpoint_gate"] = True

    def leave(self, conn: Any) -> None:
        if conn.info.pop("cutpoint_gate", False):
            self.owner = None
            self.lock.release()


@lru_cache(maxsize=16)
def get_sessionmaker(url: str, readonly: bool = False) -> sessionmaker[Session]:
    """Sessions for `url`.  `readonly=True`: for paths that only read (on
    SQLite they do not serialise behind writers; elsewhere it is the same)."""
    if readonly and url.startswith("sqlite"):
        return sessionmaker(bind=get_engine(url, immediate=False), expire_on_commit=False)
    return sessionmaker(bind=get_engine(url), expire_on_commit=False)


@contextmanager
def session_scope(url: str) -> Iterator[Session]:
    """A session for code outside a request (tasks, CLI).  The caller commits."""
    session = get_sessionmaker(url)()
    try:
        yield session
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
