"""Durable intake at speed (issue 14): accepts are committed in groups, each caller returns only once
its own group committed, one bad input never takes its group down, and SQLite's write path runs whole
transactions on its writer thread. Run against SQLite, and PostgreSQL when TEST_DATABASE_URL is set."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlmodel import Session, select

from core.agents import Agent
from core.clock import SystemClock
from core.errors import InvalidInput, ProviderError, StoreError
from core.model import Inbound, InputKind, MessageRef, SessionInfo, SessionStatus, TurnInfo
from core.redaction import Redactor
from core.runner import AgentRunner
from core.store import AcceptOutcome, ControlStore, Database, InputStore
from core.store.sqlite_checkpoint import WAL_SIZE_LIMIT_BYTES
from core.store.tables import InputRow
from tests.conftest import fresh_postgres
from tests.fakes.core import HeldProvider, build_core, noop_tools

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def _msg(n: int, *, session: str | None = None, delivery: str | None = None, agent: str | None = None) -> Inbound:
    return Inbound(session_id=session or f"s:{n}", channel="slack", sender="U1", text=f"message {n}", addressed=True,
                   reply_ref={"channel": "C1", "thread_ts": "1.0"}, ref=MessageRef("C1", f"1.{n}"),
                   idempotency_key=f"C1:1.{n}", delivery_key=delivery or f"ev{n}", agent=agent)


async def _accept(inputs: InputStore, msg: Inbound, *, paused_note: str | None = None) -> object:
    try:
        return await inputs.accept(msg, kind=InputKind.MESSAGE, agent="default", refuse=None, max_waiting=20,
                                   now=T0, refuse_if_paused=paused_note)
    except InvalidInput as exc:
        return exc


async def _stored(db: Database) -> list[str]:
    async with db.read() as s:
        return list((await s.exec(select(InputRow.text).order_by(InputRow.id))).all())


async def test_messages_arriving_together_share_commits_and_each_is_stored_when_its_accept_returns(
    store_db: Database,
) -> None:
    db = store_db
    inputs = InputStore(db)
    seen: list[int] = []

    async def one(n: int) -> None:
        result = await _accept(inputs, _msg(n))
        assert getattr(result, "outcome", None) == AcceptOutcome.QUEUED
        # Returned: committed, so another connection reads it.
        async with db.read() as s:
            row = await s.get(InputRow, result.input_id)  # type: ignore[attr-defined]
        assert row is not None and row.text == f"message {n}"
        seen.append(n)

    await asyncio.gather(*(one(n) for n in range(60)))
    assert sorted(seen) == list(range(60))
    commits = inputs.intake.commits
    assert commits.requests == 60
    assert commits.groups < 60, "every message had a transaction of its own: nothing was grouped"


async def test_messages_one_after_another_are_each_written(store_db: Database) -> None:
    """Each accept arrives just after the previous one's writer finished (before it was forgotten)."""
    inputs = InputStore(store_db)
    for n in range(5):
        result = await asyncio.wait_for(_accept(inputs, _msg(n)), 5)
        assert getattr(result, "outcome", None) == AcceptOutcome.QUEUED


async def test_one_bad_input_fails_alone_and_writes_nothing(store_db: Database) -> None:
    db = store_db
    inputs = InputStore(db)
    assert getattr(await _accept(inputs, _msg(1, session="s:shared")), "outcome", None) == AcceptOutcome.QUEUED
    # In one group: a message naming another agent for that conversation, among good ones.
    results = await asyncio.gather(
        _accept(inputs, _msg(2)),
        _accept(inputs, _msg(3, session="s:shared", agent="other", delivery="ev-bad")),
        _accept(inputs, _msg(4)),
    )
    assert [getattr(r, "outcome", None) for r in (results[0], results[2])] == [AcceptOutcome.QUEUED] * 2
    assert isinstance(results[1], InvalidInput)
    assert await _stored(db) == ["message 1", "message 2", "message 4"]
    # Nothing of the refused one was kept, not even its delivery id: sent again rightly, it is taken.
    retried = await _accept(inputs, _msg(3, session="s:shared", delivery="ev-bad"))
    assert getattr(retried, "outcome", None) == AcceptOutcome.QUEUED


