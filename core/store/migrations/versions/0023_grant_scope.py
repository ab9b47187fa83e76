"""Scoped, expiring grants (issue 40.2): a grant holds at a place or in one thread, may expire, and is bound to
the rule it was made under; a request keeps how long its grant would last, its rule's fingerprint, and which
grant its decision recorded.

Revision ID: 0023
Revises: 0022
"""

import sqlalchemy as sa
from alembic import op

from core.store.tables import UTCDateTime

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("grants") as batch:
        batch.add_column(sa.Column("thread", sa.String(255), nullable=True))
        batch.add_column(sa.Column("expires_at", UTCDateTime(), nullable=True))
        batch.add_column(sa.Column("rule", sa.Text(), nullable=True))
        batch.add_column(sa.Column("rule_key", sa.String(64), nullable=True))
    with op.batch_alter_table("approvals") as batch:
        batch.add_column(sa.Column("grant_ttl_s", sa.Float(), nullable=True))
        batch.add_column(sa.Column("grant_rule_key", sa.String(64), nullable=True))
        batch.add_column(sa.Column("grant_scope", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("approvals") as batch:
        batch.drop_column("grant_scope")
        batch.drop_column("grant_rule_key")
        batch.drop_column("grant_ttl_s")
    with op.batch_alter_table("grants") as batch:
        batch.drop_column("rule_key")
        batch.drop_column("rule")
        batch.drop_column("expires_at")
        batch.drop_column("thread")
