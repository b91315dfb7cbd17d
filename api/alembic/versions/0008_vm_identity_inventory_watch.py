"""vms.uid (identity across hosts), vms.stale, disks.size_bytes; the
inventory watch's last applied agent instance/generation per host

A libvirt VM is known by its domain UUID and a raw-QEMU VM by its
configured id, so a VM that moves host stays the same row (and group
member).  The watch polls every agent's `inventory` every few seconds and
writes only when the agent's (instance, generation) moved.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26 10:00:00
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0008'
down_revision: str | None = '0007'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('vms') as b:
        b.add_column(sa.Column('uid', sa.String(length=64), nullable=True))
        b.add_column(sa.Column('stale', sa.Boolean(), nullable=False,
                               server_default=sa.false()))
        b.create_unique_constraint(op.f('uq_vms_uid'), ['uid'])
    with op.batch_alter_table('disks') as b:
        b.add_column(sa.Column('size_bytes', sa.BigInteger(), nullable=True))
    with op.batch_alter_table('hosts') as b:
        b.add_column(sa.Column('inventory_instance', sa.String(length=32), nullable=True))
        b.add_column(sa.Column('inventory_generation', sa.BigInteger(), nullable=True))
        b.add_column(sa.Column('inventory_stale', sa.Boolean(), nullable=False,
                               server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table('hosts') as b:
        b.drop_column('inventory_stale')
        b.drop_column('inventory_generation')
        b.drop_column('inventory_instance')
    with op.batch_alter_table('disks') as b:
        b.drop_column('size_bytes')
    with op.batch_alter_table('vms') as b:
        b.drop_constraint(op.f('uq_vms_uid'), type_='unique')
        b.drop_column('stale')
        b.drop_column('uid')
