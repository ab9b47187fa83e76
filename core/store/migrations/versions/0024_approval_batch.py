"""Batch and edit (issue 40.3): a model step's gated calls share a ``batch`` key (one card), and an approver's edit
is stored beside the call the model asked for (``edited_arguments``, ``edited_by``).

Revision ID: 0024
Revises: 0022
"""

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("approvals") as batch:
        batch.add_column(sa.Column("batch", sa.String(64), nullable=True))
        batch.add_column(sa.Column("edited_arguments", sa.Text(), nullable=True))
        batch.add_column(sa.Column("edited_by", sa.String(64), nullable=True))
        batch.create_index("ix_approvals_batch", ["batch"])


def downgrade() -> None:
    with op.batch_alter_table("approvals") as batch:
        batch.drop_index("ix_approvals_batch")
        batch.drop_column("edited_by")
        batch.drop_column("edited_arguments")
        batch.drop_column("batch")
