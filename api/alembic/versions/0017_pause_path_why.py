"""pause_path_why per member: why a VM was cut inside the pause

The agent cuts a VM that can take the redirect cut inside the pause when
its overlays are still being made, could not be made, or QEMU refused the
switch; the prepare reply says why (agent-protocol §5.1).  Its pause then
follows the backend's snapshot latency, so member_snapshots and the
coordinator's coord_txn_vm keep the reason.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-07 03:30:00
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0017'
down_revision: str | None = '0016'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('member_snapshots', schema=None) as batch_op:
        batch_op.add_column(sa.Column('pause_path_why', sa.Text(), nullable=True))
    with op.batch_alter_table('coord_txn_vm', schema=None) as batch_op:
        batch_op.add_column(sa.Column('pause_path_why', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('coord_txn_vm', schema=None) as batch_op:
        batch_op.drop_column('pause_path_why')
    with op.batch_alter_table('member_snapshots', schema=None) as batch_op:
        batch_op.drop_column('pause_path_why')
