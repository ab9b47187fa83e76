"""Deliveries: the outbox of answers, retried until the channel takes them (or they are given up).

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

from core.store.tables import UTCDateTime

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "deliveries",
        sa.Column("turn_id", sa.Integer(), sa.ForeignKey("turns.id"), primary_key=True, autoincrement=False),
        sa.Column("session_id", sa.String(255), sa.ForeignKey("sessions.id"), nullable=False),
        sa.Column("channel", sa.String(32), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", UTCDateTime(), nullable=False),
        sa.Column("claimed_by", sa.String(64), nullable=True),
        sa.Column("ref", sa.String(255), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("finished_at", UTCDateTime(), nullable=True),
        sa.Column("told", sa.Boolean(), nullable=False),
    )
    op.create_index("ix_deliveries_status_next", "deliveries", ["status", "next_attempt_at"])


def downgrade() -> None:
    op.drop_index("ix_deliveries_status_next", table_name="deliveries")
    op.drop_table("deliveries")
