"""Sessions, messages, turns and processed delivery ids.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

from core.store.tables import UTCDateTime

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sessions",
        sa.Column("id", sa.String(255), primary_key=True),
        sa.Column("channel", sa.String(32), nullable=False),
        sa.Column("agent", sa.String(64), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("reply_ref", sa.Text(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
    )
    op.create_table(
        "messages",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("session_id", sa.String(255), sa.ForeignKey("sessions.id"), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("sender", sa.String(64), nullable=True),
        sa.Column("platform_channel", sa.String(64), nullable=True),
        sa.Column("platform_ts", sa.String(64), nullable=True),
        sa.Column("idempotency_key", sa.String(255), nullable=True),
        sa.Column("tool_calls", sa.Text(), nullable=True),
        sa.Column("tool_call_id", sa.String(128), nullable=True),
        sa.Column("turn_id", sa.Integer(), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.UniqueConstraint("session_id", "idempotency_key", name="uq_messages_session_key"),
    )
    op.create_index("ix_messages_session_id_id", "messages", ["session_id", "id"])
    op.create_table(
        "turns",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("session_id", sa.String(255), sa.ForeignKey("sessions.id"), nullable=False),
        sa.Column("agent", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("input_message_id", sa.Integer(), sa.ForeignKey("messages.id"), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("answer", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("started_at", UTCDateTime(), nullable=True),
        sa.Column("finished_at", UTCDateTime(), nullable=True),
    )
    op.create_index("ix_turns_session_status", "turns", ["session_id", "status"])
    op.create_table(
        "processed_events",
        sa.Column("key", sa.String(255), primary_key=True),
        sa.Column("received_at", UTCDateTime(), nullable=False),
    )
    op.create_index("ix_processed_events_received_at", "processed_events", ["received_at"])


def downgrade() -> None:
    op.drop_table("processed_events")
    op.drop_index("ix_turns_session_status", "turns")
    op.drop_table("turns")
    op.drop_index("ix_messages_session_id_id", "messages")
    op.drop_table("messages")
    op.drop_table("sessions")
