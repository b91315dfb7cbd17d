"""lock_fences: the newest fencing token per group lock

A group lock (api/grouplock.py) hands its holder a token from Redis that
only grows; every write of the holder records it here in the same
transaction, and a write with an older token than the one recorded is
refused, so a worker whose lock expired cannot write after another worker
took the group.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25 09:00:00
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0006'
down_revision: str | None = '0005'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        'lock_fences',
        sa.Column('kind', sa.String(length=16), nullable=False),
        sa.Column('group_id', sa.Integer(), nullable=False),
        sa.Column('token', sa.BigInteger(), nullable=False),
        sa.Column('claimed_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('kind', 'group_id', name=op.f('pk_lock_fences')),
    )


def downgrade() -> None:
    op.drop_table('lock_fences')
