"""Separation of duties: an approval request keeps everyone whose words its turn had taken when it asked, and
whether they may approve it (a decision may come after a restart, on another replica).

Revision ID: 0028
Revises: 0022
"""

import sqlalchemy as sa
from alembic import op

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("approvals") as batch:
        batch.add_column(sa.Column("senders", sa.Text(), nullable=True))
        batch.add_column(sa.Column("self_approval", sa.Boolean(), nullable=False, server_default=sa.true()))


def downgrade() -> None:
    with op.batch_alter_table("approvals") as batch:
        batch.drop_column("self_approval")
        batch.drop_column("senders")
