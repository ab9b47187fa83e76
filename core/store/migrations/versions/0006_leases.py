"""Leases: one process at a time runs a session's turns or the scheduler (SPEC §11).

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

from core.store.tables import UTCDateTime

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "leases",
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column("holder", sa.String(64), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("leases")
