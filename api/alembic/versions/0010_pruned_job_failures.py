"""Pruned job failures: what history pruning deleted, counted

Finished jobs, their events and audit entries older than the retention
setting are deleted by the history pruner.  The failure counter
(`cutpoint_job_failures_total`) is computed from the jobs table, so the
failed jobs a pass deletes are added here, per kind and code, first.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25 07:20:00
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0010'
down_revision: str | None = '0009'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('pruned_job_failures',
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('error_code', sa.String(length=64), nullable=False),
    sa.Column('count', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.PrimaryKeyConstraint('kind', 'error_code', name=op.f('pk_pruned_job_failures'))
    )


def downgrade() -> None:
    op.drop_table('pruned_job_failures')
