"""Webhooks: subscriptions and their deliveries

An event (an RPO miss, a failed replication, a drill's result, a failover
or failback) is recorded once per subscription that wants it, and the
worker POSTs it, signed with HMAC-SHA256, retrying with backoff.  The
signing secret stays in a file on the control plane hosts: only its path
is stored.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25 07:40:00
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0011'
down_revision: str | None = '0010'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('webhooks',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('url', sa.String(length=2048), nullable=False),
    sa.Column('events', sa.JSON(), nullable=False),
    sa.Column('secret_file', sa.String(length=1024), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_webhooks')),
    sa.UniqueConstraint('name', name=op.f('uq_webhooks_name'))
    )
    op.create_table('webhook_deliveries',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('webhook_id', sa.Integer(), nullable=False),
    sa.Column('event', sa.String(length=64), nullable=False),
    sa.Column('payload', sa.JSON(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('last_status', sa.Integer(), nullable=True),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('next_attempt_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('delivered_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['webhook_id'], ['webhooks.id'],
                            name=op.f('fk_webhook_deliveries_webhook_id_webhooks'),
                            ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_webhook_deliveries'))
    )
    with op.batch_alter_table('webhook_deliveries', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_webhook_deliveries_webhook_id'), ['webhook_id'],
                              unique=False)
        batch_op.create_index(batch_op.f('ix_webhook_deliveries_state'), ['state'],
                              unique=False)
        batch_op.create_index(batch_op.f('ix_webhook_deliveries_next_attempt_at'),
                              ['next_attempt_at'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('webhook_deliveries', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_webhook_deliveries_next_attempt_at'))
        batch_op.drop_index(batch_op.f('ix_webhook_deliveries_state'))
        batch_op.drop_index(batch_op.f('ix_webhook_deliveries_webhook_id'))
    op.drop_table('webhook_deliveries')
    op.drop_table('webhooks')
