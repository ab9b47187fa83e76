"""Approval requests, grants ("Always allow") and the audit log.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

from core.store.tables import UTCDateTime

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "approvals",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("session_id", sa.String(255), sa.ForeignKey("sessions.id"), nullable=False),
        sa.Column("turn_id", sa.Integer(), sa.ForeignKey("turns.id"), nullable=True),
        sa.Column("tool_call_id", sa.String(128), nullable=False),
        sa.Column("tool", sa.String(64), nullable=False),
        sa.Column("arguments", sa.Text(), nullable=False),
        sa.Column("agent", sa.String(64), nullable=False),
        sa.Column("place", sa.String(255), nullable=True),
        sa.Column("requester", sa.String(64), nullable=True),
        sa.Column("risk", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("parked_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        sa.Column("decided_by", sa.String(64), nullable=True),
        sa.Column("decided_at", UTCDateTime(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("always", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("announcement", sa.Text(), nullable=True),
        sa.Column("started_at", UTCDateTime(), nullable=True),
    )
    op.create_index("ix_approvals_status_expires", "approvals", ["status", "expires_at"])
    op.create_index("ix_approvals_tool_call_id", "approvals", ["tool_call_id"])
    op.create_table(
        "grants",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("agent", sa.String(64), nullable=False),
        sa.Column("tool", sa.String(64), nullable=False),
        sa.Column("place", sa.String(255), nullable=True),
        sa.Column("arg_pattern", sa.String(500), nullable=True),
        sa.Column("created_by", sa.String(64), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("revoked_by", sa.String(64), nullable=True),
        sa.Column("revoked_at", UTCDateTime(), nullable=True),
    )
    op.create_index("ix_grants_lookup", "grants", ["agent", "tool", "place"])
    op.create_table(
        "audit",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("at", UTCDateTime(), nullable=False),
        sa.Column("actor", sa.String(64), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("subject", sa.String(255), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True),
    )
    op.create_index("ix_audit_at", "audit", ["at"])


def downgrade() -> None:
    op.drop_table("audit")
    op.drop_index("ix_grants_lookup", "grants")
    op.drop_table("grants")
    op.drop_index("ix_approvals_tool_call_id", "approvals")
    op.drop_index("ix_approvals_status_expires", "approvals")
    op.drop_table("approvals")
