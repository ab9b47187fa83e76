"""Change freezes (issue 40.6): ``bot freeze`` and ``/bot freeze`` are stored, so every replica honours them.

Revision ID: 0026
Revises: 0022
"""

import sqlalchemy as sa
from alembic import op

from core.store.tables import UTCDateTime

revision = "0026"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "freezes",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("starts_at", UTCDateTime(), nullable=False),
        sa.Column("until", UTCDateTime(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_by", sa.String(255), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("lifted_at", UTCDateTime(), nullable=True),
        sa.Column("lifted_by", sa.String(255), nullable=True),
    )
    op.create_index("ix_freezes_until", "freezes", ["until"])


def downgrade() -> None:
    op.drop_index("ix_freezes_until", table_name="freezes")
    op.drop_table("freezes")
