"""Hosts: when the agent's certificate expires

Recorded from the certificate the agent presents at each inventory pull,
for the metric `cutpoint_agent_cert_expiry_timestamp_seconds` and its
alert.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-25 07:50:00
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0012'
down_revision: str | None = '0011'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('hosts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('cert_not_after', sa.DateTime(timezone=True),
                                      nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('hosts', schema=None) as batch_op:
        batch_op.drop_column('cert_not_after')
