"""Alembic environment: the URL comes from the caller or the settings."""

from __future__ import annotations

from alembic import context
from cutpoint.api.db import get_engine
from cutpoint.api.models import Base
from cutpoint.coordinator.txlog import METADATA as TXLOG_METADATA
from sqlalchemy import pool

config = context.config
# The coordinator's transaction log lives in the same database, so that a
# group snapshot's durable decisions and the API's rows share one backup.
target_metadata = [Base.metadata, TXLOG_METADATA]


def _url() -> str:
    url = config.attributes.get("database_url") or config.get_main_option("sqlalchemy.url")
    if url:
        return str(url)
    from cutpoint.api.config import get_settings

    return get_settings().database_url


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True,
                      compare_type=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    url = _url()
    engine = get_engine(url) if not url.startswith("sqlite") else None
    if engine is None:
        from sqlalchemy import create_engine

        # Plain pysqlite here: Alembic manages its own transaction, and the
        # app engine's BEGIN IMMEDIATE hook is not needed for DDL.
        engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata,
                          compare_type=True, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
    if url.startswith("sqlite"):
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
