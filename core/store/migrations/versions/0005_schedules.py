"""Schedules and their firings; delivery reports on turns; preapproved calls on sessions.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

from core.store.tables import UTCDateTime

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("preapproved", sa.Text(), nullable=True))
    with op.batch_alter_table("turns") as batch:
        batch.add_column(sa.Column("delivered_ref", sa.String(255), nullable=True))
        batch.add_column(sa.Column("delivery_error", sa.Text(), nullable=True))
    op.create_table(
        "schedules",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("trigger", sa.Text(), nullable=False),
        sa.Column("destination", sa.String(255), nullable=False),
        sa.Column("destination_id", sa.String(255), nullable=False),
        sa.Column("channel", sa.String(32), nullable=False),
        sa.Column("agent", sa.String(64), nullable=False),
        sa.Column("creator", sa.String(64), nullable=False),
        sa.Column("origin_session", sa.String(255), nullable=True),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("approval_id", sa.Integer(), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("firings", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("failures", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("last_fired_at", UTCDateTime(), nullable=True),
        sa.Column("last_outcome", sa.Text(), nullable=True),
    )
    op.create_table(
        "firings",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("schedule_id", sa.Integer(), sa.ForeignKey("schedules.id"), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("session_id", sa.String(255), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("started_at", UTCDateTime(), nullable=False),
        sa.Column("finished_at", UTCDateTime(), nullable=True),
        sa.Column("ts", sa.String(64), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.UniqueConstraint("schedule_id", "n", name="uq_firings_schedule_n"),
    )


def downgrade() -> None:
    op.drop_table("firings")
    op.drop_table("schedules")
    with op.batch_alter_table("turns") as batch:
        batch.drop_column("delivery_error")
        batch.drop_column("delivered_ref")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("preapproved")
