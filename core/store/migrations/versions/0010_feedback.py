"""Feedback: who found which answer good or bad (the buttons under each answer).

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

from core.store.tables import UTCDateTime

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "feedback",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("turn_id", sa.Integer(), sa.ForeignKey("turns.id"), nullable=False),
        sa.Column("session_id", sa.String(255), sa.ForeignKey("sessions.id"), nullable=False),
        sa.Column("user", sa.String(255), nullable=False),
        sa.Column("positive", sa.Boolean(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.UniqueConstraint("turn_id", "user", name="uq_feedback_turn_user"),
    )
    op.create_index("ix_feedback_updated", "feedback", ["updated_at"])


def downgrade() -> None:
    op.drop_index("ix_feedback_updated", table_name="feedback")
    op.drop_table("feedback")
