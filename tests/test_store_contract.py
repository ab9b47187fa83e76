"""The storage contract: every store through one suite, run against SQLite and — when TEST_DATABASE_URL
is set — PostgreSQL (one contract, every backend, as aiogram tests its storages). A store passes here
on both, or the dialects have drifted apart."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Connection, func, text
from sqlalchemy import event as sqlalchemy_event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import StatementError
from sqlmodel import Session as SQLSession
from sqlmodel import SQLModel, select

import channels.slack.tables  # noqa: F401  (with core.store.tables: populates SQLModel.metadata)
import core.store.tables  # noqa: F401  (populates SQLModel.metadata)
from core.errors import InvalidInput, StoreError
from core.model import (
    DeliveryStatus,
    Inbound,
    InputKind,
    InputStatus,
    MessageRef,
    Outcome,
    SessionStatus,
    TurnStatus,
)
from core.store import (
    Accepted,
    AcceptOutcome,
    ApprovalStore,
    Budget,
    ControlStore,
    ConversationStore,
    CredentialStore,
    Database,
    HeldElsewhere,
    InputStore,
    LeaseStore,
    Taken,
    WebSessionStore,
    database,
)
from core.store import inputs as store_inputs
from core.store.database import async_url
from core.store.deliveries import DeliveryStore, OutboxClaim
from core.store.leases import GiveBack, LeaseClaim, LeaseTake
from core.store.memories import MemoryFull, MemoryStore, NewMemory, in_metadata  # in_metadata: search objects out
from core.store.schedules import ScheduleStore
from core.store.tables import (
    ApprovalRow,
    CredentialRequestRow,
    GrantRow,
    InputRow,
    LeaseRow,
    MessageRow,
    ProcessedEventRow,
    ScheduleRow,
    SecretGrantRow,
    SecretRow,
    SessionRow,
    TurnRow,
    WebSessionRow,
)
from tests.audit import audit_log

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
SID = "slack:T1:C1:1.0"
MSG, CTX, CMD = InputKind.MESSAGE, InputKind.CONTEXT, InputKind.CONTROL
FOLLOWUP, COLLECT = "followup", "collect"
ROOMY = Budget()
@pytest.fixture
def db(store_db: Database) -> Database:
    """A freshly migrated database of each backend (tests/conftest.py ``store_db``)."""
    return store_db


@pytest.fixture
def inputs(db: Database) -> InputStore:
    return InputStore(db)


@pytest.fixture
def convs(db: Database) -> ConversationStore:
    return ConversationStore(db)


def inbound(text_: str = "hello", *, session: str = SID, ts: str = "1.1", key: str | None = None,
            delivery: str | None = None, agent: str | None = None, images: tuple[str, ...] = (),
            sender: str = "U1", place: str | None = None) -> Inbound:
    return Inbound(session_id=session, channel="slack", sender=sender, text=text_, addressed=True,
                   reply_ref={"channel": "C1", "thread_ts": "1.0"}, ref=MessageRef("C1", ts),
                   idempotency_key=key, delivery_key=delivery, agent=agent, images=images, place=place)


async def send(inputs: InputStore, msg: Inbound, kind: str = MSG, *, refuse: str | None = None,
               max_waiting: int = 20, now: datetime = T0) -> Accepted:
    return await inputs.accept(msg, kind=kind, agent="default", refuse=refuse, max_waiting=max_waiting, now=now)


async def burst(inputs: InputStore, *texts: str, start: int = 1, session: str = SID) -> list[int]:
    """One input per text ("~" marks context, from U2) with ts 1.<n>, a second apart; returns their ids."""
    ids = []
    for n, body in enumerate(texts, start):
        kind, sender = (CTX, "U2") if body.startswith("~") else (MSG, "U1")
        msg = inbound(body.removeprefix("~"), ts=f"1.{n}", sender=sender, session=session)
        result = await send(inputs, msg, kind, now=T0 + timedelta(seconds=n))
        assert result.input_id is not None, result
        ids.append(result.input_id)
    return ids


async def take(inputs: InputStore, mode: str = COLLECT, budget: Budget = ROOMY, session: str = SID) -> Taken:
    taken = await inputs.take_batch(session, mode, budget, T0 + timedelta(minutes=1))
    assert taken is not None
    return taken


async def count(db: Database, table: type[SQLModel], *where: Any) -> int:
    async with db.read() as s:
        return int((await s.exec(select(func.count()).select_from(table).where(*where))).one())


async def status_of(db: Database, input_id: int) -> str:
    async with db.read() as s:
        row = await s.get(InputRow, input_id)
        assert row is not None
        return row.status


async def cancel_input(db: Database, input_id: int, note: str) -> int | None:
    """A caller leaving one input, as the rows record it (the product stops whole sessions and turns): the
    running turn's id when that turn has no message left uncancelled."""
    async with db.write() as s:
        row = await s.get(InputRow, input_id)
        if row is None or row.status not in (InputStatus.WAITING, InputStatus.TAKEN):
            return None
        was_waiting = row.status == InputStatus.WAITING
        row.status, row.note = InputStatus.CANCELLED, note
        s.add(row)
        turn_id = row.turn_id
        turn = await s.get(TurnRow, turn_id) if turn_id is not None and not was_waiting else None
        if turn is None or turn.status != TurnStatus.RUNNING:
            return None
    left = await count(db, InputRow, InputRow.turn_id == turn_id, InputRow.kind == InputKind.MESSAGE,
                       InputRow.status != InputStatus.CANCELLED)
    return turn_id if left == 0 else None


async def finish(convs: ConversationStore, turn_id: int, status: str, answer: str | None = None,
                 error: str | None = None) -> None:
    await convs.finish_turn(turn_id, status=status, answer=answer, error=error, now=T0 + timedelta(minutes=2))


# -- database ---------------------------------------------------------------------------------------


async def test_migrate_twice_is_a_noop(db: Database, inputs: InputStore) -> None:
    await send(inputs, inbound(key="k1"))
    await db.migrate()
    async with db.engine.connect() as conn:
        version = (await conn.execute(text("SELECT version_num FROM alembic_version"))).scalars().all()
    assert version == [_head_revision()]
    assert await count(db, InputRow) == 1


async def test_sqlite_pragmas(db: Database) -> None:
    if not db.is_sqlite:
        pytest.skip("SQLite's own settings")
    async with db.engine.connect() as conn:
        assert (await conn.execute(text("PRAGMA journal_mode"))).scalar() == "wal"
        assert (await conn.execute(text("PRAGMA busy_timeout"))).scalar() == 10_000
        assert (await conn.execute(text("PRAGMA foreign_keys"))).scalar() == 1
        assert (await conn.execute(text("PRAGMA synchronous"))).scalar() == 1  # NORMAL


async def test_migrated_schema_matches_metadata(db: Database) -> None:
    def diff(conn: Connection) -> list[Any]:
        context = MigrationContext.configure(conn, opts={"compare_type": True, "include_name": in_metadata})
        return list(compare_metadata(context, SQLModel.metadata))

    async with db.engine.connect() as conn:
        assert await conn.run_sync(diff) == []


async def test_ping_and_display_url(db: Database) -> None:
    await db.ping()
    driver = "sqlite+aiosqlite:///" if db.is_sqlite else "postgresql+asyncpg://"
    assert db.display_url.startswith(driver) and db.is_sqlite == (db.engine.dialect.name == "sqlite")
    postgres = Database("postgresql+asyncpg://user:s3cretpw@localhost/db")
    assert "s3cretpw" not in postgres.display_url and not postgres.is_sqlite


async def test_insert_speaks_the_dialect(db: Database) -> None:
    """The one place the dialects differ: an INSERT that says what a conflict does."""
    assert isinstance(db.insert(LeaseRow), sqlite.Insert if db.is_sqlite else postgresql.Insert)
    statement = db.insert(ProcessedEventRow).values(key="k", received_at=T0).on_conflict_do_nothing()
    async with db.write() as s:
        assert (await s.exec(statement)).rowcount == 1
    async with db.write() as s:
        assert (await s.exec(statement)).rowcount == 0
    assert await count(db, ProcessedEventRow) == 1


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


async def test_concurrent_writers_do_not_lock(db: Database, inputs: InputStore) -> None:
    results = await asyncio.gather(
        *(send(inputs, inbound(session=f"slack:T1:C1:{i}.0", key=f"m{i}", delivery=f"Ev{i}")) for i in range(20))
    )
    assert all(r.outcome is AcceptOutcome.QUEUED for r in results)
    assert len({r.input_id for r in results}) == 20
    assert (await count(db, InputRow), await count(db, SessionRow)) == (20, 20)


async def test_prune_deliveries(db: Database, inputs: InputStore) -> None:
    await send(inputs, inbound(session="s:1", key="a", delivery="old"), now=T0)
    await send(inputs, inbound(session="s:2", key="b", delivery="new"), now=T0 + timedelta(days=2))
    assert await inputs.prune_deliveries(T0 + timedelta(days=1)) == 1
    async with db.read() as s:
        assert list((await s.exec(select(ProcessedEventRow.key))).all()) == ["new"]
    # a pruned delivery id is no longer deduplicated at the delivery level
    assert (await send(inputs, inbound(session="s:3", key="c", delivery="old"))).outcome is AcceptOutcome.QUEUED


# -- arrival ----------------------------------------------------------------------------------------


async def test_message_waits_outside_the_transcript(db: Database, inputs: InputStore,
                                                   convs: ConversationStore) -> None:
    result = await send(inputs, inbound(key="m1", delivery="Ev1", place="slack:T1:C1"))
    assert result.outcome is AcceptOutcome.QUEUED and result.input_id is not None and result.note is None
    assert result.session is not None and result.session == await convs.get_session(SID)
    assert (result.session.channel, result.session.agent, result.session.status) == ("slack", "default", "idle")
    assert result.session.reply_ref == {"channel": "C1", "thread_ts": "1.0"}
    assert (await count(db, MessageRow), await status_of(db, result.input_id)) == (0, InputStatus.WAITING)
    assert await convs.sessions_with_work() == [SID] and await convs.has_live_work(SID)
    assert await inputs.outcome(result.input_id) is None
    assert await inputs.latest_live_session("slack:T1:C1") == SID


async def test_context_recorded_only_in_a_known_session(db: Database, inputs: InputStore,
                                                       convs: ConversationStore) -> None:
    assert (await send(inputs, inbound("fyi"), CTX)).outcome is AcceptOutcome.IGNORED
    assert (await count(db, SessionRow), await count(db, InputRow)) == (0, 0)
    await send(inputs, inbound("q"))
    await inputs.take_batch(SID, FOLLOWUP, Budget(), T0)
    recorded = await send(inputs, inbound("fyi", ts="1.2"), CTX)
    assert recorded.outcome is AcceptOutcome.RECORDED and recorded.input_id is not None
    assert await status_of(db, recorded.input_id) == InputStatus.WAITING
    assert await convs.sessions_with_work() == []  # context asks for nothing
    assert await inputs.take_batch(SID, COLLECT, Budget(), T0) is None


async def test_command_is_taken_at_once(db: Database, inputs: InputStore, convs: ConversationStore) -> None:
    result = await send(inputs, inbound("stop"), CMD, refuse="paused")  # commands pass a paused intake
    assert result.outcome is AcceptOutcome.COMMAND and result.input_id is not None
    assert await status_of(db, result.input_id) == InputStatus.TAKEN
    assert await inputs.outcome(result.input_id) == Outcome("answered", "done")
    assert not await convs.has_live_work(SID)


async def test_busy_refusal_at_max_waiting(db: Database, inputs: InputStore) -> None:
    for n in (1, 2):
        assert (await send(inputs, inbound(ts=f"1.{n}"), max_waiting=2)).outcome is AcceptOutcome.QUEUED
    assert (await send(inputs, inbound(ts="1.3"), CTX, max_waiting=2)).outcome is AcceptOutcome.RECORDED
    busy = await send(inputs, inbound(ts="1.4"), max_waiting=2)
    assert busy.outcome is AcceptOutcome.REFUSED and busy.note and "busy" in busy.note
    assert busy.input_id is not None and await status_of(db, busy.input_id) == InputStatus.REFUSED
    assert await inputs.outcome(busy.input_id) == Outcome("refused", busy.note)
    await inputs.take_batch(SID, FOLLOWUP, Budget(), T0)
    assert (await send(inputs, inbound(ts="1.5"), max_waiting=2)).outcome is AcceptOutcome.QUEUED


