"""Approval policies: who a request asks (a rule's approvers), how many must agree (quorum), which rule
asked, where it is shown (the thread, approvers' DMs), when they are reminded and who joins then, and each
approver's vote.

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op

from core.store.tables import UTCDateTime

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("approvals") as batch:
        batch.add_column(sa.Column("approvers", sa.Text(), nullable=True))
        batch.add_column(sa.Column("quorum", sa.Integer(), nullable=False, server_default="1"))
        batch.add_column(sa.Column("policy", sa.Text(), nullable=True))
        batch.add_column(sa.Column("notify", sa.Text(), nullable=True))
        batch.add_column(sa.Column("escalate_to", sa.Text(), nullable=True))
        batch.add_column(sa.Column("remind_at", UTCDateTime(), nullable=True))
        batch.add_column(sa.Column("reminded_at", UTCDateTime(), nullable=True))
    op.create_table(
        "approval_votes",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("approval_id", sa.Integer(), sa.ForeignKey("approvals.id"), nullable=False),
        sa.Column("voter", sa.String(64), nullable=False),
        sa.Column("verdict", sa.String(16), nullable=False),
        sa.Column("voted_at", UTCDateTime(), nullable=False),
        sa.UniqueConstraint("approval_id", "voter", name="uq_approval_votes_voter"),
    )


def downgrade() -> None:
    op.drop_table("approval_votes")
    with op.batch_alter_table("approvals") as batch:
        batch.drop_column("reminded_at")
        batch.drop_column("remind_at")
        batch.drop_column("escalate_to")
        batch.drop_column("notify")
        batch.drop_column("policy")
        batch.drop_column("quorum")
        batch.drop_column("approvers")
