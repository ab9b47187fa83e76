"""OAuth connections (SPEC §16): sealed tokens, turns parked for consent, single-use consent states.

Revision ID: 0014
Revises: 0013
"""

import sqlalchemy as sa
from alembic import op

from core.store.tables import UTCDateTime

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "connections",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("key_id", sa.String(64), nullable=False),
        sa.Column("ciphertext", sa.Text(), nullable=False),
        sa.Column("scopes", sa.Text(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=True),
        sa.Column("refreshable", sa.Boolean(), nullable=False),
        sa.Column("meta", sa.Text(), nullable=True),
        sa.Column("connected_by", sa.String(64), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.Column("refreshed_at", UTCDateTime(), nullable=True),
        sa.Column("refreshing_until", UTCDateTime(), nullable=True),
        sa.Column("last_used_at", UTCDateTime(), nullable=True),
        sa.UniqueConstraint("name", "owner", name="uq_connections_name_owner"),
    )
    op.create_table(
        "connection_requests",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("session_id", sa.String(255), sa.ForeignKey("sessions.id"), nullable=False),
        sa.Column("turn_id", sa.Integer(), sa.ForeignKey("turns.id"), nullable=True),
        sa.Column("tool_call_id", sa.String(128), nullable=False),
        sa.Column("connection", sa.String(64), nullable=False),
        sa.Column("principal", sa.String(64), nullable=False),
        sa.Column("gap", sa.String(24), nullable=False),
        sa.Column("scopes", sa.Text(), nullable=False),
        sa.Column("agent", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        sa.Column("settled_at", UTCDateTime(), nullable=True),
        sa.Column("settled_by", sa.String(64), nullable=True),
        sa.Column("resumed_at", UTCDateTime(), nullable=True),
        sa.Column("announcement", sa.Text(), nullable=True),
    )
    op.create_index("ix_connection_requests_status_expires", "connection_requests", ["status", "expires_at"])
    op.create_table(
        "oauth_states",
        sa.Column("state_hash", sa.String(64), primary_key=True),
        sa.Column("connection", sa.String(64), nullable=False),
        sa.Column("principal", sa.String(64), nullable=False),
        sa.Column("request_id", sa.Integer(), sa.ForeignKey("connection_requests.id"), nullable=True),
        sa.Column("channel", sa.String(16), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        sa.Column("opened_at", UTCDateTime(), nullable=True),
        sa.Column("used_at", UTCDateTime(), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("oauth_states")
    op.drop_index("ix_connection_requests_status_expires", table_name="connection_requests")
    op.drop_table("connection_requests")
    op.drop_table("connections")
