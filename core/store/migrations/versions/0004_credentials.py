"""Sealed secrets, their grants, credential requests and one-time links.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

from core.store.tables import UTCDateTime

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "secrets",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("scope", sa.String(16), nullable=False),
        sa.Column("agent", sa.String(64), nullable=False),
        sa.Column("key_id", sa.String(64), nullable=False),
        sa.Column("ciphertext", sa.Text(), nullable=False),
        sa.Column("created_by", sa.String(64), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.Column("last_used_at", UTCDateTime(), nullable=True),
        sa.UniqueConstraint("name", "scope", "agent", name="uq_secrets_name_scope_agent"),
    )
    op.create_table(
        "secret_grants",
        sa.Column("secret_id", sa.Integer(), sa.ForeignKey("secrets.id"), primary_key=True),
        sa.Column("agent", sa.String(64), primary_key=True),
        sa.Column("granted_by", sa.String(64), nullable=False),
        sa.Column("granted_at", UTCDateTime(), nullable=False),
    )
    op.create_table(
        "credential_requests",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("session_id", sa.String(255), sa.ForeignKey("sessions.id"), nullable=False),
        sa.Column("turn_id", sa.Integer(), sa.ForeignKey("turns.id"), nullable=True),
        sa.Column("tool_call_id", sa.String(128), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("scope", sa.String(16), nullable=False),
        sa.Column("agent", sa.String(64), nullable=False),
        sa.Column("requester", sa.String(64), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        sa.Column("provided_by", sa.String(64), nullable=True),
        sa.Column("provided_at", UTCDateTime(), nullable=True),
        sa.Column("announcement", sa.Text(), nullable=True),
    )
    op.create_index("ix_credential_requests_status_expires", "credential_requests", ["status", "expires_at"])
    op.create_table(
        "credential_links",
        sa.Column("jti", sa.String(64), primary_key=True),
        sa.Column("request_id", sa.Integer(), sa.ForeignKey("credential_requests.id"), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        sa.Column("used_at", UTCDateTime(), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("credential_links")
    op.drop_index("ix_credential_requests_status_expires", "credential_requests")
    op.drop_table("credential_requests")
    op.drop_table("secret_grants")
    op.drop_table("secrets")
