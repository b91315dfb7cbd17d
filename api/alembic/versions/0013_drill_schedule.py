"""Policies: a drill schedule

`drill_every_seconds`: beat asks for a drill of the newest DR recovery
point this often (services/drill_schedule.py); NULL: no schedule.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-26 19:30:00
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0013'
down_revision: str | None = '0012'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('policies', schema=None) as batch_op:
        batch_op.add_column(sa.Column('drill_every_seconds', sa.Integer(), nullable=True))
        batch_op.create_check_constraint(
            op.f('ck_policies_drill_every_positive'),
            'drill_every_seconds IS NULL OR drill_every_seconds > 0')


def downgrade() -> None:
    with op.batch_alter_table('policies', schema=None) as batch_op:
        batch_op.drop_constraint(op.f('ck_policies_drill_every_positive'), type_='check')
        batch_op.drop_column('drill_every_seconds')