async def test_a_redelivery_in_the_same_group_is_a_duplicate(store_db: Database) -> None:
    db = store_db
    inputs = InputStore(db)
    first, again = await asyncio.gather(_accept(inputs, _msg(1)), _accept(inputs, _msg(1)))
    outcomes = sorted(str(getattr(r, "outcome", None)) for r in (first, again))
    assert outcomes == [AcceptOutcome.DUPLICATE, AcceptOutcome.QUEUED]
    assert await _stored(db) == ["message 1"]


async def test_a_pause_is_read_in_the_transaction_that_stores_the_message(store_db: Database) -> None:
    db = store_db
    inputs, control = InputStore(db), ControlStore(db)
    await control.set_intake_paused(True, T0)
    paused = await _accept(inputs, _msg(1), paused_note="paused by an operator")
    assert getattr(paused, "outcome", None) == AcceptOutcome.REFUSED
    assert getattr(paused, "note", None) == "paused by an operator"
    await control.set_intake_paused(False, T0)
    assert getattr(await _accept(inputs, _msg(2), paused_note="paused"), "outcome", None) == AcceptOutcome.QUEUED


async def test_a_failed_transaction_fails_its_whole_group_and_keeps_nothing(store_db: Database) -> None:
    db = store_db
    def broken(s: Session) -> None:
        s.connection().execute(text("INSERT INTO no_such_table VALUES (1)"))

    with pytest.raises(Exception, match="no_such_table"):
        await db.run_write(broken)
    # The write path is still usable afterwards.
    assert getattr(await _accept(InputStore(db), _msg(1)), "outcome", None) == AcceptOutcome.QUEUED


async def test_a_write_whose_caller_is_cancelled_before_it_starts_never_runs(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path}/x.db")
    await db.migrate()
    ran: list[str] = []
    try:
        async with db.exclusive():  # holds the write turn: the queued job cannot start yet
            job = asyncio.create_task(db.run_write(lambda s: ran.append("ran")))
            await asyncio.sleep(0.05)
            job.cancel()
            with pytest.raises(asyncio.CancelledError):
                await job
        await db.run_write(lambda s: None)  # the queue moved past it
        assert ran == []
    finally:
        await db.close()


@pytest.mark.parametrize("setting, pragma", [("NORMAL", 1), ("FULL", 2)])
async def test_sqlite_synchronous_is_a_setting(tmp_path: Path, setting: str, pragma: int) -> None:
    db = Database(f"sqlite:///{tmp_path}/x.db", sqlite_synchronous=setting)
    await db.migrate()
    try:
        async with db.read() as s:
            assert (await s.exec(text("PRAGMA synchronous"))).scalar() == pragma  # type: ignore[call-overload]
        assert await db.run_write(lambda s: s.connection().execute(text("PRAGMA synchronous")).scalar()) == pragma
    finally:
        await db.close()


def test_a_wrong_sqlite_synchronous_is_refused_clearly(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="SQLITE_SYNCHRONOUS must be one of NORMAL, FULL"):
        Database(f"sqlite:///{tmp_path}/x.db", sqlite_synchronous="OFF")


# -- regressions found by review (each failed before its fix) ---------------------------------------------


def _chat(text_: str, key: str, *, delivery: str | None = None) -> Inbound:
    return Inbound(session_id="s:1", channel="test", sender="U1", text=text_, addressed=True,
                   ref=MessageRef("C", key), idempotency_key=key, delivery_key=delivery)


async def test_a_message_waiting_behind_an_interrupted_turn_is_answered_after_the_restart(tmp_path: Path) -> None:
    model = HeldProvider()
    core = await build_core(tmp_path / "bot.db", model, queue_mode="followup").start()
    first = await core.dispatcher.accept(_chat("first", "a"))
    await model.next_call()  # its turn runs (held)
    second = await core.dispatcher.accept(_chat("second", "b"))
    await core.stop(drain_s=0)  # the turn is interrupted; "second" still waits behind it

    model = HeldProvider()
    core = await build_core(tmp_path / "bot.db", model, queue_mode="followup").start()
    try:
        await model.answer("answer to first")  # the resumed turn
        assert first.input_id is not None and second.input_id is not None
        assert (await asyncio.wait_for(core.dispatcher.outcome(first.input_id), 5)).text == "answer to first"
        await model.answer("answer to second")
        assert (await asyncio.wait_for(core.dispatcher.outcome(second.input_id), 5)).text == "answer to second"
    finally:
        await core.stop()


