"""quiesce per member: freeze/thaw times and fallback reason

The consistency level reached is recorded per member.
member_snapshots and the coordinator's coord_txn_vm get the agent's
freeze_ms, thaw_ms and freeze_error (plus consistency in coord_txn_vm);
group_snapshots records the quiesce mode that was asked for.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22 02:00:00
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0004'
down_revision: str | None = '0003'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('member_snapshots', schema=None) as batch_op:
        batch_op.add_column(sa.Column('freeze_ms', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('thaw_ms', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('freeze_error', sa.Text(), nullable=True))
    with op.batch_alter_table('group_snapshots', schema=None) as batch_op:
        batch_op.add_column(sa.Column('quiesce', sa.String(length=16), nullable=True))
    with op.batch_alter_table('coord_txn_vm', schema=None) as batch_op:
        batch_op.add_column(sa.Column('consistency', sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column('freeze_ms', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('thaw_ms', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('freeze_error', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('coord_txn_vm', schema=None) as batch_op:
        batch_op.drop_column('freeze_error')
        batch_op.drop_column('thaw_ms')
        batch_op.drop_column('freeze_ms')
        batch_op.drop_column('consistency')
    with op.batch_alter_table('group_snapshots', schema=None) as batch_op:
        batch_op.drop_column('quiesce')
    with op.batch_alter_table('member_snapshots', schema=None) as batch_op:
        batch_op.drop_column('freeze_error')
        batch_op.drop_column('thaw_ms')
        batch_op.drop_column('freeze_ms')
