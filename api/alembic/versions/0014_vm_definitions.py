"""VM definitions captured for DR, versioned

A protected VM's definition (libvirt's inactive domain XML, or a qmp VM's
start command) as its agent gives it, a new version whenever its sha256
changes; failover and drills rewrite the newest for the DR site.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-26 19:10:00
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0014'
down_revision: str | None = '0013'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('vm_definitions',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('vm_id', sa.Integer(), nullable=False),
    sa.Column('uid', sa.String(length=64), nullable=True),
    sa.Column('host', sa.String(length=128), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('format', sa.String(length=32), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('definition', sa.Text(), nullable=False),
    sa.Column('captured_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['vm_id'], ['vms.id'],
                            name=op.f('fk_vm_definitions_vm_id_vms'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_vm_definitions')),
    sa.UniqueConstraint('vm_id', 'version', name='uq_vm_definitions_version')
    )
    with op.batch_alter_table('vm_definitions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_vm_definitions_vm_id'), ['vm_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('vm_definitions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_vm_definitions_vm_id'))
    op.drop_table('vm_definitions')
