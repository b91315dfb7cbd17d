"""Alembic from empty to head (and back) on SQLite and PostgreSQL, and the
migrated schema equals the models (compare_type=True): no drift."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from cutpoint.api.migrate import current_heads, downgrade, upgrade
from cutpoint.api.models import Base
from cutpoint.coordinator.txlog import METADATA as TXLOG
from sqlalchemy import create_engine, inspect, text


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_upgrade_from_empty_matches_models(kind: str,
                                           empty_db: Callable[[str], str]) -> None:
    url = empty_db(kind)
    upgrade(url)
    eng = create_engine(url)
    with eng.connect() as c:
        assert c.execute(text("SELECT version_num FROM alembic_version")).scalar() \
            == current_heads()[0]
        diff = compare_metadata(MigrationContext.configure(c, opts={"compare_type": True}),
                                [Base.metadata, TXLOG])
    assert diff == []
    assert {"groups", "group_disks", "group_snapshots", "coord_txn"} \
        <= set(inspect(eng).get_table_names())
    eng.dispose()
    downgrade(url)
    eng = create_engine(url)
    assert set(inspect(eng).get_table_names()) <= {"alembic_version"}
    eng.dispose()
    upgrade(url)
