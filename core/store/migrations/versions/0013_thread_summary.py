"""Conversations: a short summary of the messages left out to fit the model's context window, and which
messages it covers (reused while the same ones are left out); the tokens the thread's model calls used, and
how many it may use (THREAD_TOKEN_BUDGET, raised by each Continue).

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("summary", sa.Text(), nullable=True))
        batch.add_column(sa.Column("summary_key", sa.String(64), nullable=True))
        batch.add_column(sa.Column("tokens_used", sa.BigInteger(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("token_allowance", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("token_allowance")
        batch.drop_column("tokens_used")
        batch.drop_column("summary_key")
        batch.drop_column("summary")
