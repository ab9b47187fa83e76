"""Intake: deduplicated arrival of inputs, batches taken by turns, cancellation and outcomes."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, func, update
from sqlalchemy import insert as sa_insert
from sqlalchemy import select as sa_select
from sqlalchemy.exc import IntegrityError
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from core.errors import InvalidInput
from core.model import (
    LIVE_TURN_STATUSES,
    Inbound,
    InputKind,
    InputStatus,
    MessageRef,
    Outcome,
    OutcomeStatus,
    QueueMode,
    SessionInfo,
    SessionStatus,
    TurnInfo,
    TurnStatus,
)
from core.store.control import queue_mode_of
from core.store.conversations import session_info, turn_info, turn_outcome
from core.store.database import Database
from core.store.tables import InputRow, MessageRow, ProcessedEventRow, SessionRow, TurnRow


class AcceptOutcome(enum.StrEnum):
    QUEUED = "queued"  # stored; a turn will answer it
    RECORDED = "recorded"  # stored as context for a later turn
    COMMAND = "command"  # a command to the bot, stored so a redelivery does not repeat it
    REFUSED = "refused"  # stored as refused (busy, paused); the sender is told why
    DUPLICATE = "duplicate"  # seen before (redelivery, or a second event for the same message)
    IGNORED = "ignored"  # not for the bot (no mention, no session)


@dataclass(frozen=True)
class Accepted:
    outcome: AcceptOutcome
    input_id: int | None = None
    session: SessionInfo | None = None
    note: str | None = None


@dataclass(frozen=True)
class Budget:
    """How much one merged user message may hold (SPEC §5)."""

    chars: int = 40_000
    images: int = 10


@dataclass(frozen=True)
class Taken:
    """Inputs a turn just took, already written to the transcript."""

    turn: TurnInfo
    text: str  # merged, in arrival order, joined by a blank line
    images: tuple[str, ...]
    refs: tuple[MessageRef, ...]  # the inputs taken now (not those the turn took before)


class InputStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    # -- arrival --------------------------------------------------------------------------------

    async def accept(
        self, msg: Inbound, *, kind: str, agent: str, refuse: str | None, max_waiting: int, now: datetime
    ) -> Accepted:
        """Take one inbound message in, in one transaction: dedupe, then store it as waiting,
        a command, context, or refused (``refuse`` is the operator's reason, e.g. paused)."""
        try:
            return await self._accept(msg, kind=kind, agent=agent, refuse=refuse, max_waiting=max_waiting, now=now)
        except IntegrityError:
            # Another replica stored the same session or message at the same moment: read again,
            # and this delivery turns out to be a duplicate (or finds the session now there).
            return await self._accept(msg, kind=kind, agent=agent, refuse=refuse, max_waiting=max_waiting, now=now)

    async def _accept(
        self, msg: Inbound, *, kind: str, agent: str, refuse: str | None, max_waiting: int, now: datetime
    ) -> Accepted:
        # Core statements, not ORM objects: this runs before Slack is acknowledged, for every message.
        async with self.db.write() as s:
            if msg.delivery_key is not None and not await _claim_delivery(self.db, s, msg.delivery_key, now):
                return Accepted(AcceptOutcome.DUPLICATE)
            conn = await s.connection()
            found = (await conn.execute(sa_select(SessionRow.__table__).where(  # type: ignore[attr-defined]
                SessionRow.__table__.c.id == msg.session_id))).mappings().first()  # type: ignore[attr-defined]
            new_session = found is None
            if found is None:
                if kind == InputKind.CONTEXT:
                    return Accepted(AcceptOutcome.IGNORED)
                values = dict(
                    id=msg.session_id, channel=msg.channel, agent=msg.agent or agent, status=SessionStatus.IDLE,
                    reply_ref=json.dumps(msg.reply_ref), place=msg.place, created_at=now, updated_at=now,
                    preapproved=json.dumps([list(p) for p in msg.preapproved]) if msg.preapproved else None,
                    queue_mode=None,
                )
                await conn.execute(sa_insert(SessionRow.__table__).values(**values))  # type: ignore[attr-defined]
                session = SessionRow.model_validate(values)
            else:
                session = SessionRow.model_validate(dict(found))
            info = session_info(session)
            if msg.agent is not None and msg.agent != session.agent:
                raise InvalidInput(f"this conversation belongs to agent {session.agent!r}, not {msg.agent!r}")
            if msg.idempotency_key is not None and not new_session:
                seen_id = (await conn.execute(sa_select(InputRow.__table__.c.id).where(  # type: ignore[attr-defined]
                    InputRow.__table__.c.session_id == msg.session_id,  # type: ignore[attr-defined]
                    InputRow.__table__.c.idempotency_key == msg.idempotency_key,  # type: ignore[attr-defined]
                ))).scalar()
                if seen_id is not None:
                    return Accepted(AcceptOutcome.DUPLICATE, seen_id, info)
            status, outcome = InputStatus.WAITING, AcceptOutcome.QUEUED
            note = None
            if kind == InputKind.CONTEXT:
                outcome = AcceptOutcome.RECORDED
            elif kind == InputKind.CONTROL:
                status, outcome = InputStatus.TAKEN, AcceptOutcome.COMMAND
            elif refuse is not None:
                status, outcome, note = InputStatus.REFUSED, AcceptOutcome.REFUSED, refuse
            elif not new_session and await _waiting_count(s, msg.session_id) >= max_waiting:
                note = (f"I'm busy: {max_waiting} messages in this conversation are already waiting for me. "
                        "Send this again once I've answered them.")
                status, outcome = InputStatus.REFUSED, AcceptOutcome.REFUSED
            inserted = await conn.execute(sa_insert(InputRow.__table__).values(  # type: ignore[attr-defined]
                session_id=msg.session_id, kind=kind, status=status, text=msg.text,
                images=json.dumps(list(msg.images)) if msg.images else None, sender=msg.sender,
                agent=msg.agent, platform_channel=msg.ref.channel, platform_ts=msg.ref.ts,
                idempotency_key=msg.idempotency_key, note=note, created_at=now,
            ))
            if not new_session:
                await conn.execute(update(SessionRow).where(col(SessionRow.id) == msg.session_id)
                                   .values(updated_at=now))
            input_id = int(inserted.inserted_primary_key[0])  # type: ignore[index]
            return Accepted(outcome, input_id, info, note)

    async def prune_deliveries(self, older_than: datetime) -> int:
        async with self.db.write() as s:
            result = await s.exec(delete(ProcessedEventRow).where(col(ProcessedEventRow.received_at) < older_than))
            return int(result.rowcount or 0)

    # -- turns taking inputs --------------------------------------------------------------------

    async def take_batch(self, session_id: str, default_mode: str, budget: Budget, now: datetime) -> Taken | None:
        """Start a turn with the oldest waiting inputs: one message (followup) or as many as the budget
        holds (steer, collect), with the context recorded before it. None when no message waits."""
        async with self.db.write() as s:
            waiting = await _waiting(s, session_id)
            if not any(i.kind == InputKind.MESSAGE for i in waiting):
                return None
            session = await s.get(SessionRow, session_id)
            assert session is not None
            mode = await queue_mode_of(s, session) or default_mode
            batch = _fit(waiting, budget, one_message=mode == QueueMode.FOLLOWUP)
            turn = TurnRow(session_id=session_id, agent=session.agent, status=TurnStatus.RUNNING, attempts=1,
                           created_at=now, started_at=now)
            s.add(turn)
            session.status = SessionStatus.RUNNING
            await s.flush()
            return await self._take(s, turn, session, batch, now)

    async def take_steered(self, turn_id: int, default_mode: str, budget: Budget, now: datetime) -> Taken | None:
        """Hand what waits to the running turn at its tool step (steer mode only); None when nothing does."""
        async with self.db.write() as s:
            turn = await s.get(TurnRow, turn_id)
            assert turn is not None
            waiting = await _waiting(s, turn.session_id)
            if not waiting or turn.status != TurnStatus.RUNNING:
                return None
            session = await s.get(SessionRow, turn.session_id)
            assert session is not None
            if (await queue_mode_of(s, session) or default_mode) != QueueMode.STEER:
                return None
            return await self._take(s, turn, session, _fit(waiting, budget, one_message=False), now)

    async def _take(
        self, s: AsyncSession, turn: TurnRow, session: SessionRow, batch: list[InputRow], now: datetime
    ) -> Taken:
        images: list[str] = []
        for item in batch:
            if item.message_id is None:
                message = MessageRow(
                    session_id=item.session_id, role="user", content=item.text, sender=item.sender,
                    platform_channel=item.platform_channel, platform_ts=item.platform_ts,
                    idempotency_key=item.idempotency_key, turn_id=turn.id, created_at=now,
                )
                s.add(message)
                await s.flush()
                item.message_id = message.id
            item.status = InputStatus.TAKEN
            item.turn_id = turn.id
            item.taken_at = now
            images += json.loads(item.images) if item.images else []
            s.add(item)
        await s.flush()
        text = "\n\n".join(i.text for i in batch if i.text)
        refs = tuple(MessageRef(i.platform_channel, i.platform_ts) for i in batch)
        return Taken(await turn_info(s, turn, session), text, tuple(images), refs)

    async def last_arrival(self, session_id: str) -> datetime | None:
        async with self.db.read() as s:
            row = await s.exec(
                select(func.max(InputRow.created_at)).where(
                    InputRow.session_id == session_id, InputRow.status == InputStatus.WAITING
                )
            )
            value = row.first()
            return value if isinstance(value, datetime) else None

    # -- cancellation ---------------------------------------------------------------------------

    async def cancel_waiting(self, session_id: str, note: str) -> list[int]:
        """Cancel every message still waiting in the session; returns their ids."""
        async with self.db.write() as s:
            ids = list((await s.exec(
                select(InputRow.id).where(InputRow.session_id == session_id, InputRow.status == InputStatus.WAITING,
                                          InputRow.kind == InputKind.MESSAGE)
            )).all())
            if ids:
                await s.exec(update(InputRow).where(col(InputRow.id).in_(ids)).values(
                    status=InputStatus.CANCELLED, note=note))
            return [i for i in ids if i is not None]

    async def cancel_turn_inputs(self, turn_id: int, note: str) -> None:
        async with self.db.write() as s:
            await s.exec(update(InputRow).where(col(InputRow.turn_id) == turn_id,
                                                col(InputRow.kind) == InputKind.MESSAGE)
                         .values(status=InputStatus.CANCELLED, note=note))

    async def cancel_input(self, input_id: int, note: str) -> int | None:
        """Cancel one input. Returns the running turn's id when that turn has nothing left uncancelled."""
        async with self.db.write() as s:
            row = await s.get(InputRow, input_id)
            if row is None or row.status not in (InputStatus.WAITING, InputStatus.TAKEN):
                return None
            was_waiting = row.status == InputStatus.WAITING
            row.status, row.note = InputStatus.CANCELLED, note
            s.add(row)
            if was_waiting or row.turn_id is None:
                return None
            turn = await s.get(TurnRow, row.turn_id)
            if turn is None or turn.status != TurnStatus.RUNNING:
                return None
            await s.flush()
            left = await s.exec(select(func.count()).select_from(InputRow).where(
                InputRow.turn_id == row.turn_id, InputRow.kind == InputKind.MESSAGE,
                InputRow.status != InputStatus.CANCELLED))
            return row.turn_id if int(left.one()) == 0 else None

    # -- outcomes -------------------------------------------------------------------------------

    async def outcome(self, input_id: int) -> Outcome | None:
        """How the input ended, or None while it is waiting or its turn is still running."""
        async with self.db.read() as s:
            row = await s.get(InputRow, input_id)
            if row is None:
                return Outcome(OutcomeStatus.REFUSED, "unknown input")
            if row.status == InputStatus.REFUSED:
                return Outcome(OutcomeStatus.REFUSED, row.note or "refused")
            if row.status == InputStatus.CANCELLED and row.turn_id is None:
                return Outcome(OutcomeStatus.CANCELLED, row.note or "cancelled")
            if row.kind == InputKind.CONTROL:
                return Outcome(OutcomeStatus.ANSWERED, row.note or "done")
            if row.turn_id is None:
                return None
            turn = await s.get(TurnRow, row.turn_id)
            if turn is None:
                return None
            # Once taken, an input shares its turn's outcome: if the turn answered (a stop lost the race,
            # or others in a merged turn still wanted it), this message was answered too.
            return turn_outcome(turn)

    async def input_ids_of_turn(self, turn_id: int) -> list[int]:
        async with self.db.read() as s:
            rows = await s.exec(select(InputRow.id).where(InputRow.turn_id == turn_id))
            return [i for i in rows.all() if i is not None]

    async def note(self, input_id: int, text: str) -> None:
        async with self.db.write() as s:
            await s.exec(update(InputRow).where(col(InputRow.id) == input_id).values(note=text))

    async def latest_live_session(self, place: str) -> str | None:
        """The most recently active conversation at a place that is working or has messages waiting."""
        async with self.db.read() as s:
            busy = select(TurnRow.session_id).where(TurnRow.status == TurnStatus.RUNNING)
            waiting = select(InputRow.session_id).where(InputRow.status == InputStatus.WAITING,
                                                        InputRow.kind == InputKind.MESSAGE)
            row = await s.exec(
                select(SessionRow.id)
                .where(SessionRow.place == place,
                       col(SessionRow.id).in_(busy) | col(SessionRow.id).in_(waiting))
                .order_by(col(SessionRow.updated_at).desc())
                .limit(1)
            )
            return row.first()

    async def requester(self, session_id: str) -> str | None:
        """Whose request the conversation is about: who asked for its live (or else its latest) turn;
        with only messages waiting since the last turn ended, who sent the first of them. None when
        nobody has asked it anything yet."""
        async with self.db.read() as s:
            turn = (await s.exec(select(TurnRow).where(TurnRow.session_id == session_id)
                                 .order_by(col(TurnRow.id).desc()).limit(1))).first()
            if turn is None or turn.status not in LIVE_TURN_STATUSES:
                waiting = (await s.exec(select(InputRow.sender).where(
                    InputRow.session_id == session_id, InputRow.status == InputStatus.WAITING,
                    InputRow.kind == InputKind.MESSAGE).order_by(col(InputRow.id)).limit(1))).first()
                if waiting is not None:
                    return waiting
            if turn is None:
                return None
            first = await s.exec(select(InputRow.sender).where(
                InputRow.turn_id == turn.id, InputRow.kind == InputKind.MESSAGE).order_by(col(InputRow.id)).limit(1))
            return first.first()


def _fit(waiting: list[InputRow], budget: Budget, *, one_message: bool) -> list[InputRow]:
    """The longest prefix that fits the budget, always reaching the first message (a large one runs
    alone, and context recorded before it never makes a turn of its own)."""
    batch: list[InputRow] = []
    chars = images = 0
    has_message = False
    for item in waiting:
        size = len(item.text) + (2 if batch else 0)
        count = len(json.loads(item.images)) if item.images else 0
        if has_message and (chars + size > budget.chars or images + count > budget.images):
            break
        has_message = has_message or item.kind == InputKind.MESSAGE
        batch.append(item)
        chars, images = chars + size, images + count
        if one_message and item.kind == InputKind.MESSAGE:
            break
    return batch


async def _waiting(s: AsyncSession, session_id: str) -> list[InputRow]:
    rows = await s.exec(
        select(InputRow)
        .where(InputRow.session_id == session_id, InputRow.status == InputStatus.WAITING)
        .order_by(col(InputRow.id))
        .limit(500)
    )
    return list(rows.all())


async def _waiting_count(s: AsyncSession, session_id: str) -> int:
    result = await s.exec(
        select(func.count()).select_from(InputRow).where(
            InputRow.session_id == session_id, InputRow.status == InputStatus.WAITING,
            InputRow.kind == InputKind.MESSAGE)
    )
    return int(result.one())


async def _claim_delivery(db: Database, s: AsyncSession, key: str, now: datetime) -> bool:
    stmt = db.insert(ProcessedEventRow).values(key=key, received_at=now).on_conflict_do_nothing()
    result = await s.exec(stmt)
    return bool(result.rowcount)