async def test_a_message_whose_sender_went_away_before_the_ack_is_still_answered_once(tmp_path: Path) -> None:
    """The caller (an HTTP request whose connection closed) is cancelled while its message waits to be
    committed: the message is stored and answered, and Slack's redelivery is a duplicate."""
    model = HeldProvider()
    core = await build_core(tmp_path / "bot.db", model).start()
    try:
        async with core.db.exclusive():  # the write turn is busy (e.g. APScheduler's job store)
            caller = asyncio.create_task(core.dispatcher.accept(_chat("hello", "a", delivery="ev-a")))
            await asyncio.sleep(0.05)
            caller.cancel()
            with pytest.raises(asyncio.CancelledError):
                await caller
        request = await model.answer("hi")  # asked, without any redelivery
        assert request.messages[-1].content == "hello"
        again = await core.dispatcher.accept(_chat("hello", "a", delivery="ev-a"))
        assert again.outcome == AcceptOutcome.DUPLICATE
        with pytest.raises(TimeoutError):  # and not asked again
            await model.next_call(timeout=0.3)
    finally:
        await core.stop()


@pytest.mark.skipif(not os.environ.get("TEST_DATABASE_URL"), reason="needs TEST_DATABASE_URL")
async def test_two_replicas_committing_groups_over_the_same_conversations_never_deadlock() -> None:
    async with fresh_postgres(os.environ["TEST_DATABASE_URL"]) as url:
        a, b = Database(url), Database(url)
        await a.migrate()
        try:
            ia, ib = InputStore(a), InputStore(b)
            for n in range(30):  # the conversations exist
                await _accept(ia, _msg(n, session=f"s:{n}", delivery=f"init{n}"))
            for round_ in range(3):
                base = 1000 * (round_ + 1)
                forward = [_accept(ia, _msg(base + n, session=f"s:{n}")) for n in range(30)]
                backward = [_accept(ib, _msg(base + 500 + n, session=f"s:{n}")) for n in reversed(range(30))]
                results = await asyncio.gather(*forward, *backward)
                assert [getattr(r, "outcome", r) for r in results] == [AcceptOutcome.QUEUED] * 60
        finally:
            await a.close()
            await b.close()


@pytest.mark.skipif(not os.environ.get("TEST_DATABASE_URL"), reason="needs TEST_DATABASE_URL")
async def test_two_replicas_storing_the_same_new_conversation_at_once_store_it_once() -> None:
    """A mention and its twin message event (same message, other event ids) reach two replicas at once, each alone
    in its group: each tries the one statement that stores a new conversation with its input. One stores it; the
    other's statement fails as a whole (nothing of it kept, not its event's key), is read again, and finds the
    message there: a duplicate. The same when the twins land in one replica's group, and with the same event id."""
    async with fresh_postgres(os.environ["TEST_DATABASE_URL"]) as url:
        a, b = Database(url), Database(url)
        await a.migrate()
        try:
            ia, ib = InputStore(a), InputStore(b)
            for n in range(20):
                same_event = n % 2 == 0
                twins = [_accept(ia, _msg(n, delivery=f"ev{n}")),
                         _accept(ib if n < 10 else ia, _msg(n, delivery=f"ev{n}" if same_event else f"twin{n}"))]
                results = await asyncio.gather(*twins)
                assert sorted(str(getattr(r, "outcome", r)) for r in results) == [
                    AcceptOutcome.DUPLICATE, AcceptOutcome.QUEUED], (n, results)
            assert await _stored(a) == [f"message {n}" for n in range(20)]
        finally:
            await a.close()
            await b.close()


