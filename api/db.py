"""Engine and session factory.

One engine per database URL per process.  SQLite gets foreign keys, WAL and a
busy timeout (the API, a worker and beat share one file in embedded mode),
and the pysqlite workaround that lets SAVEPOINT work (SQLAlchemy docs,
"Serializable isolation / Savepoints / Transactional DDL").
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker


@lru_cache(maxsize=16)
def get_engine(url: str, immediate: bool = True) -> Engine:
    """The engine for `url`.  On SQLite, `immediate=False` gives read
    transactions (plain deferred BEGIN) that never take the write lock, for
    read-only paths: GET requests, the scheduler's assessment, metrics."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

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
            conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


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
