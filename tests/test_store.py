"""The store: engine and migrations (database.py), intake (inputs.py), turns (conversations.py), control."""

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
from sqlalchemy.exc import StatementError
from sqlmodel import SQLModel, select

import core.store.tables  # noqa: F401  (populates SQLModel.metadata)
from core.errors import InvalidInput, StoreError
from core.model import Inbound, InputKind, InputStatus, MessageRef, Outcome, SessionStatus, TurnStatus
from core.store import Accepted, AcceptOutcome, Budget, ControlStore, ConversationStore, Database, InputStore, Taken
from core.store.database import async_url
from core.store.tables import InputRow, MessageRow, ProcessedEventRow, SessionRow, TurnRow

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
SID = "slack:T1:C1:1.0"
MSG, CTX, CMD = InputKind.MESSAGE, InputKind.CONTEXT, InputKind.CONTROL
FOLLOWUP, COLLECT = "followup", "collect"
ROOMY = Budget()


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    database = Database(f"sqlite:///{tmp_path}/x.db")
    await database.migrate()
    yield database
    await database.close()


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


async def burst(inputs: InputStore, *texts: str, start: int = 1) -> list[int]:
    """One input per text ("~" marks context, from U2) with ts 1.<n>, a second apart; returns their ids."""
    ids = []
    for n, body in enumerate(texts, start):
        kind, sender = (CTX, "U2") if body.startswith("~") else (MSG, "U1")
        msg = inbound(body.removeprefix("~"), ts=f"1.{n}", sender=sender)
        result = await send(inputs, msg, kind, now=T0 + timedelta(seconds=n))
        assert result.input_id is not None, result
        ids.append(result.input_id)
    return ids


async def take(inputs: InputStore, mode: str = COLLECT, budget: Budget = ROOMY) -> Taken:
    taken = await inputs.take_batch(SID, mode, budget, T0 + timedelta(minutes=1))
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


# -- database ---------------------------------------------------------------------------------------


async def test_migrate_twice_is_a_noop(db: Database, inputs: InputStore) -> None:
    await send(inputs, inbound(key="k1"))
    await db.migrate()
    async with db.engine.connect() as conn:
        version = (await conn.execute(text("SELECT version_num FROM alembic_version"))).scalars().all()
    assert version == [_head_revision()]
    assert await count(db, InputRow) == 1


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
        assert await conn.run_sync(diff) == []


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
    assert await inputs.input_ids_of_turn(taken.turn.id) == ids


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


async def finish(convs: ConversationStore, turn_id: int, status: str, answer: str | None = None,
                 error: str | None = None) -> None:
    await convs.finish_turn(turn_id, status=status, answer=answer, error=error, now=T0 + timedelta(minutes=2))


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
    assert await inputs.cancel_input(ids[0], "nevermind") is None
    assert await inputs.outcome(ids[0]) == Outcome("cancelled", "nevermind")
    assert (await take(inputs)).text == "two"
    assert await count(db, MessageRow) == 1


async def test_merged_turn_is_cancelled_when_every_caller_is(inputs: InputStore, convs: ConversationStore) -> None:
    ids = await burst(inputs, "one", "two")
    turn = (await take(inputs)).turn.id
    assert await inputs.cancel_input(ids[0], "stop") is None  # "two" still wants an answer
    assert await inputs.outcome(ids[0]) is None  # the turn still runs
    assert await inputs.cancel_input(ids[1], "stop") == turn
    assert await inputs.cancel_input(ids[1], "stop") is None  # already cancelled
    await finish(convs, turn, TurnStatus.CANCELLED, error="stopped")
    assert await inputs.outcome(ids[0]) == Outcome("cancelled", "stopped", turn)


async def test_cancelled_caller_of_an_answered_turn(inputs: InputStore, convs: ConversationStore) -> None:
    # Once taken, an input shares its turn's outcome: the answer covered it even though its caller left.
    ids = await burst(inputs, "one", "two")
    turn = (await take(inputs)).turn.id
    await inputs.cancel_input(ids[0], "left")
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
    assert await convs.requeue_interrupted(max_attempts=2, now=T0) == [turns["s:twice"]]
    assert await convs.count_turns(TurnStatus.QUEUED) == 1 and await convs.running_turn("s:once") is None
    dead = await convs.get_session("s:twice")
    assert dead is not None and dead.status == SessionStatus.FAILED
    assert await convs.sessions_with_work() == ["s:once"] and not await convs.has_live_work("s:twice")
    resumed = await convs.resume_interrupted("s:once", T0)
    assert resumed is not None and resumed.id == turns["s:once"] and resumed.inputs == (MessageRef("C1", "1.1"),)
    assert await convs.resume_interrupted("s:once", T0) is None
    async with db.read() as s:
        again = await s.get(TurnRow, turns["s:once"])
    assert again is not None and (again.status, again.attempts) == (TurnStatus.RUNNING, 2)


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


# -- control ----------------------------------------------------------------------------------------


async def test_intake_pause(db: Database) -> None:
    control = ControlStore(db)
    assert not await control.intake_paused()
    await control.set_intake_paused(True, T0)
    assert await control.intake_paused()
    await control.set_intake_paused(False, T0)
    assert (await control.intake_paused(), await control.get("intake_paused")) == (False, None)


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


def _head_revision() -> str:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from core.store.database import MIGRATIONS_DIR

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    head = ScriptDirectory.from_config(cfg).get_current_head()
    assert head is not None
    return head
