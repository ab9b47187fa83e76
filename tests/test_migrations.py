"""A database written by revision 0001 (messages + queued turns) opens and upgrades in place."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from sqlalchemy import Connection, func, text
from sqlmodel import SQLModel, col, select

import channels.slack.tables  # noqa: F401  (with core.store.tables: populates SQLModel.metadata)
import core.store.tables  # noqa: F401  (populates SQLModel.metadata)
from core.model import Inbound, InputKind, InputStatus, MessageRef, TurnStatus
from core.store import AcceptOutcome, Budget, ConversationStore, Database, InputStore
from core.store.database import MIGRATIONS_DIR
from core.store.memories import in_metadata  # the search's own tables and index are not modelled
from core.store.tables import InputRow, MessageRow, TurnRow

SID = "slack:T1:C1:1.0"
OLD = "2024-05-01 12:00:00.000000"  # how SQLAlchemy stores a UTC DateTime in SQLite
NOW = datetime(2024, 6, 1, 9, 0, tzinfo=UTC)

# One conversation as revision 0001 left it: a finished turn, one running, one still queued, and context.
ROWS_0001 = [
    f"INSERT INTO sessions VALUES ('{SID}', 'slack', 'default', 'running', "
    """'{"channel": "C1", "thread_ts": "1.0"}', '%(t)s', '%(t)s')""",
    "INSERT INTO messages (id, session_id, role, content, sender, platform_channel, platform_ts, idempotency_key,"
    f" turn_id, created_at) VALUES (1, '{SID}', 'user', 'done?', 'U1', 'C1', '1.1', 'C1:1.1', 1, '%(t)s')",
    "INSERT INTO messages (id, session_id, role, content, turn_id, created_at)"
    f" VALUES (2, '{SID}', 'assistant', 'yes', 1, '%(t)s')",
    "INSERT INTO messages (id, session_id, role, content, sender, platform_channel, platform_ts, idempotency_key,"
    f" turn_id, created_at) VALUES (3, '{SID}', 'user', 'running?', 'U1', 'C1', '1.3', 'C1:1.3', 2, '%(t)s')",
    "INSERT INTO messages (id, session_id, role, content, sender, platform_channel, platform_ts, idempotency_key,"
    f" created_at) VALUES (4, '{SID}', 'user', 'just saying', 'U2', 'C1', '1.4', 'C1:1.4', '%(t)s')",
    "INSERT INTO messages (id, session_id, role, content, sender, platform_channel, platform_ts, idempotency_key,"
    f" turn_id, created_at) VALUES (5, '{SID}', 'user', 'queued?', 'U1', 'C1', '1.5', 'C1:1.5', 3, '%(t)s')",
    "INSERT INTO turns (id, session_id, agent, status, input_message_id, attempts, answer, created_at, finished_at)"
    f" VALUES (1, '{SID}', 'default', 'finished', 1, 1, 'yes', '%(t)s', '%(t)s')",
    "INSERT INTO turns (id, session_id, agent, status, input_message_id, attempts, created_at, started_at)"
    f" VALUES (2, '{SID}', 'default', 'running', 3, 1, '%(t)s', '%(t)s')",
    "INSERT INTO turns (id, session_id, agent, status, input_message_id, attempts, created_at)"
    f" VALUES (3, '{SID}', 'default', 'queued', 5, 0, '%(t)s')",
]


def _upgrade_to(revision: str) -> Any:
    def run(conn: Connection) -> None:
        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)

    return run


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    database = Database(f"sqlite:///{tmp_path}/old.db")
    async with database._write_engine.begin() as conn:
        await conn.run_sync(_upgrade_to("0001"))
    async with database._write_engine.begin() as conn:
        for statement in ROWS_0001:
            await conn.execute(text(statement % {"t": OLD}))
    await database.migrate()
    yield database
    await database.close()


async def inputs_by_message(db: Database) -> dict[int | None, InputRow]:
    async with db.read() as s:
        return {row.message_id: row for row in (await s.exec(select(InputRow))).all()}


async def test_every_user_message_becomes_an_input(db: Database) -> None:
    rows = await inputs_by_message(db)
    assert sorted(k for k in rows if k is not None) == [1, 3, 4, 5]  # not the assistant's message
    finished, running, context, queued = rows[1], rows[3], rows[4], rows[5]
    assert (finished.kind, finished.status, finished.turn_id) == (InputKind.MESSAGE, InputStatus.TAKEN, 1)
    assert finished.taken_at is not None and finished.idempotency_key == "C1:1.1"
    assert (running.status, running.turn_id) == (InputStatus.TAKEN, 2)
    assert (context.kind, context.status, context.turn_id) == (InputKind.CONTEXT, InputStatus.TAKEN, None)
    assert (queued.kind, queued.status, queued.turn_id, queued.taken_at) == (
        InputKind.MESSAGE, InputStatus.WAITING, None, None)
    assert (queued.text, queued.sender, queued.platform_ts) == ("queued?", "U1", "1.5")
    assert queued.created_at == datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


async def test_queued_turns_are_deleted_and_running_kept(db: Database) -> None:
    async with db.read() as s:
        turns = {t.id: t.status for t in (await s.exec(select(TurnRow))).all()}
    assert turns == {1: TurnStatus.FINISHED, 2: TurnStatus.RUNNING}
    convs = ConversationStore(db)
    assert await convs.running_turn(SID) == 2
    assert await convs.sessions_with_work() == [SID]  # the converted waiting input
    info = await convs.turn_info(2)
    assert info is not None and (info.inputs, info.sender) == ((MessageRef("C1", "1.3"),), "U1")


async def test_old_idempotency_key_still_deduplicates(db: Database) -> None:
    again = Inbound(session_id=SID, channel="slack", sender="U1", text="done?", addressed=True,
                    ref=MessageRef("C1", "1.1"), idempotency_key="C1:1.1", delivery_key="Ev-new")
    result = await InputStore(db).accept(again, kind=InputKind.MESSAGE, agent="default", refuse=None,
                                         max_waiting=20, now=NOW)
    assert (result.outcome, result.input_id) == (AcceptOutcome.DUPLICATE, (await inputs_by_message(db))[1].id)
    assert result.input_id is not None
    outcome = await InputStore(db).outcome(result.input_id)
    assert outcome is not None and (outcome.status, outcome.text, outcome.turn_id) == ("answered", "yes", 1)


async def test_taking_the_converted_input_writes_no_second_message(db: Database) -> None:
    async with db.write() as s:  # let the interrupted turn end first, as recovery would
        running = await s.get(TurnRow, 2)
        assert running is not None
        running.status = TurnStatus.FINISHED
    async with db.read() as s:
        before = int((await s.exec(select(func.count()).select_from(MessageRow))).one())
    taken = await InputStore(db).take_batch(SID, "collect", Budget(), NOW)
    assert taken is not None and (taken.text, taken.refs) == ("queued?", (MessageRef("C1", "1.5"),))
    async with db.read() as s:
        after = int((await s.exec(select(func.count()).select_from(MessageRow))).one())
        copies = (await s.exec(select(MessageRow.id).where(col(MessageRow.content) == "queued?"))).all()
    assert (after, list(copies)) == (before, [5])
    assert (await inputs_by_message(db))[5].status == InputStatus.TAKEN


async def test_history_shows_the_converted_waiting_input_once(db: Database) -> None:
    entries = await ConversationStore(db).history(SID)
    assert [e.content for e in entries if e.content == "queued?"] == ["queued?"]


async def test_migrate_again_is_a_noop_and_schema_matches(db: Database) -> None:
    await db.migrate()
    async with db.engine.connect() as conn:
        version = (await conn.execute(text("SELECT version_num FROM alembic_version"))).scalars().all()

        def diff(sync: Connection) -> list[Any]:
            context = MigrationContext.configure(sync, opts={"compare_type": True, "include_name": in_metadata})
            return list(compare_metadata(context, SQLModel.metadata))

        assert await conn.run_sync(diff) == []
    assert version == [_head_revision()]
    assert len(await inputs_by_message(db)) == 4


def _head_revision() -> str:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from core.store.database import MIGRATIONS_DIR

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    head = ScriptDirectory.from_config(cfg).get_current_head()
    assert head is not None
    return head


def test_the_head_read_from_the_files_is_alembics() -> None:
    """A migrated database starts without alembic when it is at the head read from the files' revision lines
    (core.store.database): that head must be alembic's, or a new migration would be skipped."""
    from core.store.database import _head_revision as files_head

    assert files_head() == _head_revision()


