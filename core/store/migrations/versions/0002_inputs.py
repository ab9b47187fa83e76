"""Inputs wait outside the transcript until a turn takes them; control switches; queue modes.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

from core.store.tables import UTCDateTime

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("place", sa.String(255), nullable=True))
        batch.add_column(sa.Column("queue_mode", sa.String(16), nullable=True))
    with op.batch_alter_table("turns") as batch:
        batch.alter_column("input_message_id", existing_type=sa.Integer(), nullable=True)
    op.create_table(
        "inputs",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("session_id", sa.String(255), sa.ForeignKey("sessions.id"), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("images", sa.Text(), nullable=True),
        sa.Column("sender", sa.String(64), nullable=True),
        sa.Column("agent", sa.String(64), nullable=True),
        sa.Column("platform_channel", sa.String(64), nullable=True),
        sa.Column("platform_ts", sa.String(64), nullable=True),
        sa.Column("idempotency_key", sa.String(255), nullable=True),
        sa.Column("turn_id", sa.Integer(), sa.ForeignKey("turns.id"), nullable=True),
        sa.Column("message_id", sa.Integer(), sa.ForeignKey("messages.id"), nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("taken_at", UTCDateTime(), nullable=True),
        sa.UniqueConstraint("session_id", "idempotency_key", name="uq_inputs_session_key"),
    )
    op.create_index("ix_inputs_session_status", "inputs", ["session_id", "status", "id"])
    op.create_table(
        "control",
        sa.Column("key", sa.String(255), primary_key=True),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
    )
    # Every message already in a transcript was an input: record it, so its key keeps deduplicating.
    # Turns still queued by the previous version become waiting inputs (their message is already
    # written, so message_id is set and nothing is written twice).
    op.execute(
        """
        INSERT INTO inputs (session_id, kind, status, text, sender, platform_channel, platform_ts,
                            idempotency_key, turn_id, message_id, created_at, taken_at)
        SELECT m.session_id,
               CASE WHEN t.id IS NULL THEN 'context' ELSE 'message' END,
               CASE WHEN t.status = 'queued' THEN 'waiting' ELSE 'taken' END,
               m.content, m.sender, m.platform_channel, m.platform_ts, m.idempotency_key,
               CASE WHEN t.status = 'queued' THEN NULL ELSE t.id END,
               m.id, m.created_at,
               CASE WHEN t.status = 'queued' THEN NULL ELSE m.created_at END
        FROM messages m LEFT JOIN turns t ON t.input_message_id = m.id
        WHERE m.role = 'user'
        """
    )
    op.execute("DELETE FROM turns WHERE status = 'queued'")


def downgrade() -> None:
    op.drop_table("control")
    op.drop_index("ix_inputs_session_status", "inputs")
    op.drop_table("inputs")
    with op.batch_alter_table("turns") as batch:
        batch.alter_column("input_message_id", existing_type=sa.Integer(), nullable=False)
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("queue_mode")
        batch.drop_column("place")