async def test_a_failing_first_model_call_does_not_cut_the_secret_check_short() -> None:
    """The masks are brought up to date while the model is first asked; a quick failure (a 401 that quotes
    the key) must still be redacted with the new secret in the masks."""
    secret = "sk-live-TOPSECRET-123456"

    class Failing:
        name = "failing"

        async def complete(self, request: object) -> object:
            await asyncio.sleep(0.02)
            raise ProviderError("auth", f"endpoint said: bad key {secret}", retryable=False)

    async def fingerprint() -> str:
        await asyncio.sleep(0.2)  # a slow read on a busy database
        return "v2"

    async def load() -> list[tuple[str, str]]:
        return [("api", secret)]

    redactor = Redactor(load, fingerprint)
    runner = AgentRunner(None, Failing(), noop_tools(), SystemClock(), redactor=redactor)  # type: ignore[arg-type]
    session = SessionInfo(id="s", channel="test", agent="default", status=SessionStatus.RUNNING, reply_ref={})
    with pytest.raises(ProviderError) as failure:
        # Who wrote in the conversation, as read with the turn's start (this runner has no store to read it from).
        await runner.run(TurnInfo(id=1, session=session, inputs=(), sender="U1", everyone=("U1",)), Agent(),
                         transcript=[])
    assert secret not in await runner.redact(str(failure.value))


async def test_a_write_after_the_database_closed_is_refused_not_left_hanging(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path}/x.db")
    await db.migrate()
    await db.close()
    with pytest.raises(StoreError, match="closed"):
        await asyncio.wait_for(db.run_write(lambda s: None), 5)


# -- the WAL's checkpoints run beside commits, not inside them ----------------------------------------------


def _rows_in_database_file(tmp_path: Path) -> int:
    """How many ``blobs`` rows the database file itself holds, without its WAL: what checkpoints copied."""
    copy = tmp_path / "file-only.db"
    shutil.copyfile(tmp_path / "x.db", copy)
    conn = sqlite3.connect(copy)
    try:
        if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'blobs'").fetchone():
            return 0
        return int(conn.execute("SELECT count(*) FROM blobs").fetchone()[0])
    finally:
        conn.close()
        copy.unlink()


async def _write_blobs(db: Database, count: int) -> None:
    """``count`` rows of 64 KB each (128: 8 MB, past the 1000 pages at which a commit checkpoints by default)."""
    await db.run_write(lambda s: s.connection().execute(text("CREATE TABLE blobs (b BLOB)")))
    for _ in range(count):
        await db.run_write(lambda s: s.connection().execute(text("INSERT INTO blobs VALUES (randomblob(65536))")))


async def test_no_commit_checkpoints_the_wal_itself(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path}/x.db", sqlite_checkpoint_delay_s=3600)  # the checkpointer stays idle
    await db.migrate()
    try:
        await _write_blobs(db, 128)
        assert _rows_in_database_file(tmp_path) == 0  # all of it still in the WAL
        async with db.read() as s:  # and every connection reads it from there
            assert (await s.exec(text("SELECT count(*) FROM blobs"))).scalar() == 128  # type: ignore[call-overload]
    finally:
        await db.close()


async def test_the_checkpointer_copies_committed_writes_into_the_database_file(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path}/x.db", sqlite_checkpoint_delay_s=0.01)
    await db.migrate()
    try:
        await _write_blobs(db, 128)
        for _ in range(500):
            with contextlib.suppress(sqlite3.DatabaseError):  # copied while a checkpoint wrote into it
                if _rows_in_database_file(tmp_path) == 128:
                    break
            await asyncio.sleep(0.01)
        assert _rows_in_database_file(tmp_path) == 128
    finally:
        await db.close()


async def test_a_wal_the_checkpointer_does_not_keep_up_with_still_restarts_and_stays_bounded(tmp_path: Path) -> None:
    """The safety net: past AUTOCHECKPOINT_PAGES a commit checkpoints after all, and the WAL restarts
    from its beginning instead of growing for as long as writes keep coming."""
    db = Database(f"sqlite:///{tmp_path}/x.db", sqlite_checkpoint_delay_s=3600)  # the checkpointer stays idle
    await db.migrate()
    try:
        await _write_blobs(db, 640)  # 40 MB of writes
        assert _rows_in_database_file(tmp_path) > 0
        assert (tmp_path / "x.db-wal").stat().st_size <= WAL_SIZE_LIMIT_BYTES + 2 * 1024 * 1024
    finally:
        await db.close()


async def test_closing_a_database_twice_is_harmless(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path}/x.db", sqlite_checkpoint_delay_s=0.01)
    await db.migrate()
    await db.run_write(lambda s: None)
    await db.close()
    await db.close()
