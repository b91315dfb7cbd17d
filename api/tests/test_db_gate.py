"""The SQLite writers of one process take turns on a lock of their own
(api/db.py `_WriteGate`) before `BEGIN IMMEDIATE`, instead of meeting in
SQLite's busy handler, which sleeps up to 100 ms between tries and made
convoys of a threads-pool worker's writers (issue 19, goal 7).

A real SQLite file, two threads: the second writer's BEGIN IMMEDIATE is
sent only once the first has committed (without the gate it is sent at
once and waits inside SQLite); a failed BEGIN and a rollback give the turn
back too.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from cutpoint.api.db import get_engine
from cutpoint.api.migrate import upgrade
from sqlalchemy import event, text


def test_writers_of_one_process_take_turns_before_begin_immediate(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/gate.db"
    upgrade(url)
    engine = get_engine(url)
    log: list[tuple[str, str]] = []
    mu = threading.Lock()

    def on_sql(_conn: object, _cur: object, stmt: str, *_: object) -> None:
        if stmt.startswith("BEGIN"):
            with mu:
                log.append((threading.current_thread().name, stmt))

    def on_commit(_conn: object) -> None:
        with mu:
            log.append((threading.current_thread().name, "COMMIT"))

    event.listen(engine, "before_cursor_execute", on_sql)
    event.listen(engine, "commit", on_commit)
    try:
        holding = threading.Event()
        release = threading.Event()

        def first() -> None:
            with engine.begin() as c:
                c.execute(text("UPDATE alembic_version SET version_num = version_num"))
                holding.set()
                release.wait(10)

        def second() -> None:
            with engine.begin() as c:
                c.execute(text("UPDATE alembic_version SET version_num = version_num"))

        a = threading.Thread(target=first, name="a")
        b = threading.Thread(target=second, name="b")
        a.start()
        assert holding.wait(10)
        b.start()
        time.sleep(0.3)  # b is waiting now: at the gate, not inside SQLite
        with mu:
            seen = list(log)
        release.set()
        a.join(10)
        b.join(10)
        assert not a.is_alive() and not b.is_alive()
    finally:
        event.remove(engine, "before_cursor_execute", on_sql)
        event.remove(engine, "commit", on_commit)
    print(f"\nwhile a held the write lock: {seen}\nall: {log}")
    assert seen == [("a", "BEGIN IMMEDIATE")], seen
    assert log == [("a", "BEGIN IMMEDIATE"), ("a", "COMMIT"),
                   ("b", "BEGIN IMMEDIATE"), ("b", "COMMIT")], log
    # A rollback gives the turn back as a commit does.
    with engine.connect() as c:
        c.begin()
        c.rollback()
    with engine.begin() as c:
        c.execute(text("SELECT 1"))
    engine.dispose()
