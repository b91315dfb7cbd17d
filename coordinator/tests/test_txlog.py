"""The transaction log on SQLite and on a real PostgreSQL."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cutpoint.coordinator import TxLog, TxLogError, take_group_snapshot
from cutpoint.coordinator.txlog import (
    ABORTED,
    ABORTING,
    COMMITTED,
    COMMITTING,
    PREPARING,
    BadTransition,
    TxLogRefused,
    TxnExists,
)


@pytest.fixture(scope="module")
def postgres() -> Iterator[Any]:
    services_local = pytest.importorskip("cutpoint.api.services_local")
    state = tempfile.mkdtemp(prefix="cutpoint-coord-pg-")
    try:
        yield services_local, state, services_local.start(state, redis=False)
    finally:
        services_local.destroy(state)


@pytest.fixture(params=["sqlite", "postgresql"])
def any_txlog(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TxLog]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/c.db"
    else:
        _, _, ep = request.getfixturevalue("postgres")
        url = ep.database_url
    log = TxLog(url)
    yield log
    log.dispose()


SPEC = {"name": "g"}
SNAPS = [{"disk": "vm1/disk0", "vm": "vm1", "agent": "h1", "name": "cp.g.T"}]


def uniq(log: TxLog, base: str) -> str:
    # PostgreSQL is shared by the module; keep txn ids apart.
    return f"{base}-{log.engine.dialect.name}-{id(log) % 100000}"


def test_states_and_history(any_txlog: TxLog) -> None:
    t = uniq(any_txlog, "a")
    any_txlog.begin(t, "g", SPEC, SNAPS, lease_ms=1000, budget_ms=500)
    with pytest.raises(TxnExists):
        any_txlog.begin(t, "g", SPEC, SNAPS, lease_ms=1000, budget_ms=500)
    assert t in [r.txn for r in any_txlog.in_doubt("g")]
    any_txlog.transition(t, COMMITTING, vms=[{"vm": "vm1", "agent": "h1", "stop_ms": 0.5}])
    with pytest.raises(BadTransition, match="committing -> preparing"):
        any_txlog.transition(t, PREPARING)
    any_txlog.transition(t, COMMITTED, timings={"total_ms": 12.5},
                         vms=[{"vm": "vm1", "agent": "h1", "paused_ms": 20.0}],
                         snapshots={"vm1/disk0": {"state": "created", "snapshot_ms": 9.0}})
    rec = any_txlog.get(t)
    assert rec is not None
    assert rec.states == [PREPARING, COMMITTING, COMMITTED]
    assert rec.timings == {"total_ms": 12.5}
    assert rec.vms[0]["stop_ms"] == 0.5 and rec.vms[0]["paused_ms"] == 20.0
    assert rec.snapshots[0]["state"] == "created" and rec.created_at.tzinfo is not None
    assert t not in [r.txn for r in any_txlog.in_doubt("g")]
    with pytest.raises(BadTransition):
        any_txlog.transition(t, ABORTING)


def test_abort_path(any_txlog: TxLog) -> None:
    t = uniq(any_txlog, "b")
    any_txlog.begin(t, "g", SPEC, SNAPS, lease_ms=1000, budget_ms=500)
    any_txlog.transition(t, ABORTING, reason="prepare on h2: BUSY",
                         errors=[{"code": "BUSY"}])
    any_txlog.transition(t, ABORTED)
    rec = any_txlog.get(t)
    assert rec is not None and rec.state == ABORTED and rec.reason == "prepare on h2: BUSY"
    assert rec.errors == [{"code": "BUSY"}]
    assert any_txlog.get("no-such-txn") is None


async def test_group_snapshot_on_postgresql(postgres: Any, peers: Any,
                                            make_spec: Any) -> None:
    _, _, ep = postgres
    log = TxLog(ep.database_url)
    a = await peers("h1", {"vm1": ["disk0"]})
    b = await peers("h2", {"vm2": ["disk0"]})
    res = await take_group_snapshot(make_spec([a, b], group="pg"), log)
    assert res.committed
    assert log.get(res.txn).states == [PREPARING, COMMITTING, COMMITTED]  # type: ignore[union-attr]
    log.dispose()


async def test_database_dies_between_phases(peers: Any, make_spec: Any) -> None:
    """PostgreSQL stops after every agent PREPARED: the COMMITTING write fails,
    so the coordinator aborts everywhere (presumed abort, design §5 R4) and
    raises; no VM stays paused, no member snapshot is made."""
    services_local = pytest.importorskip("cutpoint.api.services_local")
    state = tempfile.mkdtemp(prefix="cutpoint-coord-pg2-")
    try:
        ep = services_local.start(state, redis=False)
        log = TxLog(ep.database_url)
        a = await peers("h1", {"vm1": ["disk0"]})
        b = await peers("h2", {"vm2": ["disk0"]})

        def kill_db(txn: str, phase: str) -> None:
            if phase == "prepared":
                services_local.stop(state)

        with pytest.raises(TxLogError, match="committing"):
            await take_group_snapshot(make_spec([a, b], group="pg2"), log,
                                      txn="tdb", on_event=kill_db)
        assert all(v.state == "running" for p in (a, b) for v in p.vms.values())
        assert "commit" not in a.cmds() + b.cmds()
        assert a.cmds()[-1] == "abort" and b.cmds()[-1] == "abort"
        log.dispose()
    finally:
        services_local.destroy(state)


def test_a_guard_refuses_writes_and_nothing_is_written(any_txlog: TxLog) -> None:
    """`guarded(check)`: the check runs inside each write's transaction; what
    it raises refuses the write (TxLogRefused, a TxLogError) and leaves the
    log as it was.  Reads are not guarded."""
    t = uniq(any_txlog, "guard")
    allow = [True]

    def check(conn: object) -> None:
        if not allow[0]:
            raise RuntimeError("the writer's group lock is another worker's now")

    g = any_txlog.guarded(check)
    g.begin(t, "g", SPEC, SNAPS, lease_ms=1000, budget_ms=500)
    allow[0] = False
    with pytest.raises(TxLogRefused, match="refused committing .*another worker's"):
        g.transition(t, COMMITTING)
    with pytest.raises(TxLogRefused, match="refused begin"):
        g.begin(t + "-2", "g", SPEC, SNAPS, lease_ms=1000, budget_ms=500)
    rec = g.get(t)
    assert rec is not None and rec.states == [PREPARING]
    assert g.get(t + "-2") is None
    any_txlog.transition(t, ABORTING)  # the unguarded log is not affected


def test_a_hook_writes_with_each_state_or_fails_it(any_txlog: TxLog) -> None:
    """`hooked(fn)`: fn(conn, txn, state) runs inside each state write's
    transaction, so what it writes commits with the state or not at all;
    what it raises fails the write (TxLogError) and the state is not moved."""
    from cutpoint.coordinator.txlog import coord_txn
    from sqlalchemy import select, update

    t = uniq(any_txlog, "hook")
    seen: list[tuple[str, str]] = []
    fail = [False]

    def hook(conn: Any, txn: str, state: str) -> None:
        seen.append((txn, state))
        # A write of the caller's, in the same transaction as the state.
        conn.execute(update(coord_txn).where(coord_txn.c.txn == txn)
                     .values(reason=f"hook saw {state}"))
        if fail[0]:
            raise RuntimeError("the caller's row is gone")

    h = any_txlog.hooked(hook)
    h.begin(t, "g", SPEC, SNAPS, lease_ms=1000, budget_ms=500)
    h.transition(t, COMMITTING)
    assert seen == [(t, PREPARING), (t, COMMITTING)]
    with any_txlog.engine.connect() as c:
        assert c.scalar(select(coord_txn.c.reason).where(coord_txn.c.txn == t)) \
            == "hook saw committing"
    fail[0] = True
    with pytest.raises(TxLogError, match="hook"):
        h.transition(t, COMMITTED)
    rec = any_txlog.get(t)
    assert rec is not None and rec.state == COMMITTING, rec
    assert rec.reason == "hook saw committing"  # the failed write's hook row rolled back too
