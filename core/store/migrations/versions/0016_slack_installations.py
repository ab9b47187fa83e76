"""Multi-workspace (OAuth) Slack installs (issue 20): one row per workspace with its sealed bot token, and the
single-use states of install links.

Revision ID: 0016
Revises: 0015
"""

import sqlalchemy as sa
from alembic import op

from core.store.tables import UTCDateTime

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "slack_installations",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("enterprise_id", sa.String(32), nullable=False),
        sa.Column("team_id", sa.String(32), nullable=False),
        sa.Column("is_enterprise_install", sa.Boolean(), nullable=False),
        sa.Column("app_id", sa.String(32), nullable=True),
        sa.Column("team_name", sa.String(255), nullable=True),
        sa.Column("bot_id", sa.String(32), nullable=True),
        sa.Column("bot_user_id", sa.String(32), nullable=True),
        sa.Column("bot_scopes", sa.Text(), nullable=False),
        sa.Column("installer", sa.String(32), nullable=True),
        sa.Column("key_id", sa.String(64), nullable=False),
        sa.Column("ciphertext", sa.Text(), nullable=False),
        sa.Column("bot_token_expires_at", UTCDateTime(), nullable=True),
        sa.Column("installed_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.UniqueConstraint("enterprise_id", "team_id", name="uq_slack_installations_workspace"),
    )
    op.create_table(
        "slack_oauth_states",
        sa.Column("state_hash", sa.String(64), primary_key=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("slack_oauth_states")
    op.drop_table("slack_installations")
