"""Final review of issue 39's single-statement PostgreSQL writes (and their SQLite twins): hostile text, sender ids
and thread timestamps are stored as given, the array_agg of senders never splits or merges one, and a delivery
lands once, on its own turn only. Runs on both backends (TEST_DATABASE_URL for PostgreSQL)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from sqlmodel import select

from core.model import TurnStatus
from core.store import ConversationStore, InputStore
from core.store.database import Database
from core.store.deliveries import DeliveryStore, OutboxClaim
from core.store.tables import DeliveryRow, InputRow, MessageRow, TurnRow
from tests.test_store_contract import CTX, SID, T0, inbound, send, take


@pytest.fixture
def db(store_db: Database) -> Database:
    return store_db


@pytest.fixture
def inputs(db: Database) -> InputStore:
    return InputStore(db)


@pytest.fixture
def convs(db: Database) -> ConversationStore:
    return ConversationStore(db)

HOSTILE_SENDERS = ("U1,U2", "{U3,U4}", '"U5"', "NULL", "U6\\", "a b", "U7'); DROP TABLE inputs; --", "Ü8",
                   "{}", "U1")


async def test_hostile_sender_ids_are_each_one_sender(db: Database, inputs: InputStore,
                                                      convs: ConversationStore) -> None:
    await send(inputs, inbound("ask", ts="1.1", sender="U1"))  # context is kept once the conversation exists
    for n, sender in enumerate(HOSTILE_SENDERS[:-1], 2):
        accepted = await send(inputs, inbound(f"ctx {n}", ts=f"1.{n}", sender=sender), CTX)
        assert accepted.input_id is not None
    taken = await take(inputs)
    assert taken.turn.everyone is not None and taken.turn.everyone[0] == "U1"
    assert sorted(taken.turn.everyone) == sorted(set(HOSTILE_SENDERS))
    assert len(taken.turn.everyone) == len(set(HOSTILE_SENDERS))  # none split, none merged
    # the next turn reads the earlier senders back (PostgreSQL: array_agg in the turn's first read)
    await convs.finish_turn(taken.turn.id, status=TurnStatus.FINISHED, answer="a", error=None, now=T0)
    await send(inputs, inbound("again", ts="3.1", sender="U0"), now=T0 + timedelta(minutes=5))
    later = await take(inputs)
    assert later.turn.everyone == ("U0", *sorted(set(HOSTILE_SENDERS)))


async def test_hostile_text_and_ts_are_written_as_given(db: Database, inputs: InputStore) -> None:
    text = "x'), ('s', 'assistant', 'injected'); -- $$ \\ {a,b} NULL"
    ts = "1.2'); UPDATE turns SET status='finished'; --"
    await send(inputs, inbound(text, ts=ts, sender="U9'--"))
    taken = await take(inputs)
    async with db.read() as s:
        messages = (await s.exec(select(MessageRow).where(MessageRow.session_id == SID))).all()
        row = (await s.exec(select(InputRow).where(InputRow.session_id == SID))).one()
    assert [(m.role, m.content, m.sender, m.platform_ts, m.turn_id) for m in messages] == [
        ("user", text, "U9'--", ts, taken.turn.id)]
    assert (row.status, row.message_id, row.turn_id) == ("taken", messages[0].id, taken.turn.id)


async def test_a_delivery_lands_once_and_only_on_its_own_turn(db: Database, inputs: InputStore,
                                                              convs: ConversationStore) -> None:
    claim = OutboxClaim("p1", T0 + timedelta(seconds=30))
    turns = []
    for session in ("s:a", "s:b"):
        await send(inputs, inbound("q", session=session))
        taken = await take(inputs, session=session)
        await convs.finish_turn(taken.turn.id, status=TurnStatus.FINISHED, answer="a", error=None, now=T0,
                                outbox=claim, answer_message=True)
        turns.append(taken.turn.id)
    outbox = DeliveryStore(db)
    a, b = turns
    # another holder, another attempt, or the wrong turn's claim: nothing lands
    assert not await outbox.delivered(a, "x", T0, holder="p2", attempt=1)
    assert not await outbox.delivered(a, "x", T0, holder="p1", attempt=2)
    assert await outbox.delivered(a, "1.1", T0, holder="p1", attempt=1)
    assert not await outbox.delivered(a, "2.2", T0, holder="p1", attempt=1)  # twice: the second changes nothing
    async with db.read() as s:
        rows = {t.id: t for t in (await s.exec(select(TurnRow))).all()}
        outbox_rows = {d.turn_id: d for d in (await s.exec(select(DeliveryRow))).all()}
    assert rows[a].delivered_ref == "1.1" and outbox_rows[a].ref == "1.1" and outbox_rows[a].status == "delivered"
    assert rows[b].delivered_ref is None and outbox_rows[b].status == "pending" and outbox_rows[b].ref is None


async def test_two_landings_at_once_settle_one_ref_on_both_rows(db: Database, inputs: InputStore,
                                                                convs: ConversationStore) -> None:
    """PostgreSQL runs the landing in autocommit: two at once (a retry racing its first try) still leave one
    winner, and the turn's delivered_ref is the delivery row's ref."""
    claim = OutboxClaim("p1", T0 + timedelta(seconds=30))
    await send(inputs, inbound("q"))
    taken = await take(inputs)
    await convs.finish_turn(taken.turn.id, status=TurnStatus.FINISHED, answer="a", error=None, now=T0,
                            outbox=claim, answer_message=True)
    outbox = DeliveryStore(db)
    results = await asyncio.gather(*(outbox.delivered(taken.turn.id, f"{n}.0", T0, holder="p1", attempt=1)
                                     for n in range(8)))
    assert sum(results) == 1
    async with db.read() as s:
        turn = await s.get(TurnRow, taken.turn.id)
        row = await s.get(DeliveryRow, taken.turn.id)
    assert turn is not None and row is not None and row.status == "delivered"
    assert turn.delivered_ref == row.ref == f"{results.index(True)}.0"