async def test_refused_input_is_kept_and_deduplicated(inputs: InputStore, convs: ConversationStore) -> None:
    refused = await send(inputs, inbound(key="k"), refuse="Intake is paused.")
    assert (refused.outcome, refused.note) == (AcceptOutcome.REFUSED, "Intake is paused.")
    assert refused.input_id is not None and not await convs.has_live_work(SID)
    assert await inputs.outcome(refused.input_id) == Outcome("refused", "Intake is paused.")
    again = await send(inputs, inbound(key="k"))
    assert (again.outcome, again.input_id) == (AcceptOutcome.DUPLICATE, refused.input_id)


async def test_same_delivery_or_idempotency_key_is_duplicate(db: Database, inputs: InputStore) -> None:
    first = await send(inputs, inbound(key="C1:1.1", delivery="Ev1"))
    redelivered = await send(inputs, inbound(key="other", delivery="Ev1"))
    assert (redelivered.outcome, redelivered.input_id, redelivered.session) == (AcceptOutcome.DUPLICATE, None, None)
    again = await send(inputs, inbound(key="C1:1.1", delivery="Ev2"))  # e.g. both message and app_mention
    assert (again.outcome, again.input_id, again.session) == (AcceptOutcome.DUPLICATE, first.input_id, first.session)
    other = await send(inputs, inbound(session="slack:T1:C1:2.0", key="C1:1.1", delivery="Ev3"))
    assert other.outcome is AcceptOutcome.QUEUED  # keys are per session
    assert await count(db, InputRow) == 2


async def test_one_delivery_arriving_many_times_at_once_is_taken_once(db: Database, inputs: InputStore) -> None:
    """The delivery claim is the dialect's INSERT .. ON CONFLICT DO NOTHING: racing copies (retries
    reaching several replicas) store one input, whichever session each one names."""
    results = await asyncio.gather(*(send(inputs, inbound(session=f"s:{i}", key=f"k{i}", delivery="EvSame"))
                                     for i in range(8)))
    assert sorted(r.outcome.value for r in results) == ["duplicate"] * 7 + ["queued"]
    assert (await count(db, InputRow), await count(db, ProcessedEventRow)) == (1, 1)


async def test_other_agent_is_invalid_input(db: Database, inputs: InputStore) -> None:
    created = await send(inputs, inbound(key="k1", agent="ops"))
    assert created.session is not None and created.session.agent == "ops"
    for msg in (inbound(key="k2", ts="1.2", agent="default"), inbound(key="k1", agent="default")):
        with pytest.raises(InvalidInput, match="ops"):
            await send(inputs, msg)
    assert (await send(inputs, inbound(key="k3", ts="1.3"))).outcome is AcceptOutcome.QUEUED  # no agent named
    assert await count(db, InputRow) == 2


async def test_naive_datetime_is_rejected(inputs: InputStore) -> None:
    with pytest.raises(StatementError, match="naive datetime"):
        await send(inputs, inbound(), now=datetime(2024, 5, 1, 12, 0))


# -- batches ----------------------------------------------------------------------------------------


async def test_followup_takes_one_message_with_the_context_before_it(inputs: InputStore) -> None:
    assert await inputs.take_batch(SID, FOLLOWUP, Budget(), T0) is None  # unknown session
    await burst(inputs, "first", "~a", "b", "~c", "d")
    assert (await take(inputs, FOLLOWUP)).text == "first"
    second = await take(inputs, FOLLOWUP)
    assert (second.text, second.refs) == ("a\n\nb", (MessageRef("C1", "1.2"), MessageRef("C1", "1.3")))
    assert second.turn.sender == "U1" and second.turn.inputs == second.refs  # who asked, not who chatted
    assert (await take(inputs, FOLLOWUP)).text == "c\n\nd"
    assert await inputs.take_batch(SID, FOLLOWUP, Budget(), T0) is None


async def test_collect_takes_everything_in_order_into_the_transcript(db: Database, inputs: InputStore,
                                                                     convs: ConversationStore) -> None:
    ids = await burst(inputs, "one", "~two", "three")
    taken = await take(inputs)
    assert (taken.text, taken.images) == ("one\n\ntwo\n\nthree", ())
    assert [m.content for m in await convs.transcript(SID, 10)] == ["one", "two", "three"]
    assert {(m.role, m.turn_id) for m in await convs.transcript(SID, 10)} == {("user", taken.turn.id)}
    assert [await status_of(db, i) for i in ids] == [InputStatus.TAKEN] * 3
    assert await convs.running_turn(SID) == taken.turn.id
    session = await convs.get_session(SID)
    assert session is not None and session.status == SessionStatus.RUNNING
    async with db.read() as s:
        assert list((await s.exec(select(InputRow.id).where(InputRow.turn_id == taken.turn.id))).all()) == ids


async def test_budget_closes_the_batch_and_the_next_input_leads(inputs: InputStore) -> None:
    await burst(inputs, "aaaa", "bbbb", "cccc")
    assert (await take(inputs, budget=Budget(chars=10))).text == "aaaa\n\nbbbb"  # 4 + 2 + 4 fits exactly
    assert (await take(inputs, budget=Budget(chars=10))).text == "cccc"


async def test_oversized_message_runs_alone(inputs: InputStore) -> None:
    await burst(inputs, "x" * 20, "y", "z")
    assert (await take(inputs, budget=Budget(chars=5))).text == "x" * 20
    assert (await take(inputs, budget=Budget(chars=5))).text == "y\n\nz"


async def test_image_budget(inputs: InputStore) -> None:
    for n, images in enumerate([("a",), ("b", "c"), ("d", "e", "f")], 1):
        await send(inputs, inbound(f"m{n}", ts=f"1.{n}", images=images))
    assert (await take(inputs, budget=Budget(images=3))).images == ("a", "b", "c")
    alone = await take(inputs, budget=Budget(images=2))
    assert (alone.text, alone.images) == ("m3", ("d", "e", "f"))


async def test_batch_always_holds_a_message(inputs: InputStore) -> None:
    await burst(inputs, "first", "~" + "c" * 8, "question")
    assert (await take(inputs, FOLLOWUP)).text == "first"
    assert "question" in (await take(inputs, budget=Budget(chars=10))).text


async def test_take_steered_hands_waiting_inputs_to_the_running_turn(db: Database, inputs: InputStore,
                                                                     convs: ConversationStore) -> None:
    await burst(inputs, "go")
    first = await take(inputs)
    assert await inputs.take_steered(first.turn.id, "steer", Budget(), T0) is None
    await burst(inputs, "also", "~fyi", "and", start=2)
    steered = await inputs.take_steered(first.turn.id, "steer", Budget(chars=12), T0)
    assert steered is not None and steered.turn.id == first.turn.id
    assert (steered.text, steered.refs) == ("also\n\nfyi", (MessageRef("C1", "1.2"), MessageRef("C1", "1.3")))
    assert len(steered.turn.inputs) == 3
    assert [m.content for m in await convs.transcript(SID, 10)] == ["go", "also", "fyi"]
    await convs.finish_turn(first.turn.id, status=TurnStatus.FINISHED, answer="ok", error=None, now=T0)
    assert await inputs.take_steered(first.turn.id, "steer", Budget(), T0) is None  # "and" waits for the next turn
    assert await count(db, InputRow, InputRow.status == InputStatus.WAITING) == 1


# -- cancellation and outcomes ----------------------------------------------------------------------


async def test_cancel_waiting_writes_nothing(db: Database, inputs: InputStore, convs: ConversationStore) -> None:
    ids = await burst(inputs, "one", "~fyi", "two")
    assert await inputs.cancel_waiting(SID, "stopped by U1") == [ids[0], ids[2]]
    assert await inputs.outcome(ids[0]) == Outcome("cancelled", "stopped by U1")
    assert await status_of(db, ids[1]) == InputStatus.WAITING  # context stays for the next turn
    assert not await convs.has_live_work(SID) and await convs.sessions_with_work() == []
    assert await inputs.take_batch(SID, COLLECT, Budget(), T0) is None
    assert await count(db, MessageRow) == 0


async def test_cancel_one_waiting_input(db: Database, inputs: InputStore) -> None:
    ids = await burst(inputs, "one", "two")
    assert await cancel_input(db, ids[0], "nevermind") is None
    assert await inputs.outcome(ids[0]) == Outcome("cancelled", "nevermind")
    assert (await take(inputs)).text == "two"
    assert await count(db, MessageRow) == 1


async def test_merged_turn_is_cancelled_when_every_caller_is(db: Database, inputs: InputStore,
                                                              convs: ConversationStore) -> None:
    ids = await burst(inputs, "one", "two")
    turn = (await take(inputs)).turn.id
    assert await cancel_input(db, ids[0], "stop") is None  # "two" still wants an answer
    assert await inputs.outcome(ids[0]) is None  # the turn still runs
    assert await cancel_input(db, ids[1], "stop") == turn
    assert await cancel_input(db, ids[1], "stop") is None  # already cancelled
    await finish(convs, turn, TurnStatus.CANCELLED, error="stopped")
    assert await inputs.outcome(ids[0]) == Outcome("cancelled", "stopped", turn)


async def test_cancelled_caller_of_an_answered_turn(db: Database, inputs: InputStore, convs: ConversationStore) -> None:
    # Once taken, an input shares its turn's outcome: the answer covered it even though its caller left.
    ids = await burst(inputs, "one", "two")
    turn = (await take(inputs)).turn.id
    await cancel_input(db, ids[0], "left")
    await finish(convs, turn, TurnStatus.FINISHED, answer="done!")
    assert await inputs.outcome(ids[0]) == Outcome("answered", "done!", turn)
    assert await inputs.outcome(ids[1]) == Outcome("answered", "done!", turn)


async def test_cancel_turn_inputs_and_failed_outcome(db: Database, inputs: InputStore,
                                                     convs: ConversationStore) -> None:
    ids = await burst(inputs, "one", "~fyi", "two")
    turn = (await take(inputs)).turn.id
    await inputs.cancel_turn_inputs(turn, "stop")
    assert [await status_of(db, i) for i in ids] == [InputStatus.CANCELLED, InputStatus.TAKEN, InputStatus.CANCELLED]
    await finish(convs, turn, TurnStatus.FAILED, error="boom")
    assert await inputs.outcome(ids[2]) == Outcome("failed", "boom", turn)
    assert await inputs.outcome(10_000) == Outcome("refused", "unknown input")


async def test_requester_and_note(inputs: InputStore, convs: ConversationStore) -> None:
    assert await inputs.requester(SID) is None
    first = await send(inputs, inbound("first", sender="U3"))
    await send(inputs, inbound("chat", ts="1.2", sender="U2"), CTX)
    await send(inputs, inbound("second", ts="1.3", sender="U1"))
    assert await inputs.requester(SID) == "U3"  # who sent the first waiting message
    turn = (await take(inputs)).turn.id
    await send(inputs, inbound("later", ts="1.9", sender="U4"))
    assert await inputs.requester(SID) == "U3"  # the live turn's
    await finish(convs, turn, TurnStatus.FINISHED, answer="ok")
    assert await inputs.requester(SID) == "U4"  # only messages waiting since: the first of them
    assert first.input_id is not None
    await inputs.note(first.input_id, "seen")
    async with inputs.db.read() as s:
        row = await s.get(InputRow, first.input_id)
    assert row is not None and row.note == "seen"


# -- turns and readers ------------------------------------------------------------------------------


