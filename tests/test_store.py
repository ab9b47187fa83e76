"""The store: engine and migrations (core/store/database.py) and ConversationStore queries."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Connection, func, text
from sqlmodel import SQLModel, select

import core.store.tables  # noqa: F401  (populates SQLModel.metadata)
from core.errors import StoreError
from core.model import Inbound, MessageRef, SessionStatus, TurnStatus
from core.store import AcceptOutcome, ConversationStore, Database
from core.store.database import async_url
from core.store.tables import MessageRow, ProcessedEventRow, SessionRow, TurnRow

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    database = Database(f"sqlite:///{tmp_path}/x.db")
    await database.migrate()
    yield database
    await database.close()


@pytest.fixture
def store(db: Database) -> ConversationStore:
    return ConversationStore(db)


def inbound(session: str = "slack:C1:1.0", *, addressed: bool = True, key: str | None = None,
            delivery: str | None = None, text_: str = "hello", ts: str = "1.1") -> Inbound:
    return Inbound(session_id=session, channel="slack", sender="U1", text=text_, addressed=addressed,
                   reply_ref={"channel": "C1", "thread_ts": "1.0"}, ref=MessageRef("C1", ts),
                   idempotency_key=key, delivery_key=delivery)


async def accept(store: ConversationStore, msg: Inbound, now: datetime = T0) -> Any:
    return await store.accept(msg, agent="default", record_context=True, now=now)


async def count(db: Database, table: type[SQLModel]) -> int:
    async with db.read() as s:
        return int((await s.exec(select(func.count()).select_from(table))).one())



async def test_migrate_twice_is_a_noop(db: Database, store: ConversationStore) -> None:
    await accept(store, inbound(key="k1"))
    await db.migrate()
    async with db.engine.connect() as conn:
        version = (await conn.execute(text("SELECT version_num FROM alembic_version"))).scalars().all()
    assert version == ["0001"]
    assert await count(db, MessageRow) == 1


async def test_sqlite_pragmas(db: Database) -> None:
    async with db.engine.connect() as conn:
        assert (await conn.execute(text("PRAGMA journal_mode"))).scalar() == "wal"
        assert (await conn.execute(text("PRAGMA busy_timeout"))).scalar() == 10_000
        assert (await conn.execute(text("PRAGMA foreign_keys"))).scalar() == 1
        assert (await conn.execute(text("PRAGMA synchronous"))).scalar() == 1  # NORMAL


async def test_migrated_schema_matches_metadata(db: Database) -> None:
    def diff(conn: Connection) -> list[Any]:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        return list(compare_metadata(context, SQLModel.metadata))

    async with db.engine.connect() as conn:
        differences = await conn.run_sync(diff)
    assert differences == []


async def test_ping_and_display_url(db: Database) -> None:
    await db.ping()
    assert db.display_url.startswith("sqlite+aiosqlite:///") and db.is_sqlite
    postgres = Database("postgresql+asyncpg://user:s3cretpw@localhost/db")
    assert "s3cretpw" not in postgres.display_url and not postgres.is_sqlite


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("sqlite:///x.db", "sqlite+aiosqlite:///x.db"),
        ("sqlite+aiosqlite:///x.db", "sqlite+aiosqlite:///x.db"),
        ("postgresql://u:p@h/db", "postgresql+asyncpg://u:p@h/db"),
        ("postgresql+psycopg2://u:p@h/db", "postgresql+asyncpg://u:p@h/db"),
        ("postgresql+asyncpg://u:p@h/db", "postgresql+asyncpg://u:p@h/db"),
    ],
)
def test_async_url(url: str, expected: str) -> None:
    assert async_url(url) == expected


@pytest.mark.parametrize("url", ["mysql://u:p@h/db", "not a url"])
def test_async_url_rejects(url: str) -> None:
    with pytest.raises(StoreError):
        async_url(url)


async def test_migrate_failure_is_a_store_error(tmp_path: Path) -> None:
    (tmp_path / "junk.db").write_bytes(b"this is not an SQLite file" * 100)
    database = Database(f"sqlite:///{tmp_path}/junk.db")
    try:
        with pytest.raises(StoreError, match="could not open or migrate"):
            await database.migrate()
    finally:
        await database.close()



async def test_addressed_message_creates_session_and_queued_turn(db: Database, store: ConversationStore) -> None:
    result = await accept(store, inbound(key="m1", delivery="Ev1"))
    assert result.outcome is AcceptOutcome.QUEUED
    assert result.turn_id is not None
    session = await store.get_session("slack:C1:1.0")
    assert session is not None
    assert (session.channel, session.agent, session.status) == ("slack", "default", SessionStatus.IDLE)
    assert session.reply_ref == {"channel": "C1", "thread_ts": "1.0"}
    assert await store.count_turns(TurnStatus.QUEUED) == 1
    assert await store.sessions_with_live_turns() == ["slack:C1:1.0"]


async def test_same_delivery_key_is_duplicate(db: Database, store: ConversationStore) -> None:
    await accept(store, inbound(key="m1", delivery="Ev1"))
    again = await accept(store, inbound(key="m1", delivery="Ev1"))
    assert (again.outcome, again.turn_id) == (AcceptOutcome.DUPLICATE, None)
    assert (await count(db, MessageRow), await count(db, TurnRow)) == (1, 1)


async def test_same_idempotency_key_other_delivery_is_duplicate(db: Database, store: ConversationStore) -> None:
    await accept(store, inbound(key="m1", delivery="Ev1"))
    again = await accept(store, inbound(key="m1", delivery="Ev2"))
    assert again.outcome is AcceptOutcome.DUPLICATE
    assert (await count(db, MessageRow), await count(db, TurnRow)) == (1, 1)


async def test_unaddressed_message_without_session_ignored(db: Database, store: ConversationStore) -> None:
    result = await accept(store, inbound(addressed=False, key="m1", delivery="Ev1"))
    assert result.outcome is AcceptOutcome.IGNORED
    assert (await count(db, SessionRow), await count(db, MessageRow)) == (0, 0)


async def test_unaddressed_message_in_session_recorded(db: Database, store: ConversationStore) -> None:
    await accept(store, inbound(key="m1"))
    result = await accept(store, inbound(addressed=False, key="m2", ts="1.2"))
    assert result.outcome is AcceptOutcome.RECORDED
    assert (result.turn_id, await count(db, MessageRow), await count(db, TurnRow)) == (None, 2, 1)


async def test_unaddressed_context_off_ignored(db: Database, store: ConversationStore) -> None:
    await accept(store, inbound(key="m1"))
    result = await store.accept(inbound(addressed=False, key="m2"), agent="default", record_context=False, now=T0)
    assert result.outcome is AcceptOutcome.IGNORED
    assert await count(db, MessageRow) == 1


async def test_concurrent_writers_do_not_lock(db: Database, store: ConversationStore) -> None:
    results = await asyncio.gather(
        *(accept(store, inbound(f"slack:C1:{i}.0", key=f"m{i}", delivery=f"Ev{i}")) for i in range(20))
    )
    assert all(r.outcome is AcceptOutcome.QUEUED for r in results)
    assert len({r.turn_id for r in results}) == 20
    assert await count(db, TurnRow) == 20



async def test_start_next_turn_oldest_first(store: ConversationStore) -> None:
    first = await accept(store, inbound(key="m1", ts="1.1", text_="one"))
    second = await accept(store, inbound(key="m2", ts="1.2", text_="two"), now=T0 + timedelta(seconds=1))
    now = T0 + timedelta(seconds=5)
    a = await store.start_next_turn("slack:C1:1.0", now)
    b = await store.start_next_turn("slack:C1:1.0", now)
    assert a is not None and b is not None
    assert (a.id, b.id) == (first.turn_id, second.turn_id)
    assert a.inputs == (MessageRef("C1", "1.1"),)
    assert a.sender == "U1"
    assert await store.start_next_turn("slack:C1:1.0", now) is None
    assert await store.start_next_turn("unknown", now) is None
    assert await store.count_turns(TurnStatus.RUNNING) == 2
    session = await store.get_session("slack:C1:1.0")
    assert session is not None and session.status == SessionStatus.RUNNING


async def _running_turn(db: Database, store: ConversationStore, session: str, attempts: int) -> int:
    result = await accept(store, inbound(session, key=session))
    async with db.write() as s:
        turn = await s.get(TurnRow, result.turn_id)
        assert turn is not None
        turn.status, turn.attempts = TurnStatus.RUNNING, attempts
        s.add(turn)
    return int(result.turn_id)


async def test_requeue_interrupted(db: Database, store: ConversationStore) -> None:
    once = await _running_turn(db, store, "s:once", attempts=1)
    twice = await _running_turn(db, store, "s:twice", attempts=2)
    now = T0 + timedelta(minutes=1)
    failed = await store.requeue_interrupted(max_attempts=2, now=now)
    assert failed == [twice]
    async with db.read() as s:
        requeued, dead = await s.get(TurnRow, once), await s.get(TurnRow, twice)
    assert requeued is not None and requeued.status == TurnStatus.QUEUED
    assert dead is not None and (dead.status, dead.finished_at) == (TurnStatus.FAILED, now) and dead.error
    assert await store.sessions_with_live_turns() == ["s:once"]


async def test_requeue_interrupted_failure_updates_session(db: Database, store: ConversationStore) -> None:
    await accept(store, inbound("s:x", key="k"))
    await store.start_next_turn("s:x", T0)
    async with db.write() as s:
        turn = (await s.exec(select(TurnRow))).one()
        turn.attempts = 2
        s.add(turn)
    await store.requeue_interrupted(max_attempts=2, now=T0)
    session = await store.get_session("s:x")
    assert session is not None and session.status != SessionStatus.RUNNING


async def test_finish_turn_sets_session_status(store: ConversationStore) -> None:
    result = await accept(store, inbound(key="m1"))
    await store.start_next_turn("slack:C1:1.0", T0)
    await store.finish_turn(int(result.turn_id), status=TurnStatus.FAILED, answer=None, error="boom", now=T0)
    session = await store.get_session("slack:C1:1.0")
    assert session is not None and session.status == SessionStatus.FAILED
    assert await store.sessions_with_live_turns() == []


async def test_prune_deliveries(db: Database, store: ConversationStore) -> None:
    await accept(store, inbound("s:1", key="a", delivery="old"), now=T0)
    await accept(store, inbound("s:2", key="b", delivery="new"), now=T0 + timedelta(days=2))
    assert await store.prune_deliveries(T0 + timedelta(days=1)) == 1
    async with db.read() as s:
        keys = (await s.exec(select(ProcessedEventRow.key))).all()
    assert list(keys) == ["new"]
    # a pruned delivery id is no longer deduplicated at the delivery level
    assert (await accept(store, inbound("s:3", key="c", delivery="old"))).outcome is AcceptOutcome.QUEUED


async def test_new_session_without_idempotency_key(store: ConversationStore) -> None:
    result = await accept(store, inbound("s:nokey", key=None))
    assert result.outcome is AcceptOutcome.QUEUED
