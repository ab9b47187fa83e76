"""Memory (issue 36): an agent's notes across its threads, searched by words.

SQLite: an FTS5 table over ``memories.text`` (external content), kept in step by triggers, so every writer (the
bot, the CLI) keeps it current in its own transaction. PostgreSQL: a generated ``text_search`` column
(``to_tsvector('simple', text)``, stored) with a GIN index. Neither is in the table metadata.

Revision ID: 0020
Revises: 0019
"""

import sqlalchemy as sa
from alembic import op

from core.store.tables import UTCDateTime

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

SQLITE_SEARCH = (
    # unicode61 folds case as PostgreSQL's 'simple' configuration does, and like it keeps accents (café is not cafe).
    "CREATE VIRTUAL TABLE memories_fts USING fts5(text, content='memories', content_rowid='id', "
    "tokenize='unicode61 remove_diacritics 0')",
    "CREATE TRIGGER memories_fts_insert AFTER INSERT ON memories BEGIN "
    "INSERT INTO memories_fts(rowid, text) VALUES (new.id, new.text); END",
    "CREATE TRIGGER memories_fts_delete AFTER DELETE ON memories BEGIN "
    "INSERT INTO memories_fts(memories_fts, rowid, text) VALUES ('delete', old.id, old.text); END",
    "CREATE TRIGGER memories_fts_update AFTER UPDATE OF text ON memories BEGIN "
    "INSERT INTO memories_fts(memories_fts, rowid, text) VALUES ('delete', old.id, old.text); "
    "INSERT INTO memories_fts(rowid, text) VALUES (new.id, new.text); END",
)
POSTGRES_SEARCH = (
    # Stored, not only indexed: ranking reads each match's vector, and computing it again per match made a recall
    # over 10,000 memories take 170 ms instead of 7 (bench.memory_recall).
    "ALTER TABLE memories ADD COLUMN text_search tsvector "
    "GENERATED ALWAYS AS (to_tsvector('simple', text)) STORED",
    "CREATE INDEX ix_memories_search ON memories USING gin (text_search)",
)


def upgrade() -> None:
    op.create_table(
        "memories",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("agent", sa.String(64), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("pinned", sa.Boolean(), nullable=False),
        sa.Column("proposed", sa.Boolean(), nullable=False),
        sa.Column("written_by", sa.String(255), nullable=True),
        sa.Column("session_id", sa.String(255), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sqlite_autoincrement=True,  # a forgotten id is never given again
    )
    op.create_index("ix_memories_agent_pinned_id", "memories", ["agent", "pinned", "id"])
    if op.get_bind().dialect.name == "sqlite":
        for statement in SQLITE_SEARCH:
            op.execute(statement)
    else:
        for statement in POSTGRES_SEARCH:
            op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        for trigger in ("memories_fts_update", "memories_fts_delete", "memories_fts_insert"):
            op.execute(f"DROP TRIGGER IF EXISTS {trigger}")
        op.execute("DROP TABLE IF EXISTS memories_fts")
    else:
        op.execute("DROP INDEX IF EXISTS ix_memories_search")
        op.execute("ALTER TABLE memories DROP COLUMN IF EXISTS text_search")
    op.drop_index("ix_memories_agent_pinned_id", "memories")
    op.drop_table("memories")
