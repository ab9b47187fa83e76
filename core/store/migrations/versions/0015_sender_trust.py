"""Schedules: the trust level their creator had when they were created (core.trust). Each firing checks the
creator again and stops the schedule when they have left or now rank lower.

Revision ID: 0015
Revises: 0014
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("schedules") as batch:
        batch.add_column(sa.Column("creator_trust", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("schedules") as batch:
        batch.drop_column("creator_trust")