async def test_requeue_and_resume_interrupted(db: Database, inputs: InputStore, convs: ConversationStore) -> None:
    turns = {}
    for sid in ("s:once", "s:twice"):
        await send(inputs, inbound(sid, session=sid))
        taken = await inputs.take_batch(sid, FOLLOWUP, Budget(), T0)
        assert taken is not None
        turns[sid] = taken.turn.id
    async with db.write() as s:
        row = await s.get(TurnRow, turns["s:twice"])
        assert row is not None
        row.attempts = 2
    assert sorted(await convs.running_sessions()) == ["s:once", "s:twice"]
    assert await convs.requeue_interrupted(max_attempts=2, now=T0) == [turns["s:twice"]]
    assert await count(db, TurnRow, TurnRow.status == TurnStatus.QUEUED) == 1
    assert await convs.running_turn("s:once") is None
    dead = await convs.get_session("s:twice")
    assert dead is not None and dead.status == SessionStatus.FAILED
    assert await convs.sessions_with_work() == ["s:once"] and not await convs.has_live_work("s:twice")
    resumed = await convs.resume_interrupted("s:once", T0)
    assert resumed is not None and resumed.id == turns["s:once"] and resumed.inputs == (MessageRef("C1", "1.1"),)
    assert await convs.resume_interrupted("s:once", T0) is None
    async with db.read() as s:
        again = await s.get(TurnRow, turns["s:once"])
    assert again is not None and (again.status, again.attempts) == (TurnStatus.RUNNING, 2)


async def test_requeue_only_the_named_sessions(inputs: InputStore, convs: ConversationStore) -> None:
    for sid in ("s:a", "s:b"):
        await send(inputs, inbound(sid, session=sid))
        await take(inputs, session=sid)
    assert await convs.requeue_interrupted(max_attempts=5, now=T0, sessions=[]) == []
    assert await convs.requeue_interrupted(max_attempts=5, now=T0, sessions=["s:a"]) == []
    assert (await convs.running_turn("s:a"), await convs.running_turn("s:b") is not None) == (None, True)


async def test_finish_turn_and_final_answer(inputs: InputStore, convs: ConversationStore) -> None:
    await burst(inputs, "q")
    turn = (await take(inputs)).turn.id
    await convs.add_message(SID, role="assistant", content="", turn_id=turn, now=T0,
                            tool_calls=[{"id": "c1", "name": "shell", "arguments": "{}"}])
    await convs.add_message(SID, role="tool", content="out", turn_id=turn, now=T0, tool_call_id="c1")
    assert await convs.final_answer(turn) is None
    await convs.add_message(SID, role="assistant", content="the answer", turn_id=turn, now=T0)
    assert await convs.final_answer(turn) == "the answer"
    assert [m.role for m in await convs.transcript(SID, 2)] == ["tool", "assistant"]
    await finish(convs, turn, TurnStatus.FINISHED, answer="the answer")
    session = await convs.get_session(SID)
    assert session is not None and session.status == SessionStatus.IDLE and await convs.running_turn(SID) is None
    info = await convs.turn_info(turn)
    assert info is not None and info.id == turn and await convs.turn_info(10_000) is None


async def test_text_never_stores_nul(inputs: InputStore, convs: ConversationStore) -> None:
    """PostgreSQL refuses NUL in text: what a model or endpoint says is cleaned before it is stored."""
    await burst(inputs, "q")
    turn = (await take(inputs)).turn.id
    await convs.add_message(SID, role="assistant", content="a\x00b", turn_id=turn, now=T0)
    await finish(convs, turn, TurnStatus.FAILED, answer="x\x00", error="endpoint said \x00")
    assert "\x00" not in (await convs.transcript(SID, 5))[-1].content
    info = await convs.turn_info(turn)
    assert info is not None
    async with convs.db.read() as s:
        row = await s.get(TurnRow, turn)
    assert row is not None and "\x00" not in (row.answer or "") + (row.error or "")


async def test_history_orders_messages_notices_then_queued(inputs: InputStore, convs: ConversationStore) -> None:
    await burst(inputs, "q1")
    turn = (await take(inputs)).turn.id  # written at T0 + 1 min
    await convs.add_message(SID, role="assistant", content="", turn_id=turn, now=T0 + timedelta(minutes=1),
                            tool_calls=[{"id": "c1", "name": "shell", "arguments": "{}"}])
    await convs.add_message(SID, role="tool", content="out", turn_id=turn, now=T0, tool_call_id="c1")
    await finish(convs, turn, TurnStatus.FAILED, error="the model is down")  # at T0 + 2 min
    await burst(inputs, "q2", start=2)
    entries = await convs.history(SID)
    assert [(e.role, e.content, e.queued) for e in entries] == [
        ("user", "q1", False), ("assistant", "", False), ("notice", "the model is down", False), ("user", "q2", True)]
    assert entries[1].tool_names == ("shell",)


async def test_list_sessions_titles(inputs: InputStore, convs: ConversationStore) -> None:
    await send(inputs, inbound("stop", session="s:a"), CMD)
    await send(inputs, inbound("first line\nsecond", session="s:a", ts="1.2"), now=T0 + timedelta(minutes=1))
    await send(inputs, inbound("y" * 100, session="s:b"))
    other = Inbound(session_id="web:1", channel="web", sender="u", text="hi", addressed=True)
    await send(inputs, other)
    listed = await convs.list_sessions("slack")
    assert [(s.id, s.title) for s in listed] == [("s:a", "first line"), ("s:b", "y" * 79 + "…")]
    assert [s.id for s in await convs.list_sessions("web")] == ["web:1"]


async def test_ensure_session_creates_once(db: Database, convs: ConversationStore) -> None:
    info = await _session(convs, "schedule:1:1", place="slack:dest:C2", preapproved=(("message_send", "C2"),))
    assert (info.channel, info.place, info.preapproved, info.reply_ref) == (
        "slack", "slack:dest:C2", (("message_send", "C2"),), {"channel": "C2"})
    await convs.ensure_session(info, T0 + timedelta(hours=1))  # already there: nothing changes
    assert await count(db, SessionRow) == 1 and await convs.get_session("schedule:1:1") == info


# -- control ----------------------------------------------------------------------------------------


async def test_intake_pause(db: Database) -> None:
    control = ControlStore(db)
    assert not await control.intake_paused()
    await control.set_intake_paused(True, T0)
    assert await control.intake_paused()
    await control.set_intake_paused(False, T0)
    assert (await control.intake_paused(), await control.get("intake_paused")) == (False, None)


async def test_control_put_replaces_and_none_deletes(db: Database) -> None:
    control = ControlStore(db)
    await control.put("k", "one", T0)
    await control.put("k", "two", T0)
    assert await control.get("k") == "two"
    await control.put("k", None, T0)
    await control.put("never-set", None, T0)
    assert (await control.get("k"), await control.get("never-set")) == (None, None)


async def test_queue_mode_session_then_place(db: Database, inputs: InputStore) -> None:
    control = ControlStore(db)
    assert await control.queue_mode(SID) is None  # unknown session
    await send(inputs, inbound(place="slack:T1:C1"))
    await send(inputs, inbound(session="s:elsewhere"))
    assert await control.queue_mode(SID) is None
    await control.set_place_queue_mode("slack:T1:C1", "collect", T0)
    assert (await control.queue_mode(SID), await control.queue_mode("s:elsewhere")) == ("collect", None)
    await control.set_session_queue_mode(SID, "followup", T0)
    assert await control.queue_mode(SID) == "followup"
    await control.set_session_queue_mode(SID, None, T0)
    await control.set_place_queue_mode("slack:T1:C1", "steer", T0)
    assert await control.queue_mode(SID) == "steer"
    await control.set_place_queue_mode("slack:T1:C1", None, T0)
    assert await control.queue_mode(SID) is None


async def test_a_new_conversation_is_stored_with_its_first_input(db: Database, inputs: InputStore) -> None:
    """On PostgreSQL one statement writes both (issue 39); the rows are the same on both backends."""
    accepted = await send(inputs, inbound("first", place="slack:T1:C1", agent="ops"))
    again = await send(inputs, inbound("second", ts="1.2"), now=T0 + timedelta(seconds=1))
    assert accepted.outcome is AcceptOutcome.QUEUED and accepted.session is not None
    assert (accepted.session.agent, accepted.session.place, accepted.session.reply_ref) == (
        "ops", "slack:T1:C1", {"channel": "C1", "thread_ts": "1.0"})
    async with db.read() as s:
        session = await s.get(SessionRow, SID)
        first = await s.get(InputRow, accepted.input_id)
    assert session is not None and (session.channel, session.agent, session.status, session.place,
                                    json.loads(session.reply_ref), session.created_at, session.updated_at,
                                    session.queue_mode, session.preapproved) == (
        "slack", "ops", "idle", "slack:T1:C1", {"channel": "C1", "thread_ts": "1.0"}, T0,
        T0 + timedelta(seconds=1), None, None)
    assert first is not None and (first.session_id, first.text, first.status, first.agent, first.sender,
                                  first.created_at) == (SID, "first", "waiting", "ops", "U1", T0)
    assert again.input_id is not None and again.input_id > (accepted.input_id or 0)


async def test_turn_start_reads_the_place_queue_mode_and_the_secrets_fingerprint_with_its_session(
        db: Database, inputs: InputStore) -> None:
    """The turn's start reads its session, the place's queue mode and the secrets' fingerprint in one statement
    (issue 39): the same mode as ControlStore's, the same fingerprint as CredentialStore's."""
    control, creds = ControlStore(db), CredentialStore(db)
    for n in (1, 2):
        await send(inputs, inbound(f"m{n}", ts=f"1.{n}", place="slack:T1:C1"))
    await send(inputs, inbound("other", session="s:elsewhere", ts="2.1"))
    await send(inputs, inbound("seen", ts="1.5", sender="U2", place="slack:T1:C1"), CTX)
    await send(inputs, inbound("status", ts="1.6", sender="U3", place="slack:T1:C1"), CMD)  # a control's never counts
    await control.set_place_queue_mode("slack:T1:C1", FOLLOWUP, T0)
    await creds.save_secret(secret_row(), seal=sealer("v1"), grant=None, by="U1", now=T0)
    taken = await inputs.take_batch(SID, COLLECT, ROOMY, T0, history=10)
    assert isinstance(taken, Taken) and taken.text == "m1"  # the place's followup, not the default collect
    assert taken.secrets == await creds.fingerprint()
    assert taken.turn.everyone == ("U1", "U2")  # the turn's sender first, then everyone else in the conversation
    assert [m.content for m in taken.transcript or ()] == ["m1"]
    async with db.read() as s:  # the input taken and its transcript message (one statement on PostgreSQL)
        row = (await s.exec(select(InputRow).where(InputRow.text == "m1"))).one()
        message = await s.get(MessageRow, row.message_id)
        turn = await s.get(TurnRow, taken.turn.id)
        session = await s.get(SessionRow, SID)
    assert (row.status, row.turn_id, row.taken_at) == ("taken", taken.turn.id, T0)
    assert message is not None and (message.session_id, message.role, message.content, message.sender,
                                    message.platform_channel, message.platform_ts, message.turn_id,
                                    message.created_at) == (SID, "user", "m1", "U1", "C1", "1.1", taken.turn.id, T0)
    assert taken.turn.asked == (message.id,)
    assert turn is not None and (turn.session_id, turn.agent, turn.status, turn.attempts, turn.started_at) == (
        SID, "default", "running", 1, T0)
    assert session is not None and session.status == "running"
    without_history = await inputs.take_batch("s:elsewhere", FOLLOWUP, ROOMY, T0)
    assert isinstance(without_history, Taken) and without_history.secrets is None  # asked for with history only
    await ConversationStore(db).finish_turn(taken.turn.id, status=TurnStatus.FINISHED, answer="a1", error=None,
                                            now=T0)
    await control.set_session_queue_mode(SID, COLLECT, T0)  # the conversation's own mode comes before the place's
    await send(inputs, inbound("m3", ts="1.3", place="slack:T1:C1"))
    again = await inputs.take_batch(SID, FOLLOWUP, ROOMY, T0)
    assert isinstance(again, Taken) and again.text == "m2\n\nseen\n\nm3"  # the context recorded between them too


# -- leases -----------------------------------------------------------------------------------------

TTL = timedelta(seconds=30)


