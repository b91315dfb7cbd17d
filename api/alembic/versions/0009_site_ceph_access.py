"""Ceph access on sites: ceph.conf or mon addresses, cephx id, keyring path, pools

A site's Ceph cluster used to come from a JSON file outside the database;
it is now product configuration, set through the API.  The key stays in
the keyring file: only its path is stored.  `ceph_check` keeps the newest
site check of the current access.  Existing sites get no Ceph access
(all NULL) until an operator sets it.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-23 09:00:00
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0009'
down_revision: str | None = '0008'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('sites', schema=None) as batch_op:
        batch_op.add_column(sa.Column('ceph_conf', sa.String(length=1024), nullable=True))
        batch_op.add_column(sa.Column('ceph_mon_host', sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column('ceph_client_id', sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column('ceph_keyring', sa.String(length=1024), nullable=True))
        batch_op.add_column(sa.Column('ceph_pools', sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column('ceph_connect_timeout_s', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('ceph_op_timeout_s', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('ceph_bulk_timeout_s', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('ceph_check', sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column('ceph_checked_at', sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('sites', schema=None) as batch_op:
        for col in ('ceph_checked_at', 'ceph_check', 'ceph_bulk_timeout_s', 'ceph_op_timeout_s',
                    'ceph_connect_timeout_s', 'ceph_pools', 'ceph_keyring', 'ceph_client_id',
                    'ceph_mon_host', 'ceph_conf'):
            batch_op.drop_column(col)
