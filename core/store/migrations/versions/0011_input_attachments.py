"""Inputs: the files shared with a message (names, types, sizes, where to fetch them), read when a turn takes it.

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("inputs") as batch:
        batch.add_column(sa.Column("attachments", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("inputs") as batch:
        batch.drop_column("attachments")
