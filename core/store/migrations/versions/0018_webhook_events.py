"""Events in (issue 34): every delivery to ``POST /events/<source>``, and each source's deliveries per minute.

Revision ID: 0018
Revises: 0017
"""

import sqlalchemy as sa
from alembic import op

from core.store.tables import UTCDateTime

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

_FIRST = sa.text("status <> 'duplicate'")


def upgrade() -> None:
    op.create_table(
        "webhook_events",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("source", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("event_type", sa.String(255), nullable=False),
        sa.Column("delivery_id", sa.String(255), nullable=True),
        sa.Column("body_digest", sa.String(64), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("thread_key", sa.String(255), nullable=True),
        sa.Column("session_id", sa.String(255), nullable=True),
        sa.Column("input_id", sa.Integer(), nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("received_at", UTCDateTime(), nullable=False),
        sa.Column("finished_at", UTCDateTime(), nullable=True),
        sa.Column("replay_of", sa.Integer(), nullable=True),
        sqlite_autoincrement=True,  # ids never reused after a prune (the turn's dedupe key is event:<id>)
    )
    op.create_index("uq_webhook_events_delivery", "webhook_events", ["source", "delivery_id"], unique=True,
                    sqlite_where=_FIRST, postgresql_where=_FIRST)
    op.create_index("uq_webhook_events_body", "webhook_events", ["source", "body_digest"], unique=True,
                    sqlite_where=_FIRST, postgresql_where=_FIRST)
    op.create_index("ix_webhook_events_status_id", "webhook_events", ["status", "id"])
    op.create_index("ix_webhook_events_received", "webhook_events", ["received_at"])
    op.create_table(
        "webhook_rates",
        sa.Column("source", sa.String(64), primary_key=True),
        sa.Column("window_start", UTCDateTime(), primary_key=True),
        sa.Column("count", sa.Integer(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("webhook_rates")
    op.drop_index("ix_webhook_events_received", "webhook_events")
    op.drop_index("ix_webhook_events_status_id", "webhook_events")
    op.drop_index("uq_webhook_events_body", "webhook_events")
    op.drop_index("uq_webhook_events_delivery", "webhook_events")
    op.drop_table("webhook_events")
