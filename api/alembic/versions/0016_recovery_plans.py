"""Recovery plans, versioned; one active drill per group, kept by an index

recovery_plans: a group's plan (boot groups, readiness, hooks, networks per
purpose, drill checks), one row per version (services/plans.py).

uq_jobs_one_active_drill: a partial unique index on jobs(group_id) over
the drill jobs that are queued or running, so two drill requests of one
group that both found none in progress cannot both be created
(services/drills.py; the loser gets 409 drill_in_progress).

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-27 14:00:00
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0016'
down_revision: str | None = '0015'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ACTIVE_DRILL = "kind = 'drill' AND state IN ('queued', 'running')"


def upgrade() -> None:
    op.create_table('recovery_plans',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('group_id', sa.Integer(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('body', sa.JSON(), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('created_by', sa.String(length=64), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['group_id'], ['groups.id'],
                            name=op.f('fk_recovery_plans_group_id_groups'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_recovery_plans')),
    sa.UniqueConstraint('group_id', 'version', name='uq_recovery_plans_version')
    )
    with op.batch_alter_table('recovery_plans', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_recovery_plans_group_id'), ['group_id'],
                              unique=False)
    op.create_index('uq_jobs_one_active_drill', 'jobs', ['group_id'], unique=True,
                    sqlite_where=sa.text(ACTIVE_DRILL), postgresql_where=sa.text(ACTIVE_DRILL))


def downgrade() -> None:
    op.drop_index('uq_jobs_one_active_drill', table_name='jobs')
    with op.batch_alter_table('recovery_plans', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_recovery_plans_group_id'))
    op.drop_table('recovery_plans')
