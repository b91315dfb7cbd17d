"""The coordinator's transaction log (DESIGN.md invariant 4).

Each group snapshot is one row in `coord_txn`, moved through the states of
the protocol; the state is committed to the database *before* the next phase
is sent to any agent.  `coord_txn_event` keeps the history of transitions,
`coord_txn_vm` the per-VM timings and `coord_txn_snapshot` the member
snapshots and what became of them.

The tables live in their own `MetaData` (`METADATA`) so the control plane
can include them in its Alembic environment (`target_metadata = [api
metadata, cutpoint.coordinator.txlog.METADATA]`) while the coordinator
also works stand-alone on SQLite (`TxLog.create_schema`).

States (docs/design.md §4):

    PREPARING ──all PREPARED──▶ COMMITTING ──all COMMITTED──▶ COMMITTED
        │                           │
        └──────any failure──────────┴──▶ ABORTING ──cleanup done──▶ ABORTED
"""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import (
    JSON,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    insert,
    select,
    update,
)
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

PREPARING = "preparing"
COMMITTING = "committing"
COMMITTED = "committed"
ABORTING = "aborting"
ABORTED = "aborted"
FINAL = frozenset({COMMITTED, ABORTED})
IN_DOUBT = frozenset({PREPARING, COMMITTING, ABORTING})
# Allowed transitions; anything else is a bug and is refused.
TRANSITIONS = {
    PREPARING: {COMMITTING, ABORTING},
    COMMITTING: {COMMITTED, ABORTING},
    ABORTING: {ABORTED, ABORTING},
    COMMITTED: set(),
    ABORTED: set(),
}

METADATA = MetaData(naming_convention={
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
})