async def test_a_database_behind_the_head_is_still_migrated(tmp_path: Path) -> None:
    database = Database(f"sqlite:///{tmp_path}/behind.db")
    try:
        async with database._write_engine.begin() as conn:
            await conn.run_sync(_upgrade_to("0018"))
        await database.migrate()
        async with database.engine.connect() as conn:
            version = (await conn.execute(text("SELECT version_num FROM alembic_version"))).scalars().all()
        assert version == [_head_revision()] != ["0018"]
    finally:
        await database.close()


def test_the_head_is_read_from_the_files_alembic_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A migration file whose name begins with "_" is one alembic runs: the head read from the files must count it,
    or a database one revision behind would be taken as current and never migrated."""
    import shutil

    from core.store import database

    copy = tmp_path / "migrations"
    shutil.copytree(MIGRATIONS_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    head = _head_revision()
    (copy / "versions" / "_9999_extra.py").write_text(
        f'revision = "9999"\ndown_revision = "{head}"\n\n\ndef upgrade() -> None:\n    pass\n', encoding="utf-8")
    monkeypatch.setattr(database, "MIGRATIONS_DIR", copy)
    database._head_revision.cache_clear()
    try:
        assert database._head_revision() == "9999"
    finally:
        database._head_revision.cache_clear()
