"""Traces (issue 38.7): each input keeps the traceparent of its intake's span, so its turn joins that trace.

Revision ID: 0022
Revises: 0021
"""

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("inputs") as batch:
        batch.add_column(sa.Column("trace_context", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("inputs") as batch:
        batch.drop_column("trace_context")
