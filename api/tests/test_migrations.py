"""Alembic from empty to head (and back) on SQLite and PostgreSQL, and the
migrated schema equals the models (compare_type=True): no drift."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from cutpoint.api import services_local
from cutpoint.api.migrate import current_heads, downgrade, upgrade
from cutpoint.api.models import Base
from cutpoint.coordinator.txlog import METADATA as TXLOG
from sqlalchemy import create_engine, inspect, text


def _fresh_url(kind: str, eps: services_local.Endpoints, tmp: Path) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp}/m.db"
    name = "mig_" + uuid.uuid4().hex[:8]
    eng = create_engine(eps.admin_url(), isolation_level="AUTOCOMMIT")
    with eng.connect() as c:
        c.execute(text(f"CREATE DATABASE {name}"))
    eng.dispose()
    return eps.admin_url(name)


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_upgrade_from_empty_matches_models(kind: str, local_services: services_local.Endpoints,
                                           tmp_path: Path) -> None:
    url = _fresh_url(kind, local_services, tmp_path)
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
