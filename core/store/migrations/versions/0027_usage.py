"""Spending caps (issue 40.7): what model calls used, per UTC day, agent and person.

Revision ID: 0027
Revises: 0022
"""

import sqlalchemy as sa
from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "usage",
        sa.Column("day", sa.String(10), primary_key=True),
        sa.Column("agent", sa.String(64), primary_key=True),
        sa.Column("person", sa.String(255), primary_key=True),
        sa.Column("calls", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("input_tokens", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("cost_micros", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("unpriced_calls", sa.BigInteger(), nullable=False, server_default="0"),
    )


def downgrade() -> None:
    op.drop_table("usage")
