"""Listening channels (issue 35): which inputs may be left unanswered, and each place's unaddressed turns per minute.

Revision ID: 0019
Revises: 0018
"""

import sqlalchemy as sa
from alembic import op

from core.store.tables import UTCDateTime

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("inputs") as batch:
        batch.add_column(sa.Column("answer_optional", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.create_table(
        "listen_rates",
        sa.Column("place", sa.String(255), primary_key=True),
        sa.Column("window_start", UTCDateTime(), primary_key=True),
        sa.Column("count", sa.Integer(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("listen_rates")
    with op.batch_alter_table("inputs") as batch:
        batch.drop_column("answer_optional")