async def test_lease_acquire_renew_steal_after_expiry_release(db: Database) -> None:
    leases = LeaseStore(db)
    assert await leases.acquire("session:a", "p1", TTL, T0)
    assert not await leases.acquire("session:a", "p2", TTL, T0 + timedelta(seconds=29))  # held, live
    assert await leases.acquire("session:a", "p1", TTL, T0 + timedelta(seconds=20))  # ours: extended to T0+50
    assert not await leases.acquire("session:a", "p2", TTL, T0 + timedelta(seconds=40))
    assert await leases.renew("session:a", "p1", TTL, T0 + timedelta(seconds=45))  # now to T0+75
    assert not await leases.renew("session:a", "p2", TTL, T0 + timedelta(seconds=45))  # not its lease
    assert await leases.live_holders(["session:a", "session:b"], T0 + timedelta(seconds=75)) == {"session:a"}
    assert await leases.live_holders(["session:a"], T0 + timedelta(seconds=76)) == set()
    # The holder stopped renewing: its lease runs out and another process takes it over.
    assert await leases.acquire("session:a", "p2", TTL, T0 + timedelta(seconds=76))
    assert not await leases.renew("session:a", "p1", TTL, T0 + timedelta(seconds=77))  # p1 lost it
    await leases.release("session:a", "p1")  # not p1's any more: nothing happens
    assert await leases.live_holders(["session:a"], T0 + timedelta(seconds=80)) == {"session:a"}
    await leases.release("session:a", "p2")
    assert await leases.live_holders(["session:a"], T0 + timedelta(seconds=80)) == set()
    assert await leases.acquire("session:a", "p3", TTL, T0 + timedelta(seconds=80))  # free again
    assert not await leases.renew("session:none", "p3", TTL, T0)
    assert await leases.live_holders([], T0) == set()


async def test_a_turn_starts_under_its_lease_in_one_transaction(db: Database, inputs: InputStore) -> None:
    """take_batch takes the session's lease first, in the same commit: held by another holder, nothing is
    taken (and it says whether messages wait); release_if_idle gives it back only when none waits."""
    leases = LeaseStore(db)
    name, mine, theirs = f"session:{SID}", LeaseClaim(f"session:{SID}", "p1", TTL), "p2"
    await burst(inputs, "one")
    assert await leases.acquire(name, theirs, TTL, T0)
    held = await inputs.take_batch(SID, FOLLOWUP, ROOMY, T0, lease=LeaseTake(leases, mine, T0))
    assert held == HeldElsewhere(waiting=True)
    assert await inputs.last_arrival(SID) is not None  # nothing was taken
    expired = T0 + TTL + timedelta(seconds=1)
    taken = await inputs.take_batch(SID, FOLLOWUP, ROOMY, expired, lease=LeaseTake(leases, mine, expired))
    assert isinstance(taken, Taken) and taken.text == "one"
    assert not await leases.acquire(name, theirs, TTL, expired)  # p1's now
    await burst(inputs, "two", start=5)
    assert not await leases.release_if_idle(name, "p1", SID)  # "two" waits: kept
    assert await leases.live_holders([name], expired) == {name}
    taken = await inputs.take_batch(SID, FOLLOWUP, ROOMY, expired)
    assert isinstance(taken, Taken) and taken.text == "two"
    assert await leases.release_if_idle(name, "p1", SID)
    assert await leases.live_holders([name], expired) == set()
    assert await leases.release_if_idle(name, "p1", SID)  # not held: nothing to give back
    assert await inputs.take_batch(SID, FOLLOWUP, ROOMY, expired, lease=LeaseTake(leases, mine, expired)) is None
    # The same through a plain callable (a statement of its own on either backend)
    assert await inputs.take_batch(SID, FOLLOWUP, ROOMY, expired,
                                   lease=lambda s: leases.acquire_in(s, mine, expired)) is None
    assert await inputs.take_batch("no-such-session", FOLLOWUP, ROOMY, expired,
                                   lease=LeaseTake(leases, LeaseClaim("session:no-such-session", "p1", TTL),
                                                   expired)) is None


async def test_the_lease_goes_and_stays_with_the_commits_that_start_and_end_a_turn(
        db: Database, inputs: InputStore, convs: ConversationStore) -> None:
    """Taken in take_batch's transaction and given back in finish_turn's (``then``): a transaction that rolls
    back takes its lease statement with it, either way."""
    leases = LeaseStore(db)
    name, mine = f"session:{SID}", LeaseClaim(f"session:{SID}", "p1", TTL)
    await burst(inputs, "one")

    def take_then_fail(s: Any) -> bool:
        leases.acquire_in(s, mine, T0)
        raise RuntimeError("the turn's start failed after the lease statement")

    with pytest.raises(RuntimeError):
        await inputs.take_batch(SID, FOLLOWUP, ROOMY, T0, lease=take_then_fail)
    assert await leases.live_holders([name], T0) == set()  # rolled back with it
    taken = await inputs.take_batch(SID, FOLLOWUP, ROOMY, T0, lease=lambda s: leases.acquire_in(s, mine, T0))
    assert isinstance(taken, Taken) and await leases.live_holders([name], T0) == {name}

    def release_then_fail(s: Any) -> None:
        assert leases.release_if_idle_in(s, name, "p1", SID)
        raise RuntimeError("the turn's end failed after the release statement")

    with pytest.raises(RuntimeError):
        await convs.finish_turn(taken.turn.id, status="finished", answer="a", error=None, now=T0,
                                then=release_then_fail)
    assert await leases.live_holders([name], T0) == {name}  # still held: the end did not commit
    released: list[bool] = []
    await convs.finish_turn(taken.turn.id, status="finished", answer="a", error=None, now=T0,
                            then=lambda s: released.append(leases.release_if_idle_in(s, name, "p1", SID)))
    assert released == [True] and await leases.live_holders([name], T0) == set()


async def test_a_turns_end_gives_its_lease_back_unless_a_message_waits(
        db: Database, inputs: InputStore, convs: ConversationStore) -> None:
    """finish_turn's ``give_back`` (on PostgreSQL inside the turn end's one statement, run alone when nothing else
    joins it): kept while a message waits, given back when none does, and a lease another holder has now is
    not given back (and not ours: nothing to hold). A turn end that rolls back keeps it."""
    leases = LeaseStore(db)
    name, mine = f"session:{SID}", LeaseClaim(f"session:{SID}", "p1", TTL)
    await burst(inputs, "one")
    taken = await inputs.take_batch(SID, FOLLOWUP, ROOMY, T0, lease=LeaseTake(leases, mine, T0))
    assert isinstance(taken, Taken)

    def fail(s: Any) -> None:
        raise RuntimeError("the turn's end failed after the release")

    back = GiveBack(name, "p1", SID)
    with pytest.raises(RuntimeError):
        await convs.finish_turn(taken.turn.id, status="finished", answer="a", error=None, now=T0, give_back=back,
                                then=fail, known=taken.turn)
    assert await leases.live_holders([name], T0) == {name}  # the end did not commit
    await burst(inputs, "two", start=5)
    back = GiveBack(name, "p1", SID)
    final = await convs.finish_turn(taken.turn.id, status="finished", answer="a", error=None, now=T0,
                                    give_back=back, known=taken.turn, answer_message=True)
    assert back.given_back is False and await leases.live_holders([name], T0) == {name}  # "two" waits: kept
    assert final.id == taken.turn.id and final.session.status == "idle"
    again = await inputs.take_batch(SID, FOLLOWUP, ROOMY, T0, lease=LeaseTake(leases, mine, T0))
    assert isinstance(again, Taken) and again.text == "two"
    back = GiveBack(name, "p1", SID)
    await convs.finish_turn(again.turn.id, status="finished", answer="b", error=None, now=T0, give_back=back,
                            known=again.turn, answer_message=True)
    assert back.given_back is True and await leases.live_holders([name], T0) == set()
    assert await leases.acquire(name, "p2", TTL, T0)
    back = GiveBack(name, "p1", SID)
    await convs.finish_turn(again.turn.id, status="finished", answer="b", error=None, now=T0, give_back=back)
    assert back.given_back is True and await leases.live_holders([name], T0) == {name}  # p2's, untouched
    assert [m.content for m in await convs.transcript(SID, 10)] == ["one", "a", "two", "b"]


@pytest.mark.parametrize("texts", [("one",), ("one", "two")], ids=["one input", "a batch"])
async def test_an_input_another_taker_took_meanwhile_is_never_taken_twice(
        db: Database, inputs: InputStore, texts: tuple[str, ...]) -> None:
    """PostgreSQL, two takers of one session's inputs (a replica whose lease ran out while it stalled, and the one
    that took over): both read the input as waiting; the second one's take waits on the first's row lock and,
    once the first committed, finds it taken. It takes nothing (no second turn, no second transcript message) and
    says another runs the session."""
    if db.is_sqlite:
        pytest.skip("SQLite's writes are one at a time: no two takers interleave")
    ids = await burst(inputs, *texts)
    other = Database(db.url)
    try:
        async with other.engine.connect() as first:
            transaction = await first.begin()
            # the first taker's turn start, left uncommitted: it holds the input's row
            taken_first = await first.run_sync(
                lambda conn: store_inputs.take_batch(SQLSession(bind=conn), SID, COLLECT, ROOMY, T0))
            assert isinstance(taken_first, Taken)
            second = asyncio.create_task(inputs.take_batch(SID, COLLECT, ROOMY, T0))
            await wait_for_a_lock(db)
            await transaction.commit()
        assert await second == HeldElsewhere(waiting=True)
    finally:
        await other.close()
    async with db.read() as s:
        turns = (await s.exec(select(TurnRow))).all()
        messages = (await s.exec(select(MessageRow))).all()
        rows = [await s.get(InputRow, input_id) for input_id in ids]
    assert [t.id for t in turns] == [taken_first.turn.id]
    assert [(m.content, m.turn_id) for m in messages] == [(text_, taken_first.turn.id) for text_ in texts]
    assert [(row.status, row.turn_id) for row in rows if row is not None] == [
        ("taken", taken_first.turn.id)] * len(texts)


async def test_a_mention_costs_postgresql_six_statements_from_arrival_to_the_turns_end(
        db: Database, inputs: InputStore, convs: ConversationStore) -> None:
    """Issue 39's hot path, counted: a mention that starts a conversation is stored by one statement, its turn starts
    with four (the head with the lease, the waiting inputs, the turn with its input taken, the transcript) and ends
    with one, the lease given back in it."""
    if db.is_sqlite:
        pytest.skip("SQLite runs the same writes as statements of their own")
    statements: list[str] = []
    sqlalchemy_event.listen(db.engine.sync_engine, "before_cursor_execute",
                            lambda _c, _cur, statement, *_: statements.append(statement.split()[0]))
    accepted = await send(inputs, inbound("one", delivery="ev1"))
    assert accepted.outcome == AcceptOutcome.QUEUED and len(statements) == 1
    leases = LeaseStore(db)
    taken = await inputs.take_batch(SID, FOLLOWUP, ROOMY, T0, history=10,
                                    lease=LeaseTake(leases, LeaseClaim(f"session:{SID}", "p1", TTL), T0))
    assert isinstance(taken, Taken) and len(statements) == 1 + 4
    back = GiveBack(f"session:{SID}", "p1", SID)
    await convs.finish_turn(taken.turn.id, status="finished", answer="a", error=None, now=T0, known=taken.turn,
                            answer_message=True, give_back=back)
    assert back.given_back is True and len(statements) == 1 + 4 + 1


async def wait_for_a_lock(db: Database) -> None:
    """Until some statement on the database waits for a row lock (PostgreSQL)."""
    for _ in range(1000):
        waiting = await db.run_read(lambda s: s.connection().exec_driver_sql(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
        ).scalar())
        if waiting:
            return
        await asyncio.sleep(0.005)
    raise AssertionError("nothing waited for the lock")


