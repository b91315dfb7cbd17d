"""thaw_error per member: a failed thaw after the snapshot

A guest whose guest-fsfreeze-thaw failed may still be
frozen (its filesystems block writes).  The agent reports it in the commit
reply (`thaw_error`); member_snapshots and the coordinator's coord_txn_vm
keep it next to thaw_ms.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-22 05:45:00
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0005'
down_revision: str | None = '0004'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('member_snapshots', schema=None) as batch_op:
        batch_op.add_column(sa.Column('thaw_error', sa.Text(), nullable=True))
    with op.batch_alter_table('coord_txn_vm', schema=None) as batch_op:
        batch_op.add_column(sa.Column('thaw_error', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('coord_txn_vm', schema=None) as batch_op:
        batch_op.drop_column('thaw_error')
    with op.batch_alter_table('member_snapshots', schema=None) as batch_op:
        batch_op.drop_column('thaw_error')
