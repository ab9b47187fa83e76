"""Trust boundary: grants cover one exact call, secrets bind their row in the AEAD and carry hosts,
web chat logins are server-side sessions, an approval records who else had messages in its turn.

Grants written before this revision covered every call of a tool at a place (a NULL pattern matched
everything), so they are revoked here: the next such call is asked again.

Revision ID: 0007
Revises: 0006
"""

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

from core.store.tables import UTCDateTime

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("grants") as batch:
        batch.add_column(sa.Column("call_text", sa.Text(), nullable=True))
    with op.batch_alter_table("approvals") as batch:
        batch.add_column(sa.Column("other_senders", sa.Text(), nullable=True))
    grants = sa.table("grants", sa.column("revoked_at", UTCDateTime()), sa.column("revoked_by", sa.String(64)))
    op.execute(grants.update().where(grants.c.revoked_at.is_(None))
               .values(revoked_at=datetime.now(UTC), revoked_by="migration 0007: too broad"))
    with op.batch_alter_table("secrets") as batch:
        batch.add_column(sa.Column("aad_version", sa.Integer(), nullable=False, server_default="1"))
        batch.add_column(sa.Column("hosts", sa.Text(), nullable=True))
    op.create_table(
        "web_sessions",
        sa.Column("id_digest", sa.String(64), primary_key=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        sa.Column("revoked_at", UTCDateTime(), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("web_sessions")
    with op.batch_alter_table("secrets") as batch:
        batch.drop_column("hosts")
        batch.drop_column("aad_version")
    with op.batch_alter_table("approvals") as batch:
        batch.drop_column("other_senders")
    with op.batch_alter_table("grants") as batch:
        batch.drop_column("call_text")