async def test_an_idle_connection_the_server_dropped_is_replaced_before_use(
        db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL: a pooled connection is pinged only after sitting idle (PING_IDLE_S); one the server
    dropped meanwhile (a restart, a proxy's idle cut) is replaced, and the work runs."""
    if db.is_sqlite:
        pytest.skip("SQLite has no server connections")
    pid = await db.run_read(lambda s: s.connection().exec_driver_sql("SELECT pg_backend_pid()").scalar())
    killer = Database(db.url)
    try:
        await killer.run_read(lambda s: s.connection().exec_driver_sql(f"SELECT pg_terminate_backend({pid})"))
    finally:
        await killer.close()
    monkeypatch.setattr(database, "PING_IDLE_S", 0.0)
    again = await db.run_read(lambda s: s.connection().exec_driver_sql("SELECT pg_backend_pid()").scalar())
    assert again != pid


async def test_lease_is_won_by_exactly_one_of_many_at_once(db: Database) -> None:
    """The lease insert is the dialect's INSERT .. ON CONFLICT DO UPDATE .. WHERE expired or ours."""
    leases = LeaseStore(db)
    won = await asyncio.gather(*(leases.acquire("scheduler", f"p{i}", TTL, T0) for i in range(8)))
    assert sum(won) == 1
    later = T0 + TTL + timedelta(seconds=1)  # the winner died: exactly one takes over
    taken = await asyncio.gather(*(leases.acquire("scheduler", f"q{i}", TTL, later) for i in range(8)))
    assert sum(taken) == 1
    async with db.read() as s:
        rows = (await s.exec(select(LeaseRow))).all()
    assert [(r.holder, r.expires_at) for r in rows] == [(f"q{taken.index(True)}", later + TTL)]


# -- schedules and firings --------------------------------------------------------------------------


def schedule_row(**values: Any) -> ScheduleRow:
    row: dict[str, Any] = dict(prompt="say hi", trigger=json.dumps({"every_seconds": 60}), destination="#ops",
                               destination_id="COPS", channel="slack", agent="default", creator="U1",
                               status="pending_destination", created_at=T0)
    return ScheduleRow(**(row | values))


async def test_schedule_add_get_all_and_status_transitions(db: Database) -> None:
    store = ScheduleStore(db)
    first, second = await store.add(schedule_row()), await store.add(schedule_row(prompt="other"))
    assert first.id is not None and second.id is not None and first.id < second.id
    got = await store.get(first.id)
    assert got is not None and (got.prompt, got.status, got.firings, got.failures) == (
        "say hi", "pending_destination", 0, 0)
    assert await store.get(10_000) is None
    assert await store.set_status(first.id, "active", only_from=("pending_destination",), approval_id=7, now=T0)
    assert not await store.set_status(first.id, "active", only_from=("pending_destination",), now=T0)  # once
    assert not await store.set_status(first.id, "paused", only_from=("pending_destination",), now=T0)  # not active
    assert await store.set_status(second.id, "cancelled", now=T0)  # without only_from: whatever it was
    got = await store.get(first.id)
    assert got is not None and (got.status, got.approval_id) == ("active", 7)
    assert [s.id for s in await store.all()] == [first.id, second.id]
    assert [s.id for s in await store.all(statuses=("active", "paused"))] == [first.id]
    assert not await store.set_status(10_000, "active", now=T0)


async def test_start_firing_numbers_firings_and_dedupes_a_slot(db: Database) -> None:
    store = ScheduleStore(db)
    schedule = await store.add(schedule_row(status="active"))
    assert schedule.id is not None
    first = await store.start_firing(schedule.id, T0, min_gap_s=30)
    assert first is not None and (first.n, first.session_id, first.status) == (1, f"schedule:{schedule.id}:1",
                                                                               "running")
    # A second firing for the same slot (APScheduler re-running it after a crash): refused.
    assert await store.start_firing(schedule.id, T0 + timedelta(seconds=29), min_gap_s=30) is None
    second = await store.start_firing(schedule.id, T0 + timedelta(seconds=60), min_gap_s=30)
    assert second is not None and second.n == 2
    assert await store.start_firing(10_000, T0, min_gap_s=30) is None
    got = await store.get(schedule.id)
    assert got is not None and (got.firings, got.last_fired_at) == (2, T0 + timedelta(seconds=60))
    assert sorted(f.n for f in await store.unfinished_firings()) == [1, 2]


async def test_start_firing_at_once_records_one(db: Database) -> None:
    store = ScheduleStore(db)
    schedule = await store.add(schedule_row(status="active"))
    assert schedule.id is not None
    started = await asyncio.gather(*(store.start_firing(schedule.id, T0, min_gap_s=30) for _ in range(5)))
    assert len([f for f in started if f is not None]) == 1
    assert len(await store.firings(schedule.id)) == 1


async def test_who_had_written_in_a_conversation_and_in_a_firing_of_a_schedule_asked_for_there(
    db: Database, inputs: InputStore
) -> None:
    # A firing's session holds only its creator's prompt: the people of the conversation its schedule was asked
    # for in are the ones recorded with it. No record (a schedule from before): not known, never "alone".
    store = ScheduleStore(db)
    await burst(inputs, "hi", "~seen by the model", "go")
    await send(inputs, inbound("stop", ts="1.9", sender="U3"), CMD)  # a control: its words reach no model
    assert await store.writers(SID) == ("U1", "U2")
    assert await store.writers(f"sub:{SID}:1") == ("U1", "U2")  # a sub-agent: its parent's conversation
    assert await store.writers("slack:T1:C1:9.9") == ()
    recorded = await store.add(schedule_row(origin_senders='["U1", "U2"]'))
    alone = await store.add(schedule_row(origin_senders='["U1"]'))
    legacy = await store.add(schedule_row())
    garbled = await store.add(schedule_row(origin_senders='{"U1": true}'))
    assert await store.writers(f"schedule:{recorded.id}:3") == ("U1", "U2")
    assert await store.writers(f"sub:schedule:{recorded.id}:3:1") == ("U1", "U2")
    assert await store.writers(f"schedule:{alone.id}:1") == ("U1",)
    for unknown in (f"schedule:{legacy.id}:1", f"schedule:{garbled.id}:1", "schedule:10000:1",
                    f"schedule:{10**30}:1"):
        assert await store.writers(unknown) is None, unknown


async def test_finish_firing_keeps_the_tally(db: Database) -> None:
    store = ScheduleStore(db)
    schedule = await store.add(schedule_row(status="active"))
    assert schedule.id is not None

    async def fire(n: int, *, error: str | None, retire: bool = False) -> ScheduleRow:
        firing = await store.start_firing(schedule.id or 0, T0 + timedelta(minutes=n), min_gap_s=30)
        assert firing is not None and firing.id is not None
        return await store.finish_firing(firing.id, ts=None if error else f"1.{n}", error=error,
                                         now=T0 + timedelta(minutes=n, seconds=5), retire=retire)

    assert (await fire(1, error=None)).failures == 0
    once = await fire(2, error="not_in_channel")
    assert (once.failures, once.last_outcome) == (1, "failed: not_in_channel")
    twice = await fire(3, error="channel_not_found\x00")
    assert (twice.failures, twice.last_outcome, twice.status) == (2, "failed: channel_not_found", "active")
    assert await store.unfinished_firings() == []
    posted = await fire(4, error=None)
    assert (posted.failures, posted.last_outcome) == (0, "posted (ts 1.4)")  # consecutive failures only
    history = await store.firings(schedule.id)
    assert [(f.n, f.status, f.ts, f.error) for f in history] == [
        (4, "posted", "1.4", None), (3, "failed", None, "channel_not_found"), (2, "failed", None, "not_in_channel"),
        (1, "posted", "1.1", None)]
    assert [f.n for f in await store.firings(schedule.id, limit=2)] == [4, 3]
    assert all(f.finished_at is not None for f in history)
    retired = await fire(5, error=None, retire=True)  # a one-shot ends with its firing
    assert (retired.status, retired.firings) == ("done", 5)


async def test_retiring_leaves_a_cancelled_schedule_cancelled(db: Database) -> None:
    store = ScheduleStore(db)
    schedule = await store.add(schedule_row(status="active"))
    assert schedule.id is not None
    firing = await store.start_firing(schedule.id, T0, min_gap_s=0)
    assert firing is not None and firing.id is not None
    await store.set_status(schedule.id, "cancelled", now=T0)
    finished = await store.finish_firing(firing.id, ts="1.1", error=None, now=T0, retire=True)
    assert finished.status == "cancelled"


async def test_firing_input_and_turn(db: Database, inputs: InputStore) -> None:
    store = ScheduleStore(db)
    session = "schedule:1:1"
    assert (await store.firing_input(session), await store.firing_turn(session)) == (None, None)
    [input_id] = await burst(inputs, "say hi", session=session)
    taken = await take(inputs, session=session)
    assert (await store.firing_input(session), await store.firing_turn(session)) == (input_id, taken.turn.id)


# -- approvals and grants ---------------------------------------------------------------------------

CALL = json.dumps({"command": "ls"})


async def _session(convs: ConversationStore, session_id: str, *, place: str | None = None,
                   preapproved: tuple[tuple[str, str], ...] = ()) -> Any:
    from core.model import SessionInfo

    info = SessionInfo(id=session_id, channel="slack", agent="default", status=SessionStatus.IDLE,
                       reply_ref={"channel": "C2"}, place=place, preapproved=preapproved)
    await convs.ensure_session(info, T0)
    return info


def approval_row(session_id: str = SID, **values: Any) -> ApprovalRow:
    row: dict[str, Any] = dict(session_id=session_id, tool_call_id="call-1", tool="shell_run",
                               arguments=json.dumps({"command": "ls"}), agent="default", place="slack:T1:C1",
                               requester="U1", risk="gated", status="pending", parked_at=T0,
                               expires_at=T0 + timedelta(minutes=15))
    return ApprovalRow(**(row | values))


async def _parked_in_a_turn(inputs: InputStore, approvals: ApprovalStore) -> tuple[int, int]:
    await burst(inputs, "run ls", "~me too")  # U1 asks, U2 chimes in
    turn = (await take(inputs)).turn.id
    info = await approvals.park(approval_row(turn_id=turn))
    return info.id, turn


async def test_park_waits_the_session_and_names_everyone_the_call_may_come_from(
    inputs: InputStore, convs: ConversationStore, db: Database
) -> None:
    approvals = ApprovalStore(db)
    request_id, _turn = await _parked_in_a_turn(inputs, approvals)
    info = await approvals.get(request_id)
    assert info is not None and (info.status, info.requester, info.other_senders) == ("pending", "U1", ("U2",))
    assert info.arguments == {"command": "ls"} and not info.settled and not info.started
    assert info.session.status == SessionStatus.PENDING_APPROVAL
    await _session(convs, "s:origin")
    filed = await approvals.park(approval_row("s:origin", turn_id=None, tool_call_id="schedule:1"))
    assert filed.session.status == SessionStatus.IDLE  # nothing waits on a schedule's destination approval
    assert await approvals.get(10_000) is None


async def test_settle_exactly_once_whoever_comes_first(inputs: InputStore, db: Database) -> None:
    approvals = ApprovalStore(db)
    request_id, _turn = await _parked_in_a_turn(inputs, approvals)
    attempts = [("approved", "U1"), ("denied", "U2"), ("approved", "UADMIN"), ("cancelled", None),
                ("expired", None), ("denied", "U1")]
    now = T0 + timedelta(minutes=1)
    results = await asyncio.gather(*(approvals.settle(request_id, status, by=by, reason=None, now=now)
                                     for status, by in attempts))
    assert sum(won for won, _ in results) == 1
    final = {info.status for _, info in results if info is not None}
    assert len(final) == 1 and final != {"pending"}
    audit = [a for a in await audit_log(approvals.db) if a.subject == f"approval:{request_id}"]
    assert [a.action for a in audit] == [f"approval.{final.pop()}"]
    info = await approvals.get(request_id)
    assert info is not None and info.session.status == SessionStatus.RUNNING  # the waiting turn goes on
    assert await approvals.settle(10_000, "approved", by="U1", reason=None, now=now) == (False, None)


async def test_a_decision_after_expiry_is_refused_and_expiry_still_settles(inputs: InputStore,
                                                                          db: Database) -> None:
    approvals = ApprovalStore(db)
    request_id, _turn = await _parked_in_a_turn(inputs, approvals)
    late = T0 + timedelta(minutes=15)  # expires_at itself: too late
    for status in ("approved", "denied"):
        won, info = await approvals.settle(request_id, status, by="U1", reason=None, now=late)
        assert not won and info is not None and info.status == "pending"
    won, info = await approvals.settle(request_id, "expired", by=None, reason=None, now=late)
    assert won and info is not None and (info.status, info.decided_by) == ("expired", None)
    won, info = await approvals.settle(request_id, "approved", by="U1", reason=None, now=T0)
    assert not won and info is not None and info.status == "expired"
    # Cancelling settles regardless of the time too (the turn was stopped).
    cancelled, _ = await approvals.settle((await approvals.park(approval_row(tool_call_id="c2"))).id, "cancelled",
                                          by=None, reason="the turn was stopped", now=late)
    assert cancelled


async def test_always_allow_grants_exactly_that_call_there(inputs: InputStore, db: Database) -> None:
    approvals = ApprovalStore(db)
    request_id, _turn = await _parked_in_a_turn(inputs, approvals)
    won, info = await approvals.settle(request_id, "approved", by="U1", reason=None, now=T0, grant_call=CALL)
    assert won and info is not None and info.always
    grant = await approvals.grant_for("default", "shell_run", "slack:T1:C1", CALL)
    assert grant is not None and (grant.call_text, grant.created_by, grant.arg_pattern) == (CALL, "U1", None)
    for agent, tool, place, call in [("ops", "shell_run", "slack:T1:C1", CALL),
                                     ("default", "http_request", "slack:T1:C1", CALL),
                                     ("default", "shell_run", "slack:T1:C9", CALL),
                                     ("default", "shell_run", None, CALL),
                                     ("default", "shell_run", "slack:T1:C1", json.dumps({"command": "l*"}))]:
        assert await approvals.grant_for(agent, tool, place, call) is None, (agent, tool, place, call)
    # A deny never grants, even with the call given.
    other = await approvals.park(approval_row(tool_call_id="c2"))
    _won, denied = await approvals.settle(other.id, "denied", by="U1", reason="no", now=T0, grant_call=CALL)
    assert denied is not None and not denied.always and len(await approvals.grants()) == 1


async def test_a_legacy_pattern_grant_covers_nothing(db: Database) -> None:
    approvals = ApprovalStore(db)
    async with db.write() as s:
        s.add(GrantRow(agent="default", tool="shell_run", place="slack:T1:C1", arg_pattern="*", call_text=None,
                       created_by="U1", created_at=T0))
    assert await approvals.grant_for("default", "shell_run", "slack:T1:C1", CALL) is None
    assert len(await approvals.grants()) == 1  # still listed, so an admin can revoke it


async def test_grants_listed_and_revoked_once(inputs: InputStore, db: Database) -> None:
    approvals = ApprovalStore(db)
    request_id, _turn = await _parked_in_a_turn(inputs, approvals)
    await approvals.settle(request_id, "approved", by="U1", reason=None, now=T0, grant_call=CALL)
    elsewhere = await approvals.park(approval_row(tool_call_id="c2", place="slack:T1:C9"))
    await approvals.settle(elsewhere.id, "approved", by="U1", reason=None, now=T0, grant_call=CALL)
    here, there = await approvals.grants()
    assert (here.place, there.place) == ("slack:T1:C1", "slack:T1:C9")
    assert [g.id for g in await approvals.grants(place="slack:T1:C9")] == [there.id]
    assert here.id is not None
    revokes = await asyncio.gather(*(approvals.revoke(here.id, by, T0) for by in ("UADMIN", "UOTHER")))
    assert sorted(revokes) == [False, True]
    assert await approvals.grant_for("default", "shell_run", "slack:T1:C1", CALL) is None
    assert [g.id for g in await approvals.grants()] == [there.id]
    revoked = [g for g in await approvals.grants(include_revoked=True) if g.id == here.id]
    assert revoked and revoked[0].revoked_at == T0 and revoked[0].revoked_by in ("UADMIN", "UOTHER")
    assert [a.action for a in await audit_log(approvals.db)].count("grant.revoked") == 1
    assert not await approvals.revoke(10_000, "UADMIN", T0)


async def test_approval_readers(inputs: InputStore, convs: ConversationStore, db: Database) -> None:
    approvals = ApprovalStore(db)
    first, _turn = await _parked_in_a_turn(inputs, approvals)
    await _session(convs, "s:asked-in-c9", place="slack:T1:C9")
    second = (await approvals.park(approval_row("s:asked-in-c9", tool_call_id="c2", place=None,
                                                expires_at=T0 + timedelta(minutes=1)))).id
    assert [r.id for r in await approvals.pending()] == [first, second]
    assert [r.id for r in await approvals.pending(due_before=T0 + timedelta(minutes=5))] == [second]
    assert [r.id for r in await approvals.pending(session_id=SID)] == [first]
    assert [r.id for r in await approvals.pending(place="slack:T1:C9")] == [second]  # asked in a session there
    assert [r.id for r in await approvals.pending(place="slack:T1:C1")] == [first]  # filed there
    again = (await approvals.park(approval_row(tool_call_id="call-1"))).id  # the same call, asked again
    found = await approvals.for_call(SID, "call-1")
    assert found is not None and found.id == again and await approvals.for_call(SID, "nope") is None
    assert [r.id for r in await approvals.recent(SID)] == [first, again]
    await approvals.mark_started(first, T0)
    await approvals.record_announcement(first, {"channel": "C1", "ts": "9.9"})
    info = await approvals.get(first)
    assert info is not None and info.started and info.announcement == {"channel": "C1", "ts": "9.9"}


# -- credentials ------------------------------------------------------------------------------------


def sealer(value: str) -> Callable[[SecretRow], None]:
    """Stands in for the vault: the ciphertext is bound to the row's id, as the real one is."""

    def seal(row: SecretRow) -> None:
        row.key_id, row.ciphertext, row.aad_version = "k1", f"sealed({row.id}):{value}", 2

    return seal


def secret_row(name: str = "github.token", scope: str = "agent", agent: str = "default", **values: Any) -> SecretRow:
    return SecretRow(name=name, scope=scope, agent=agent if scope == "agent" else "", key_id="", ciphertext="",
                     created_by="U1", created_at=T0, updated_at=T0, **values)


async def test_secrets_saved_replaced_and_used_by_whom_they_belong_to(db: Database) -> None:
    store = CredentialStore(db)
    before = await store.fingerprint()
    own = await store.save_secret(secret_row(), seal=sealer("v1"), grant=None, by="U1", now=T0)
    assert own.id is not None and own.ciphertext == f"sealed({own.id}):v1"
    assert await store.fingerprint() != before
    replaced = await store.save_secret(secret_row(hosts='["api.github.com"]'), seal=sealer("v2"), grant=None,
                                       by="U2", now=T0 + timedelta(hours=1))
    assert replaced.id == own.id and replaced.ciphertext == f"sealed({own.id}):v2"  # same row, sealed again
    stored = await store.stored("github.token", "agent", "default")
    assert stored is not None and (stored.created_by, stored.hosts) == ("U2", '["api.github.com"]')
    shared = await store.save_secret(secret_row("pg.password", "shared"), seal=sealer("pw"), grant="default",
                                     by="U1", now=T0)
    await store.save_secret(secret_row("ops.key", agent="ops"), seal=sealer("k"), grant=None, by="U1", now=T0)
    assert shared.id is not None and await store.grants_of(shared.id) == ["default"]
    assert [s.name for s in await store.usable("default")] == ["github.token", "pg.password"]
    assert [s.name for s in await store.usable("ops")] == ["ops.key"]  # not granted the shared one
    assert [s.name for s in await store.usable("default", "pg.password")] == ["pg.password"]
    assert len(await store.all_secrets()) == 3
    actions = [a.action for a in await audit_log(db)]
    assert actions.count("credential.stored") == 4 and all("v1" not in a.detail for a in
                                                          await audit_log(db) if a.detail)


async def test_secret_reseal_touch_and_delete(db: Database) -> None:
    store = CredentialStore(db)
    row = await store.save_secret(secret_row("pg.password", "shared"), seal=sealer("pw"), grant="default", by="U1",
                                  now=T0)
    assert row.id is not None
    before = await store.fingerprint()
    results = await asyncio.gather(*(store.reseal(row.id, expected_ciphertext=row.ciphertext, key_id="k2",
                                                  ciphertext=f"k2:{n}", aad_version=2, now=T0 + timedelta(days=1))
                                     for n in range(3)))
    assert sorted(results) == [False, False, True]  # only the one that read it replaces it
    assert await store.fingerprint() != before
    await store.touch([row.id], T0 + timedelta(days=2))
    await store.touch([], T0)
    stored = await store.stored("pg.password", "shared", "")
    assert stored is not None and (stored.key_id, stored.last_used_at) == ("k2", T0 + timedelta(days=2))
    assert await store.delete_secret("pg.password", by="UADMIN", now=T0) == 1
    assert await store.delete_secret("pg.password", by="UADMIN", now=T0) == 0
    assert await store.all_secrets() == [] and await count(db, SecretGrantRow) == 0


async def test_connection_and_slack_install_reseal_only_what_was_read(db: Database) -> None:
    """Key rotation re-seals other tables too: never over a newer value, nor over a refresh in flight."""
    from channels.slack.store import SlackInstallStore
    from channels.slack.tables import SlackInstallationRow
    from core.store.connection_tables import ConnectionRow
    from core.store.connections import ConnectionStore

    def sealed(row: Any) -> None:
        row.key_id, row.ciphertext = "k1", f"k1:{row.id}"

    connections = ConnectionStore(db)
    account, _ = await connections.connect(ConnectionRow(name="github", owner="U1", key_id="", ciphertext="",
                                                         scopes="null", connected_by="U1", created_at=T0,
                                                         updated_at=T0),
                                           seal=sealed, request_id=None, by="U1", now=T0, audit={})
    assert account.id is not None
    assert await connections.claim_refresh(account.id, expected_ciphertext="k1:1", now=T0,
                                           until=T0 + timedelta(days=30))
    assert not await connections.reseal(account.id, expected_ciphertext="k1:1", key_id="k2", ciphertext="k2:1",
                                        now=T0 + timedelta(seconds=10))  # a refresh holds it: its tokens win
    results = await asyncio.gather(*(connections.reseal(account.id, expected_ciphertext="k1:1", key_id="k2",
                                                        ciphertext=f"k2:{n}", now=T0 + timedelta(days=31))
                                     for n in range(3)))  # the claim ran out: one re-seal, the others lose
    assert sorted(results) == [False, False, True]
    stored = await connections.get("github", "U1")
    assert stored is not None and stored.key_id == "k2" and stored.ciphertext.startswith("k2:")

    installs = SlackInstallStore(db)
    install = await installs.save(SlackInstallationRow(team_id="T1", key_id="", ciphertext="", installed_at=T0,
                                                       updated_at=T0), seal=sealed, now=T0)
    assert install.id is not None
    assert not await installs.reseal(install.id, expected_ciphertext="stale", key_id="k2", ciphertext="k2:x")
    assert await installs.reseal(install.id, expected_ciphertext=install.ciphertext, key_id="k2", ciphertext="k2:x")
    found = await installs.find_team("T1")
    assert found is not None and (found.key_id, found.ciphertext) == ("k2", "k2:x")


def credential_request(session_id: str = SID, **values: Any) -> CredentialRequestRow:
    row: dict[str, Any] = dict(session_id=session_id, tool_call_id="call-1", name="github.token", reason="to push",
                               scope="agent", agent="default", requester="U1", status="pending", created_at=T0,
                               expires_at=T0 + timedelta(minutes=30))
    return CredentialRequestRow(**(row | values))


async def _credential_parked(inputs: InputStore, store: CredentialStore, **values: Any) -> int:
    if not await ConversationStore(store.db).get_session(SID):
        await burst(inputs, "I need a token")
    turn = await ConversationStore(store.db).running_turn(SID) or (await take(inputs)).turn.id
    info = await store.park(credential_request(turn_id=turn, **values))
    assert info.session.status == SessionStatus.WAITING_CREDENTIAL
    return info.id


async def test_a_credential_is_provided_once(inputs: InputStore, db: Database) -> None:
    store = CredentialStore(db)
    request_id = await _credential_parked(inputs, store)
    results = await asyncio.gather(*(store.provide(request_id, secret_row(), seal=sealer(f"v{n}"), by=f"U{n}",
                                                   now=T0 + timedelta(minutes=1)) for n in range(4)))
    outcomes = sorted(outcome for outcome, _ in results)
    assert outcomes == ["settled", "settled", "settled", "stored"]
    winner = next(n for n, (outcome, _) in enumerate(results) if outcome == "stored")
    stored = await store.stored("github.token", "agent", "default")
    assert stored is not None and stored.ciphertext.endswith(f":v{winner}")
    info = await store.get(request_id)
    assert info is not None and (info.status, info.provided_by) == ("provided", f"U{winner}")
    assert info.session.status == SessionStatus.RUNNING  # the parked turn goes on


async def test_a_late_or_existing_credential_is_refused(inputs: InputStore, db: Database) -> None:
    store = CredentialStore(db)
    late = await _credential_parked(inputs, store)
    outcome, info = await store.provide(late, secret_row(), seal=sealer("v"), by="U1", now=T0 + timedelta(hours=1))
    assert outcome == "expired" and info is not None and info.status == "expired"
    assert await store.all_secrets() == []
    await store.save_secret(secret_row(), seal=sealer("operator's"), grant=None, by="op", now=T0)
    exists = await _credential_parked(inputs, store, tool_call_id="call-2")
    outcome, info = await store.provide(exists, secret_row(), seal=sealer("v"), by="U1", now=T0)
    assert outcome == "exists" and info is not None and (info.status, info.provided_by) == ("cancelled", None)
    stored = await store.stored("github.token", "agent", "default")
    assert stored is not None and stored.ciphertext.endswith(":operator's")  # a request never replaces a value
    assert await store.provide(10_000, secret_row(), seal=sealer("v"), by="U1", now=T0) == ("settled", None)


async def test_credential_request_settles_once_and_readers(inputs: InputStore, db: Database) -> None:
    store = CredentialStore(db)
    first = await _credential_parked(inputs, store)
    second = await _credential_parked(inputs, store, tool_call_id="call-2", expires_at=T0 + timedelta(minutes=1))
    assert [r.id for r in await store.pending()] == [first, second]
    assert [r.id for r in await store.pending(due_before=T0 + timedelta(minutes=2))] == [second]
    assert [r.id for r in await store.pending(session_id="s:none")] == []
    results = await asyncio.gather(*(store.settle(second, status, T0) for status in ("expired", "cancelled")))
    assert sorted(won for won, _ in results) == [False, True]
    assert {info.status for _, info in results if info is not None} in ({"expired"}, {"cancelled"})
    assert await store.settle(10_000, "expired", T0) == (False, None)
    found = await store.for_call(SID, "call-2")
    assert found is not None and found.id == second and await store.for_call(SID, "nope") is None
    assert [r.id for r in await store.recent(SID)] == [first, second]
    await store.record_announcement(first, {"channel": "C1", "ts": "2.2"})
    info = await store.get(first)
    assert info is not None and info.announcement == {"channel": "C1", "ts": "2.2"} and await store.get(0) is None


async def test_a_one_time_link_burns_once(inputs: InputStore, db: Database) -> None:
    store = CredentialStore(db)
    request_id = await _credential_parked(inputs, store)
    await store.add_link("jti-1", request_id, T0 + timedelta(minutes=15))
    link = await store.link("jti-1")
    assert link is not None and (link.request_id, link.used_at) == (request_id, None)
    burns = await asyncio.gather(*(store.burn("jti-1", T0) for _ in range(3)))
    assert sorted(burns) == [False, False, True]
    assert await store.link("nope") is None and not await store.burn("nope", T0)


# -- web logins -------------------------------------------------------------------------------------


async def test_web_logins_store_only_a_digest_and_end(db: Database) -> None:
    logins = WebSessionStore(db)
    ttl = timedelta(hours=8)
    await logins.create("cookie-one", T0, ttl)
    await logins.create("cookie-two", T0, ttl)
    async with db.read() as s:
        digests = list((await s.exec(select(WebSessionRow.id_digest))).all())
    assert len(digests) == 2 and not any("cookie" in d for d in digests)
    assert await logins.is_active("cookie-one", T0 + timedelta(hours=7))
    assert not await logins.is_active("cookie-one", T0 + ttl)  # ran out
    assert not await logins.is_active("never-issued", T0)
    assert await logins.revoke("cookie-one", T0) and not await logins.revoke("cookie-one", T0)
    assert not await logins.is_active("cookie-one", T0)
    assert await logins.revoke_all("UADMIN", T0) == 1  # cookie-two was the only live one
    assert not await logins.is_active("cookie-two", T0)
    assert [a.action for a in await audit_log(db)] == ["web.logout_all"]
    await logins.create("cookie-three", T0 + timedelta(days=1), ttl)  # drops the rows past their expiry
    assert await count(db, WebSessionRow) == 1


# -- the answer outbox -----------------------------------------------------------------------------


async def _answered(inputs: InputStore, convs: ConversationStore, session: str, claim: OutboxClaim) -> int:
    await burst(inputs, "q", session=session)
    turn = (await take(inputs, session=session)).turn.id
    await convs.finish_turn(turn, status=TurnStatus.FINISHED, answer=f"answer in {session}", error=None, now=T0,
                            outbox=claim)
    return turn


async def test_a_turns_end_writes_its_answer_status_and_outbox_row_in_one_go(
    inputs: InputStore, convs: ConversationStore, db: Database
) -> None:
    """finish_turn's writes (one statement on PostgreSQL, several on SQLite: issue 39) leave the same rows: the
    answer in the transcript and the outbox only for a finished turn with an answer, the session idle or failed."""
    claim = OutboxClaim("p1", T0 + timedelta(seconds=30))
    ended = {}
    for session, status, answer, error in (("s:answered", TurnStatus.FINISHED, "the\x00 answer", None),
                                           ("s:silent", TurnStatus.FINISHED, None, None),
                                           ("s:failed", TurnStatus.FAILED, None, "model\x00 down")):
        await burst(inputs, "q", session=session)
        taken = await take(inputs, session=session)
        ended[session] = await convs.finish_turn(taken.turn.id, status=status, answer=answer, error=error,
                                                 now=T0 + timedelta(minutes=2), outbox=claim, answer_message=True)
        assert ended[session].input_ids == taken.turn.input_ids and ended[session].sender == "U1"
    assert [ended[s].session.status for s in ended] == [SessionStatus.IDLE, SessionStatus.IDLE, SessionStatus.FAILED]
    assert [e.content for e in await convs.history("s:answered")] == ["q", "the answer"]  # NUL never stored
    assert await count(db, MessageRow, MessageRow.role == "assistant") == 1  # the answered turn's only
    outbox = DeliveryStore(db)
    row = await outbox.get(ended["s:answered"].id)
    assert row is not None and (row.session_id, row.channel, row.status, row.attempts, row.claimed_by, row.told,
                                row.notice_tries) == ("s:answered", "slack", "pending", 1, "p1", False, 0)
    assert row.next_attempt_at == T0 + timedelta(seconds=30) and row.created_at == T0 + timedelta(minutes=2)
    assert await outbox.get(ended["s:silent"].id) is None and await outbox.get(ended["s:failed"].id) is None
    async with db.read() as s:
        failed = await s.get(TurnRow, ended["s:failed"].id)
        session = await s.get(SessionRow, "s:failed")
    assert failed is not None and (failed.status, failed.error, failed.answer) == ("failed", "model down", None)
    assert session is not None and session.updated_at == T0 + timedelta(minutes=2)


async def test_an_answer_enters_the_outbox_with_its_turn_and_is_claimed_by_one(
    inputs: InputStore, convs: ConversationStore, db: Database
) -> None:
    outbox = DeliveryStore(db)
    turn = await _answered(inputs, convs, SID, OutboxClaim("p1", T0 + timedelta(seconds=30)))
    row = await outbox.get(turn)
    assert row is not None and (row.status, row.claimed_by, row.attempts, row.channel) == ("pending", "p1", 1, "slack")
    assert await outbox.turn_state(turn) == ("finished", "slack") and await outbox.turn_state(10_000) is None
    assert await outbox.due(T0) == [] and await outbox.next_due() == T0 + timedelta(seconds=30)
    assert await outbox.claim(turn, "p2", T0, T0 + timedelta(seconds=60)) is None  # p1's first attempt runs
    # p1 died: its claim runs out, and exactly one of the others takes the row over.
    later = T0 + timedelta(seconds=31)
    assert await outbox.due(later) == [turn]
    claims = await asyncio.gather(*(outbox.claim(turn, f"q{n}", later, later + timedelta(seconds=30))
                                    for n in range(5)))
    [won] = [c for c in claims if c is not None]
    assert (won.text, won.session.id, won.row.attempts) == (f"answer in {SID}", SID, 2)
    assert won.row.claimed_by in {f"q{n}" for n in range(5)}
    assert not await outbox.retry_later(turn, "ratelimited", later, holder="someone-else", attempt=2)  # not its claim
    assert await outbox.due(later) == []
    assert await outbox.retry_later(turn, "ratelimited", later + timedelta(seconds=5), holder=won.row.claimed_by or "",
                                    attempt=2)
    row = await outbox.get(turn)
    assert row is not None and (row.claimed_by, row.last_error) == (None, "ratelimited")
    assert await outbox.due(later + timedelta(seconds=5)) == [turn]


async def test_an_answer_is_delivered_or_given_up_once(inputs: InputStore, convs: ConversationStore,
                                                       db: Database) -> None:
    outbox = DeliveryStore(db)
    claim = OutboxClaim("p1", T0)
    posted, lost = await _answered(inputs, convs, "s:posted", claim), await _answered(inputs, convs, "s:lost", claim)
    held: dict[str, Any] = {"holder": "p1", "attempt": 1}
    settles = await asyncio.gather(outbox.delivered(posted, "1.1", T0, **held),
                                   outbox.delivered(posted, "1.2", T0, **held),
                                   outbox.give_up(posted, "too old", T0, **held))
    assert sorted(settles) == [False, False, True]
    row = await outbox.get(posted)
    assert row is not None and row.status in ("delivered", "given_up") and row.claimed_by is None
    async with db.read() as s:
        turn = await s.get(TurnRow, posted)
    assert turn is not None and (turn.delivered_ref is None) == (row.status == "given_up")
    assert row.status == "given_up" or row.ref == turn.delivered_ref in ("1.1", "1.2")  # where it landed, both rows
    assert await outbox.give_up(lost, "channel_not_found", T0, **held)
    assert not await outbox.delivered(lost, "9.9", T0, **held)
    assert lost in await outbox.untold("slack", T0) and await outbox.untold("web", T0) == []
    tellings = await asyncio.gather(*(outbox.take_telling(lost, f"p{n}", T0, T0 + timedelta(seconds=30))
                                      for n in range(3)))
    assert len([t for t in tellings if t is not None]) == 1
    assert lost not in await outbox.untold("slack", T0)
    assert await outbox.count(DeliveryStatus.GIVEN_UP) == 1 + (row.status == "given_up")
    assert await outbox.count(DeliveryStatus.GIVEN_UP, since=T0 + timedelta(days=1)) == 0
    assert await outbox.count(DeliveryStatus.PENDING) == 0 and await outbox.next_due() is None


async def test_claims_of_a_dead_process_are_released_at_start(inputs: InputStore, convs: ConversationStore,
                                                              db: Database) -> None:
    outbox = DeliveryStore(db)
    turn = await _answered(inputs, convs, SID, OutboxClaim("dead", T0 + timedelta(hours=1)))
    ours = await _answered(inputs, convs, "s:ours", OutboxClaim("me", T0 + timedelta(hours=1)))
    assert await outbox.release_claims(T0, keep="me") == 1
    assert await outbox.due(T0) == [turn]
    assert await outbox.release_claims(T0, keep="me") == 0
    row = await outbox.get(ours)  # this process's own claim (a resumed turn's first attempt) stays
    assert row is not None and (row.claimed_by, row.next_attempt_at) == ("me", T0 + timedelta(hours=1))


async def test_only_the_holder_of_an_attempts_claim_keeps_it_or_records_its_result(
    inputs: InputStore, convs: ConversationStore, db: Database
) -> None:
    outbox = DeliveryStore(db)
    turn = await _answered(inputs, convs, SID, OutboxClaim("p1", T0 + timedelta(seconds=30)))
    later = T0 + timedelta(seconds=50)
    assert await outbox.extend_claim(turn, holder="p2", attempt=1, valid_after=T0, until=later) is None
    assert await outbox.extend_claim(turn, holder="p1", attempt=2, valid_after=T0, until=later) is None
    # The first attempt starts late: its claim ends too soon to start one.
    assert await outbox.extend_claim(turn, holder="p1", attempt=1, valid_after=T0 + timedelta(seconds=30),
                                     until=later) is None
    kept = await outbox.extend_claim(turn, holder="p1", attempt=1, valid_after=T0 + timedelta(seconds=20), until=later)
    assert kept is not None and kept.next_attempt_at == later and await outbox.due(later - timedelta(seconds=1)) == []
    # It ran out; the same process's retry loop took the row over: the first attempt's claim is gone.
    assert await outbox.claim(turn, "p1", later, later + timedelta(seconds=30)) is not None
    assert await outbox.extend_claim(turn, holder="p1", attempt=1, valid_after=T0, until=later) is None
    assert not await outbox.delivered(turn, "1.1", later, holder="p1", attempt=1)
    assert not await outbox.give_up(turn, "gone", later, holder="p1", attempt=1)
    assert not await outbox.retry_later(turn, "503", later, holder="p1", attempt=1)
    assert not await outbox.delivered(turn, "1.1", later, holder="p2", attempt=2)
    row = await outbox.get(turn)
    assert row is not None and (row.status, row.claimed_by, row.attempts, row.ref) == ("pending", "p1", 2, None)
    assert await outbox.delivered(turn, "1.2", later, holder="p1", attempt=2)
    row = await outbox.get(turn)
    assert row is not None and (row.status, row.ref, row.claimed_by) == ("delivered", "1.2", None)


async def test_a_thread_counts_as_told_only_once_its_notice_was_taken(
    inputs: InputStore, convs: ConversationStore, db: Database
) -> None:
    from core.store.deliveries import NOTICE_TRIES

    outbox = DeliveryStore(db)
    lost = await _answered(inputs, convs, SID, OutboxClaim("p1", T0))
    assert await outbox.untold("slack", T0) == []  # pending: nothing to tell
    assert await outbox.take_telling(lost, "p1", T0, T0 + timedelta(seconds=30)) is None
    assert await outbox.give_up(lost, "channel_not_found", T0, holder="p1", attempt=1)
    at = T0
    for n in range(NOTICE_TRIES):
        telling = await outbox.take_telling(lost, "p1", at, at + timedelta(seconds=30))
        assert telling is not None and telling.session.id == SID and telling.row.notice_tries == n + 1
        assert await outbox.take_telling(lost, "p2", at, at + timedelta(seconds=30)) is None  # p1 is telling
        assert not await outbox.tell_later(lost, "p2", at) and not await outbox.told(lost, "p2")
        if n == 0:  # p1 died mid-notice: its claim runs out, and the thread may be told again
            at += timedelta(seconds=31)
            assert await outbox.untold("slack", at) == [lost]
            continue
        assert await outbox.tell_later(lost, "p1", at + timedelta(seconds=5))  # not taken: later
        assert await outbox.untold("slack", at) == []
        at += timedelta(seconds=5)
        assert await outbox.untold("slack", at) == ([lost] if n + 1 < NOTICE_TRIES else [])
    # No tries left: a channel that is gone never takes one.
    assert await outbox.untold("slack", at + timedelta(days=1)) == []
    row = await outbox.get(lost)
    assert row is not None and not row.told
    other = await _answered(inputs, convs, "s:other", OutboxClaim("p1", T0))
    assert await outbox.give_up(other, "ratelimited", T0, holder="p1", attempt=1)
    assert await outbox.take_telling(other, "p1", T0, T0 + timedelta(seconds=30)) is not None
    assert await outbox.told(other, "p1") and not await outbox.told(other, "p1")
    assert await outbox.untold("slack", T0 + timedelta(days=1)) == []
    row = await outbox.get(other)
    assert row is not None and row.told and row.claimed_by is None


async def test_the_install_id_is_made_once_per_database(db: Database) -> None:
    ids = await asyncio.gather(*(DeliveryStore(db).install_id(T0) for _ in range(4)))
    assert len(set(ids)) == 1 and len(ids[0]) >= 16
    assert await DeliveryStore(db).install_id(T0 + timedelta(days=1)) == ids[0]


def _head_revision() -> str:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from core.store.database import MIGRATIONS_DIR

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    head = ScriptDirectory.from_config(cfg).get_current_head()
    assert head is not None
    return head


async def test_quorum_votes_count_distinct_approvers_and_settle_once(inputs: InputStore, db: Database) -> None:
    """Many approvers voting at once (on any replica): their votes are counted one after another on the locked
    row, so the one that reaches the quorum settles it, exactly once; later votes are not counted."""
    approvals = ApprovalStore(db)
    await burst(inputs, "run ls")
    turn = (await take(inputs)).turn.id
    info = await approvals.park(approval_row(turn_id=turn, quorum=2, approvers=json.dumps(["U1", "U2", "U3"])))
    assert (info.quorum, info.approvers, info.approved_by) == (2, ("U1", "U2", "U3"), ())
    now = T0 + timedelta(seconds=1)
    results = await asyncio.gather(*(approvals.vote(info.id, f"U{i}", "approve", reason=None, now=now)
                                     for i in range(1, 9)))
    assert sum(counted for counted, _won, _ in results) == 2 and sum(won for _c, won, _ in results) == 1
    settled = await approvals.get(info.id)
    assert settled is not None and settled.status == "approved" and len(settled.approved_by) == 2
    # A restart between votes loses none: what was counted is in the database.
    again = ApprovalStore(Database(db.url))
    try:
        reread = await again.get(info.id)
        assert reread is not None and reread.approved_by == settled.approved_by
    finally:
        await again.db.close()


async def test_a_second_vote_is_one_vote_a_deny_settles_and_a_late_vote_counts_nothing(
        inputs: InputStore, db: Database) -> None:
    approvals = ApprovalStore(db)
    await burst(inputs, "run ls")
    turn = (await take(inputs)).turn.id
    first = await approvals.park(approval_row(turn_id=turn, quorum=2, tool_call_id="c1"))
    now = T0 + timedelta(seconds=1)
    twice = await asyncio.gather(*(approvals.vote(first.id, "U1", "approve", reason=None, now=now) for _ in range(4)))
    assert sum(counted for counted, _w, _r in twice) == 1
    counted, won, denied = await approvals.vote(first.id, "U2", "deny", reason="no", now=now)
    assert counted and won and denied is not None and (denied.status, denied.reason) == ("denied", "no")
    second = await approvals.park(approval_row(turn_id=turn, quorum=2, tool_call_id="c2"))
    late = second.expires_at + timedelta(seconds=1)
    counted, won, current = await approvals.vote(second.id, "U1", "approve", reason=None, now=late)
    assert (counted, won) == (False, False) and current is not None and current.status == "pending"
    audit = [row.action for row in await audit_log(approvals.db)]
    assert audit.count("approval.vote.approve") == 1 and "approval.vote.deny" in audit and "approval.denied" in audit


# -- memories (SPEC §17) -----------------------------------------------------------------------------------


def memory(text_: str, *, agent: str = "default", pinned: bool = False) -> NewMemory:
    return NewMemory(agent=agent, text=text_, pinned=pinned, written_by="U1", session_id=SID)


async def test_memories_are_found_by_words_on_both_backends_and_a_query_cannot_speak_search_syntax(
        db: Database) -> None:
    store = MemoryStore(db)
    deploy = (await store.add(memory("Staging deploys need the blue-green flag"), max_items=10, now=T0,
                              actor="U1")).memory
    odd = (await store.add(memory('Quote " star * NEAR(a b) - :x !y & | ( ) Ünïcode café'), max_items=10,
                           now=T0 + timedelta(seconds=1), actor="U1")).memory
    await store.add(memory("deploy notes of another agent", agent="other"), max_items=10, now=T0, actor="U1")
    found = {q: [m.id for m in await store.search("default", q, limit=5)] for q in (
        "deploy", "STAGING", "blue-green", "flag staging", 'deploy" OR *', "NEAR(", "-staging", "x:*", "!y &",
        "(", '"', "*", "AND OR NOT", "ÜNÏCODE", "Café", "cafe", "nothing-like-it")}
    assert found["deploy"] == found["STAGING"] == found["blue-green"] == found["-staging"] == [deploy.id]
    assert found["flag staging"] == found['deploy" OR *'] == [deploy.id]  # any word; a word's beginning too
    assert found["NEAR("] == found["x:*"] == found["!y &"] == found["ÜNÏCODE"] == found["Café"] == [odd.id]
    assert found["nothing-like-it"] == found["AND OR NOT"] == found["cafe"] == []  # case folds, accents stay
    assert found["("] == found['"'] == found["*"] == [odd.id, deploy.id]  # no words: the newest
    assert [m.text for m in await store.search("other", "deploy", limit=5)] == ["deploy notes of another agent"]
    assert (await store.get(deploy.id)) == deploy and deploy.created_at == T0 and deploy.written_by == "U1"


async def test_memories_past_the_limit_push_out_the_oldest_unpinned_and_ids_are_never_reused(db: Database) -> None:
    store = MemoryStore(db)
    first = (await store.add(memory("one", pinned=True), max_items=3, now=T0, actor="U1")).memory
    two = (await store.add(memory("two"), max_items=3, now=T0, actor="U1")).memory
    three = (await store.add(memory("three"), max_items=3, now=T0, actor="U1")).memory
    four = await store.add(memory("four"), max_items=3, now=T0, actor="U1")
    assert four.created and four.evicted == (two.id,) and await store.count("default") == 3
    assert [m.text for m in await store.search("default", "two", limit=5)] == []  # its words went with it
    again = await store.add(memory("three", pinned=True), max_items=3, now=T0, actor="U2")  # the same text: pinned
    assert (again.created, again.memory.id, again.memory.pinned) == (False, three.id, True)
    assert [m.id for m in await store.pinned("default", limit=10)] == [three.id, first.id]  # newest first
    assert (await store.add(memory("five"), max_items=3, now=T0, actor="U1")).evicted == (four.memory.id,)
    await store.add(memory("five", pinned=True), max_items=3, now=T0, actor="U1")
    with pytest.raises(MemoryFull, match="all pinned"):  # all pinned, and full
        await store.add(memory("six"), max_items=3, now=T0, actor="U1")
    assert await store.forget(first.id, agent="other", now=T0, actor="U1") is None  # another agent's id: nothing
    forgotten = await store.forget(first.id, agent="default", now=T0, actor="U1")
    assert forgotten is not None and forgotten.text == "one" and await store.get(first.id) is None
    six = (await store.add(memory("six"), max_items=3, now=T0, actor="U1")).memory
    assert six.id > max(first.id, three.id, four.memory.id)  # a forgotten id is never given again
    assert [m.text for m in await store.search("default", "one", limit=5)] == []
    actions = [row.action for row in await audit_log(db)]
    assert actions.count("memory.evicted") == 2 and "memory.forgotten" in actions and "memory.pinned" in actions


async def test_memories_added_at_once_keep_the_limit(db: Database) -> None:
    """Several writers at once (replicas on PostgreSQL) never leave an agent above its limit."""
    store = MemoryStore(db)
    await asyncio.gather(*(store.add(memory(f"note {i}"), max_items=5, now=T0, actor="U1") for i in range(12)))
    assert await store.count("default") == 5
    assert len(await store.search("default", "note", limit=50)) == 5  # the index holds the survivors only


async def test_sub_agents_of_one_turn_started_at_once_get_a_number_each(db: Database, inputs: InputStore) -> None:
    """Two delegate calls of one model step open their sub-agent sessions at once: on PostgreSQL both read the
    numbers taken before either committed, and the second failed on the first's id (a sub-agent never started)."""
    from core.store.subagents import SubAgentStore

    await send(inputs, inbound())  # the parent conversation
    store = SubAgentStore(db)
    opened = await asyncio.gather(*(
        store.open(SID, parent_turn=1, call_id=f"call_{n}", agent="helper", task=f"task {n}", sender="U1",
                   place=None, channel="subagent", now=T0) for n in range(4)))
    assert sorted(t.session.id for t in opened) == [f"sub:{SID}:{n}" for n in range(1, 5)]
