"""pause_path per member: how the agent cut the member's VM

"redirect" (its disks switched onto overlays inside the pause, the RBD
snapshot taken after `cont`) or "in_pause" (agent-protocol §5.1).  The
agent reports it per VM in the prepare and commit replies;
member_snapshots and the coordinator's coord_txn_vm keep it.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-26 19:15:00
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0015'
down_revision: str | None = '0014'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('member_snapshots', schema=None) as batch_op:
        batch_op.add_column(sa.Column('pause_path', sa.String(length=16), nullable=True))
    with op.batch_alter_table('coord_txn_vm', schema=None) as batch_op:
        batch_op.add_column(sa.Column('pause_path', sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('coord_txn_vm', schema=None) as batch_op:
        batch_op.drop_column('pause_path')
    with op.batch_alter_table('member_snapshots', schema=None) as batch_op:
        batch_op.drop_column('pause_path')
