"""Step-up approvals (issue 40.5): a rule's ``step_up`` on its requests, approvers' passkeys, and the one-time
links that enrol a passkey or confirm an approval with one.

Revision ID: 0025
Revises: 0022
"""

import sqlalchemy as sa
from alembic import op

from core.store.columns import UTCDateTime

revision = "0025"
down_revision = "0028"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("approvals") as batch:
        batch.add_column(sa.Column("step_up", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.create_table(
        "passkeys",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("owner", sa.String(255), nullable=False),
        sa.Column("credential_id", sa.String(1024), nullable=False, unique=True),
        sa.Column("public_key", sa.LargeBinary(), nullable=False),
        sa.Column("sign_count", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("created_by", sa.String(64), nullable=False),
        sa.Column("last_used_at", UTCDateTime(), nullable=True),
        sa.Column("revoked_at", UTCDateTime(), nullable=True),
    )
    op.create_index("ix_passkeys_owner", "passkeys", ["owner"])
    op.create_table(
        "passkey_links",
        sa.Column("token_digest", sa.String(64), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("owner", sa.String(255), nullable=False),
        sa.Column("approval_id", sa.Integer(), sa.ForeignKey("approvals.id"), nullable=True),
        sa.Column("decider", sa.String(64), nullable=True),
        sa.Column("verdict", sa.String(16), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        sa.Column("challenge", sa.Text(), nullable=True),
        sa.Column("challenge_expires_at", UTCDateTime(), nullable=True),
        sa.Column("used_at", UTCDateTime(), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("passkey_links")
    op.drop_index("ix_passkeys_owner", table_name="passkeys")
    op.drop_table("passkeys")
    with op.batch_alter_table("approvals") as batch:
        batch.drop_column("step_up")
