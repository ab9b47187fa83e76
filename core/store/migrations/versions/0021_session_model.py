"""Fallback model (issue 37): which model a session's calls go to. NULL: its agent's own (or the primary); "fallback":
the primary failed for good in this session, so every later call of it (its sub-agents' too) goes to the fallback.

Revision ID: 0021
Revises: 0020
"""

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("model", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("model")