coord_txn = Table(
    "coord_txn", METADATA,
    Column("txn", String(128), primary_key=True),
    Column("group_name", String(128), nullable=False, index=True),
    Column("state", String(16), nullable=False, index=True),
    Column("reason", Text, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Column("lease_ms", Integer, nullable=False),
    Column("budget_ms", Integer, nullable=False),
    Column("spec", JSON, nullable=False),
    Column("timings", JSON, nullable=True),
    Column("errors", JSON, nullable=True),
)

coord_txn_event = Table(
    "coord_txn_event", METADATA,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("txn", String(128), ForeignKey("coord_txn.txn", ondelete="CASCADE"),
           nullable=False, index=True),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("state", String(16), nullable=False),
    Column("detail", JSON, nullable=True),
)

coord_txn_vm = Table(
    "coord_txn_vm", METADATA,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("txn", String(128), ForeignKey("coord_txn.txn", ondelete="CASCADE"),
           nullable=False, index=True),
    Column("vm", String(128), nullable=False),
    Column("agent", String(255), nullable=False),
    Column("stop_ms", Float, nullable=True),
    Column("barrier_ms", Float, nullable=True),
    Column("snapshot_ms", Float, nullable=True),
    Column("cont_ms", Float, nullable=True),
    Column("paused_ms", Float, nullable=True),
    Column("method", String(32), nullable=True),
    # quiesce (agent-protocol §4.3): the level reached and why it fell back
    Column("consistency", String(16), nullable=True),
    Column("freeze_ms", Float, nullable=True),
    Column("thaw_ms", Float, nullable=True),
    Column("freeze_error", Text, nullable=True),
    Column("thaw_error", Text, nullable=True),
    # how the agent cut the VM: "live", "redirect" or "in_pause" (agent-protocol §5.1)
    Column("pause_path", String(16), nullable=True),
    # why a VM that can take the redirect cut was cut in the pause (or, on
    # agents set to live, why it was stopped for its switch)
    Column("pause_path_why", Text, nullable=True),
    UniqueConstraint("txn", "vm", name="uq_coord_txn_vm_txn_vm"),
)

coord_txn_snapshot = Table(
    "coord_txn_snapshot", METADATA,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("txn", String(128), ForeignKey("coord_txn.txn", ondelete="CASCADE"),
           nullable=False, index=True),
    Column("disk", String(255), nullable=False),   # <vm>/<node>
    Column("vm", String(128), nullable=False),
    Column("agent", String(255), nullable=False),
    Column("name", String(128), nullable=False),
    # planned → created → (deleted) ; planned → failed ; planned → deleted
    Column("state", String(16), nullable=False),
    Column("snapshot_ms", Float, nullable=True),
    UniqueConstraint("txn", "disk", name="uq_coord_txn_snapshot_txn_disk"),
)


VM_COLUMNS = ("agent", "stop_ms", "barrier_ms", "snapshot_ms", "cont_ms", "paused_ms",
              "method", "consistency", "freeze_ms", "thaw_ms", "freeze_error", "thaw_error",
              "pause_path", "pause_path_why")
# Columns added after the first release of a table.  A stand-alone log
# (`cutpoint snapshot --db sqlite:///...`, create=True) made by an older
# version gets them on open; the control plane's database gets them from
# Alembic (api/alembic/versions/0004, 0005, 0015, 0017).
ADDED_COLUMNS = {"coord_txn_vm": ("consistency", "freeze_ms", "thaw_ms", "freeze_error",
                                  "thaw_error", "pause_path", "pause_path_why")}


def _add_columns(c: Connection) -> None:
    from sqlalchemy import inspect, text

    insp = inspect(c)
    for table, names in ADDED_COLUMNS.items():
        have = {col["name"] for col in insp.get_columns(table)}
        for name in names:
            if name not in have:
                col = METADATA.tables[table].c[name]
                # All added columns are nullable, so a bare ADD COLUMN is
                # valid on SQLite and PostgreSQL alike.
                c.execute(text(f"ALTER TABLE {table} ADD COLUMN {name} "
                               f"{col.type.compile(dialect=c.dialect)}"))


class TxLogError(RuntimeError):
    """The transaction log could not be read or written.

    `operation` says what was attempted, `url` where (password hidden).
    """

    def __init__(self, operation: str, url: str, cause: BaseException) -> None:
        self.operation = operation
        self.url = url
        self.cause = cause
        first = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        super().__init__(f"transaction log {url} unavailable during {operation}: {first}")


class TxnExists(TxLogError):
    pass


class TxLogRefused(TxLogError):
    """The log's guard refused a write (e.g. the writer's group lock is
    another worker's now); `cause` says why.  Nothing was written."""

    def __init__(self, operation: str, url: str, cause: BaseException) -> None:
        super().__init__(operation, url, cause)
        self.args = (f"transaction log {url} refused {operation}: {cause}",)

    def __str__(self) -> str:
        return str(self.args[0])


class BadTransition(RuntimeError):
    pass


@dataclass
class TxnRecord:
    txn: str
    group: str
    state: str
    reason: str | None
    created_at: dt.datetime
    updated_at: dt.datetime
    lease_ms: int
    budget_ms: int
    spec: dict[str, Any]
    timings: dict[str, Any] | None
    errors: list[dict[str, Any]]
    vms: list[dict[str, Any]] = field(default_factory=list)
    snapshots: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def states(self) -> list[str]:
        """The history of states, oldest first."""
        return [e["state"] for e in self.events]


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _aware(t: dt.datetime) -> dt.datetime:
    # SQLite hands back naive datetimes; everything stored here is UTC.
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


class TxLog:
    """Durable state of group snapshot transactions, over SQLAlchemy 2.

    `url`: any SQLAlchemy URL; SQLite (default) and PostgreSQL are tested.
    """

    def __init__(self, url_or_engine: str | Engine, *, create: bool = True,
                 read_engine: Engine | None = None) -> None:
        """`read_engine`: where reads go, when not `engine` (the control
        plane gives SQLite reads a plain BEGIN, so that they do not take the
        write lock behind every other writer)."""
        if isinstance(url_or_engine, Engine):
            self.engine = url_or_engine
        else:
            kwargs: dict[str, Any] = {"pool_pre_ping": True}
            if url_or_engine.startswith("postgresql"):
                # Fail fast when the database is down: nothing may be paused
                # while we wait for a dead server.
                kwargs["connect_args"] = {"connect_timeout": 5}
            self.engine = create_engine(url_or_engine, **kwargs)
        self.read_engine = read_engine or self.engine
        self.url = self.engine.url.render_as_string(hide_password=True)
        self.guard: Callable[[Connection], None] | None = None
        self.on_write: Callable[[Connection, str, str], None] | None = None
        if self.engine.dialect.name == "sqlite":
            event.listen(self.engine, "connect", _sqlite_pragmas)
        if create:
            self.create_schema()

    def create_schema(self) -> None:
        with self._tx("create schema") as c:
            METADATA.create_all(c)
            _add_columns(c)

    def dispose(self) -> None:
        self.engine.dispose()

    def guarded(self, guard: Callable[[Connection], None]) -> TxLog:
        """This log (same engine) with `guard(conn)` run first inside every
        write's transaction; whatever it raises refuses the write
        (TxLogRefused).  The control plane passes its group lock's fencing
        check, so a worker that lost the group cannot move its txns."""
        other = copy.copy(self)
        other.guard = guard
        return other

    def hooked(self, on_write: Callable[[Connection, str, str], None]) -> TxLog:
        """This log (same engine, same guard) with `on_write(conn, txn,
        state)` run inside every state write's transaction, after the log's
        own rows: the caller's rows about the txn (the control plane's
        snapshot and job) then commit with the state, in one transaction
        and one fsync, instead of one more commit per phase.  Whatever it
        raises fails the write (TxLogError)."""
        other = copy.copy(self)
        other.on_write = on_write
        return other

    @contextmanager
    def _tx(self, operation: str, *, write: bool = False) -> Iterator[Connection]:
        try:
            with (self.engine if write else self.read_engine).begin() as conn:
                if write and self.guard is not None:
                    try:
                        self.guard(conn)
                    except SQLAlchemyError:
                        raise
                    except Exception as exc:
                        raise TxLogRefused(operation, self.url, exc) from exc
                yield conn
        except IntegrityError as exc:
            raise TxnExists(operation, self.url, exc) from exc
        except SQLAlchemyError as exc:
            raise TxLogError(operation, self.url, exc) from exc

    # -- writes -------------------------------------------------------------
    def begin(self, txn: str, group: str, spec: dict[str, Any],
              snapshots: Iterable[dict[str, str]], *, lease_ms: int,
              budget_ms: int, detail: dict[str, Any] | None = None) -> None:
        """Insert the txn in state PREPARING with its planned member snapshots.

        snapshots: dicts with disk, vm, agent, name.
        """
        now = utcnow()
        with self._tx(f"begin {txn}", write=True) as c:
            c.execute(insert(coord_txn).values(
                txn=txn, group_name=group, state=PREPARING, reason=None,
                created_at=now, updated_at=now, lease_ms=lease_ms,
                budget_ms=budget_ms, spec=spec, timings=None, errors=[]))
            rows = [dict(s, txn=txn, state="planned") for s in snapshots]
            if rows:
                c.execute(insert(coord_txn_snapshot), rows)
            c.execute(insert(coord_txn_event).values(
                txn=txn, at=now, state=PREPARING, detail=detail))
            self._hook(c, txn, PREPARING)

    def transition(self, txn: str, state: str, *, reason: str | None = None,
                   detail: dict[str, Any] | None = None,
                   timings: dict[str, Any] | None = None,
                   errors: list[dict[str, Any]] | None = None,
                   vms: list[dict[str, Any]] | None = None,
                   snapshots: dict[str, dict[str, Any]] | None = None) -> None:
        """Move `txn` to `state` (checked against TRANSITIONS), atomically with
        the facts learned in the phase that just ended."""
        now = utcnow()
        with self._tx(f"{state} {txn}", write=True) as c:
            cur = c.execute(select(coord_txn.c.state).where(coord_txn.c.txn == txn)
                            .with_for_update()).scalar_one_or_none()
            if cur is None:
                raise BadTransition(f"txn {txn} is not in the log")
            if state not in TRANSITIONS[cur]:
                raise BadTransition(f"txn {txn}: {cur} -> {state} is not allowed")
            values: dict[str, Any] = {"state": state, "updated_at": now}
            if reason is not None:
                values["reason"] = reason
            if timings is not None:
                values["timings"] = timings
            if errors is not None:
                values["errors"] = errors
            c.execute(update(coord_txn).where(coord_txn.c.txn == txn).values(**values))
            for v in vms or []:
                self._upsert_vm(c, txn, v)
            for disk, vals in (snapshots or {}).items():
                c.execute(update(coord_txn_snapshot)
                          .where(coord_txn_snapshot.c.txn == txn,
                                 coord_txn_snapshot.c.disk == disk)
                          .values(**vals))
            c.execute(insert(coord_txn_event).values(txn=txn, at=now, state=state,
                                                     detail=detail))
            self._hook(c, txn, state)

    def _hook(self, c: Connection, txn: str, state: str) -> None:
        if self.on_write is None:
            return
        try:
            self.on_write(c, txn, state)
        except SQLAlchemyError:
            raise
        except Exception as exc:
            raise TxLogError(f"{state} {txn} (hook)", self.url, exc) from exc

    @staticmethod
    def _upsert_vm(c: Connection, txn: str, v: dict[str, Any]) -> None:
        cols = {k: v.get(k) for k in VM_COLUMNS}
        found = c.execute(select(coord_txn_vm.c.id).where(
            coord_txn_vm.c.txn == txn, coord_txn_vm.c.vm == v["vm"])).scalar_one_or_none()
        if found is None:
            c.execute(insert(coord_txn_vm).values(txn=txn, vm=v["vm"], **cols))
        else:
            c.execute(update(coord_txn_vm).where(coord_txn_vm.c.id == found)
                      .values(**{k: x for k, x in cols.items() if x is not None}))

    # -- reads --------------------------------------------------------------
    def get(self, txn: str) -> TxnRecord | None:
        with self._tx(f"read {txn}") as c:
            row = c.execute(select(coord_txn).where(coord_txn.c.txn == txn)).mappings().first()
            if row is None:
                return None
            return self._record(c, row)

    def find(self, *, group: str | None = None, states: Iterable[str] | None = None,
             limit: int | None = None) -> list[TxnRecord]:
        """Transactions, newest first."""
        q = select(coord_txn).order_by(coord_txn.c.created_at.desc())
        if group is not None:
            q = q.where(coord_txn.c.group_name == group)
        if states is not None:
            q = q.where(coord_txn.c.state.in_(list(states)))
        if limit is not None:
            q = q.limit(limit)
        with self._tx("list transactions") as c:
            return [self._record(c, r) for r in c.execute(q).mappings().all()]

    def in_doubt(self, group: str | None = None) -> list[TxnRecord]:
        return self.find(group=group, states=IN_DOUBT)

    @staticmethod
    def _record(c: Connection, row: Any) -> TxnRecord:
        txn = row["txn"]
        vms = [dict(r) for r in c.execute(
            select(coord_txn_vm).where(coord_txn_vm.c.txn == txn)
            .order_by(coord_txn_vm.c.id)).mappings()]
        snaps = [dict(r) for r in c.execute(
            select(coord_txn_snapshot).where(coord_txn_snapshot.c.txn == txn)
            .order_by(coord_txn_snapshot.c.id)).mappings()]
        events = [dict(r) for r in c.execute(
            select(coord_txn_event).where(coord_txn_event.c.txn == txn)
            .order_by(coord_txn_event.c.id)).mappings()]
        for e in events:
            e["at"] = _aware(e["at"])
        return TxnRecord(
            txn=txn, group=row["group_name"], state=row["state"], reason=row["reason"],
            created_at=_aware(row["created_at"]), updated_at=_aware(row["updated_at"]),
            lease_ms=row["lease_ms"], budget_ms=row["budget_ms"], spec=row["spec"],
            timings=row["timings"], errors=list(row["errors"] or []),
            vms=vms, snapshots=snaps, events=events)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    # WAL keeps a state write to one fsync; FULL makes it durable at commit,
    # which invariant 4 needs (the state must survive a crash before the
    # next phase is sent).
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=FULL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA busy_timeout=5000")
    cur.close()
