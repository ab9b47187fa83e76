"""Intake: deduplicated arrival of inputs, batches taken by turns, cancellation and outcomes."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import Row, Select, delete, update
from sqlalchemy import select as sa_select
from sqlmodel import Session, col, select

from core.model import (
    LIVE_TURN_STATUSES,
    Attachment,
    Inbound,
    InputKind,
    InputStatus,
    MessageRef,
    Outcome,
    OutcomeStatus,
    QueueMode,
    SessionStatus,
    TurnInfo,
    TurnStatus,
)
from core.store import statements as st
from core.store.control import queue_mode_of
from core.store.conversations import resume_interrupted, transcript
from core.store.database import Database
from core.store.intake import Accepted, Arrival, Intake, waiting_messages
from core.store.leases import LeaseTake
from core.store.row_views import answer_optional, session_info, trace_context, turn_info, turn_outcome
from core.store.tables import InputRow, MessageRow, ProcessedEventRow, SessionRow, TurnRow


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
    attachments: tuple[Attachment, ...] = ()  # files shared with them, to be read before the model is asked
    transcript: tuple[Row[Any], ...] | None = None  # asked for with ``history``: the model's view
    secrets: tuple[object, ...] | None = None  # with ``history``: the stored secrets' fingerprint then
    more: bool = False  # messages still wait behind this batch (followup, or past the budget)
    resumed: bool = False  # an interrupted turn continued (it takes nothing new)
    senders: tuple[str, ...] = ()  # who wrote the inputs taken now (trust: a steered turn runs at the lowest)
    # Each input taken now: its text, and whether it addressed the bot (a message, not context), in arrival order.
    parts: tuple[tuple[str, bool], ...] = ()


@dataclass(frozen=True)
class HeldElsewhere:
    """``take_batch`` found the session's lease held by another replica: it runs the session's turns.
    ``waiting``: messages of the session wait (that replica takes them, or this one once it is free)."""

    waiting: bool


_inputs = InputRow.__table__  # type: ignore[attr-defined]
_sessions = SessionRow.__table__  # type: ignore[attr-defined]
_turns = TurnRow.__table__  # type: ignore[attr-defined]
_messages = MessageRow.__table__  # type: ignore[attr-defined]


class InputStore:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.intake = Intake(db)

    # -- arrival --------------------------------------------------------------------------------

    async def accept(
        self, msg: Inbound, *, kind: str, agent: str, refuse: str | None, max_waiting: int, now: datetime,
        refuse_if_paused: str | None = None, listen_per_minute: int | None = None, trace_context: str | None = None,
    ) -> Accepted:
        """Take one inbound message in: dedupe, then store it as waiting, a command, context, or refused
        (``refuse`` is the operator's reason; ``refuse_if_paused`` the one given while intake is paused;
        ``trace_context`` the traceparent of its intake's span, core.tracing).
        Committed together with whatever else arrived meanwhile (core.store.intake)."""
        return await self.intake.accept(Arrival(msg, kind, agent, refuse, max_waiting, now, refuse_if_paused,
                                                listen_per_minute, trace_context))

    async def prune_deliveries(self, older_than: datetime) -> int:
        async with self.db.write() as s:
            result = await s.exec(delete(ProcessedEventRow).where(col(ProcessedEventRow.received_at) < older_than))
            return int(result.rowcount or 0)

    # -- turns taking inputs --------------------------------------------------------------------

    async def take_batch(self, session_id: str, default_mode: str, budget: Budget, now: datetime, *,
                         resume: bool = False, history: int = 0,
                         lease: LeaseTake | Callable[[Session], bool] | None = None) -> Taken | HeldElsewhere | None:
        """Start a turn with the oldest waiting inputs: one message (followup) or as many as the budget
        holds (steer, collect), with the context recorded before it. None when no message waits.
        With ``resume``, a turn a dead process left interrupted comes first (continued, taking nothing).
        With ``history``, the newest that many messages of the transcript come along (read in the same
        transaction: the model's view of the conversation, the batch included), and the stored secrets'
        fingerprint (the masks' check needs no query of its own).
        With ``lease`` (taking the session's lease, False when another replica holds it), the lease is taken
        first in the same transaction: one commit starts the turn under it (a LeaseTake: on PostgreSQL in the
        statement that reads the session). An input another replica took meanwhile: nothing is taken (rolled
        back), and it says another replica runs them."""

        def work(s: Session) -> Taken | HeldElsewhere | None:
            conn = s.connection()
            postgres = conn.dialect.name == "postgresql"
            folded = postgres and isinstance(lease, LeaseTake)  # the lease taken in the head's read (one trip less)
            if lease is not None and not folded and not lease(s):
                return HeldElsewhere(waiting_messages(s, session_id) > 0)
            # The session with its interrupted turn, its place's queue mode and the secrets' fingerprint: one read,
            # on PostgreSQL with the conversation's senders too (SENDERS: one round trip less), and the lease.
            if folded:
                assert isinstance(lease, LeaseTake)
                head = conn.execute(st.SESSION_FOR_TURN_UNDER_LEASE,
                                    {"b_session": session_id, **lease.params()}).first()
                assert head is not None  # always one row
                if not head.lease_taken:
                    return HeldElsewhere(waiting_messages(s, session_id) > 0)
                if head.id is None:  # no such conversation (the one row the read always returns)
                    return None
            else:
                read: Select[Any] = st.SESSION_FOR_TURN_WITH_SENDERS if postgres else st.SESSION_FOR_TURN
                head = conn.execute(read, {"b_session": session_id}).first()
            if head is None:  # no such conversation: nothing waits in it
                return None
            interrupted = head.interrupted_turn if resume else None
            resumed = None if interrupted is None else resume_interrupted(
                s, session_id, now, found=(interrupted, head.interrupted_message))
            # After a resumed turn, look again: messages may have waited behind it since before the restart.
            taken = Taken(resumed, "", (), (), more=True, resumed=True) if resumed is not None else take_batch(
                s, session_id, default_mode, budget, now, head=head)
            if taken is not None and history:
                taken = replace(taken, transcript=tuple(transcript(s, session_id, history)),
                                secrets=taken.secrets if taken.secrets is not None else st.secrets_fingerprint(s))
            elif taken is not None:
                taken = replace(taken, secrets=None)
            return taken

        # A turn waits on it to ask the model: ahead of the writes nobody waits on (receipts, transcript).
        try:
            return await self.db.run_write(work, urgent=True)
        except TakenElsewhere:  # rolled back: another replica took an input (its lease) meanwhile, and runs them
            return HeldElsewhere(waiting=True)

    async def take_steered(self, turn_id: int, default_mode: str, budget: Budget, now: datetime) -> Taken | None:
        """Hand what waits to the running turn at its tool step (steer mode only); None when nothing does."""

        def work(s: Session) -> Taken | None:
            conn = s.connection()
            turn = conn.execute(sa_select(_turns.c.session_id, _turns.c.status, _turns.c.input_message_id)
                                .where(_turns.c.id == turn_id)).one()
            waiting = _waiting(s, turn.session_id)
            if not waiting or turn.status != TurnStatus.RUNNING:
                return None
            session = conn.execute(st.SESSION, {"b_session": turn.session_id}).one()
            if (queue_mode_of(s, session) or default_mode) != QueueMode.STEER:
                return None
            batch = _fit(waiting, budget, one_message=False)
            if any(i.kind == InputKind.MESSAGE and not i.answer_optional for i in batch) and answer_optional(
                    conn.execute(st.TURN_INPUTS, {"b_turn": turn_id}).all()):
                # A turn that may end silently never takes in a question someone asked: it gets a turn of its own,
                # which answers it (next, once this one ends).
                return None
            _take(s, turn_id, batch, now)
            return _taken(turn_info(s, turn_id, turn.input_message_id, session_info(session)), batch)

        try:
            return await self.db.run_write(work)
        except TakenElsewhere:  # rolled back: nothing taken in at this step
            return None

    async def last_arrival(self, session_id: str) -> datetime | None:
        value = await self.db.run_read(
            lambda s: s.connection().execute(st.LAST_ARRIVAL, {"b_session": session_id}).scalar())
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

    async def note(self, input_id: int, text: str) -> None:
        async with self.db.write() as s:
            await s.exec(update(InputRow).where(col(InputRow.id) == input_id).values(note=text))

    async def latest_live_session(self, place: str) -> str | None:
        """The most recently active conversation at a place that is working or has messages waiting."""
        live = await self.live_sessions(place, limit=1)
        return live[0] if live else None

    async def live_sessions(self, place: str, *, limit: int) -> list[str]:
        """Conversations at a place that are working or have messages waiting, the most recently active first."""
        async with self.db.read() as s:
            busy = select(TurnRow.session_id).where(TurnRow.status == TurnStatus.RUNNING)
            waiting = select(InputRow.session_id).where(InputRow.status == InputStatus.WAITING,
                                                        InputRow.kind == InputKind.MESSAGE)
            row = await s.exec(
                select(SessionRow.id)
                .where(SessionRow.place == place,
                       col(SessionRow.id).in_(busy) | col(SessionRow.id).in_(waiting))
                .order_by(col(SessionRow.updated_at).desc())
                .limit(limit)
            )
            return list(row.all())

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


def take_batch(s: Session, session_id: str, default_mode: str, budget: Budget, now: datetime, *,
               head: Row[Any] | None = None) -> Taken | None:
    """``head``: the session's ``SESSION_FOR_TURN`` row, if the caller read it already in this transaction."""
    waiting = _waiting(s, session_id)
    if not any(i.kind == InputKind.MESSAGE for i in waiting):
        return None
    conn = s.connection()
    session = head if head is not None else conn.execute(st.SESSION_FOR_TURN, {"b_session": session_id}).one()
    mode = session.queue_mode or (session.place_queue_mode if session.place else None) or default_mode
    batch = _fit(waiting, budget, one_message=mode == QueueMode.FOLLOWUP)
    written: list[int] = []
    if conn.dialect.name == "postgresql" and len(batch) == 1 and batch[0].message_id is None:
        # The usual turn (one mention): started with its input taken in one statement (one round trip, not two)
        item = batch[0]
        started = conn.execute(st.START_TURN_TAKING_ONE, dict(
            t_session=session_id, t_agent=session.agent, t_now=now, b_input=item.id, m_session=item.session_id,
            m_content=item.text, m_sender=item.sender, m_channel=item.platform_channel, m_ts=item.platform_ts,
            m_key=item.idempotency_key)).first()
        if started is None:
            raise TakenElsewhere(item.id)
        turn_id, written = int(started.turn_id), [int(started.message_id)]
    elif conn.dialect.name == "postgresql":  # one round trip for both (statements.START_TURN)
        turn_id = int(conn.execute(st.START_TURN, dict(t_session=session_id, t_agent=session.agent,
                                                       t_now=now)).scalar_one())
    else:
        turn_id = int(conn.execute(st.INSERT_TURN, dict(
            session_id=session_id, agent=session.agent, status=TurnStatus.RUNNING, attempts=1, created_at=now,
            started_at=now)).inserted_primary_key[0])  # type: ignore[index]
        conn.execute(st.UPDATE_SESSION, {"b_session": session_id, "status": SessionStatus.RUNNING})
    if not written:
        written = _take(s, turn_id, batch, now)
    # A new turn holds exactly this batch (context and control inputs are never "waiting" controls).
    messages = [i for i in batch if i.kind == InputKind.MESSAGE]
    asked = tuple(m for i, m in zip(batch, written, strict=True) if i.kind == InputKind.MESSAGE)
    more = len(waiting) >= st.WAITING_READ or any(i.kind == InputKind.MESSAGE for i in waiting[len(batch):])
    info = replace(session_info(session), status=SessionStatus.RUNNING)
    refs = tuple(MessageRef(i.platform_channel, i.platform_ts) for i in batch)
    sender = messages[0].sender if messages else batch[0].sender
    turn = TurnInfo(id=turn_id, session=info, inputs=refs, sender=sender, input_ids=tuple(i.id for i in batch),
                    senders=senders_of(batch), everyone=conversation_senders(
                        s, session_id, senders_of(batch),
                        earlier=session.senders or () if "senders" in session._mapping else None),
                    asked=asked, answer_optional=answer_optional(batch), trace_context=trace_context(batch))
    return replace(_taken(turn, batch), more=more, secrets=tuple(session[-st.FINGERPRINT_COLUMNS:]))


def conversation_senders(s: Session, session_id: str, first: tuple[str, ...] = (), *,
                         earlier: Sequence[str] | None = None) -> tuple[str, ...]:
    """``first``, then everyone else whose words are in the conversation (earlier turns, context), each once.
    ``earlier``: SENDERS' result, when the caller read it in this transaction."""
    if earlier is None:
        earlier = s.connection().execute(st.SENDERS, {"b_session": session_id}).scalars().all()
    return tuple(dict.fromkeys((*first, *sorted(earlier))))


def senders_of(inputs: Sequence[Row[Any]]) -> tuple[str, ...]:
    """Who wrote the inputs whose words reach the model (controls never do), each once, in order."""
    return tuple(dict.fromkeys(i.sender for i in inputs if i.sender and i.kind != InputKind.CONTROL))


def _take(s: Session, turn_id: int, batch: Sequence[Row[Any]], now: datetime) -> list[int]:
    """The batch joins the turn: each input becomes a user message of the transcript (once). Returns their ids."""
    conn = s.connection()
    written = []
    together = conn.dialect.name == "postgresql"  # the message and the input's update: one round trip
    for item in batch:
        message_id = item.message_id
        if message_id is None and together:
            message_id = conn.execute(st.TAKE_INPUT, dict(
                b_input=item.id, t_turn=turn_id, t_now=now, m_session=item.session_id, m_content=item.text,
                m_sender=item.sender, m_channel=item.platform_channel, m_ts=item.platform_ts,
                m_key=item.idempotency_key)).scalar()
            if message_id is None:
                raise TakenElsewhere(item.id)
            written.append(int(message_id))
            continue
        if message_id is None:
            message_id = conn.execute(st.INSERT_MESSAGE, dict(
                session_id=item.session_id, role="user", content=item.text, sender=item.sender,
                platform_channel=item.platform_channel, platform_ts=item.platform_ts,
                idempotency_key=item.idempotency_key, turn_id=turn_id, created_at=now,
            )).inserted_primary_key[0]  # type: ignore[index]
        result: Any = conn.execute(st.TAKE_WAITING_INPUT, dict(
            b_input=item.id, status=InputStatus.TAKEN, turn_id=turn_id, taken_at=now, message_id=message_id))
        if not result.rowcount:
            raise TakenElsewhere(item.id)
        written.append(int(message_id))
    return written


class TakenElsewhere(Exception):
    """An input read as waiting was taken by someone else before this transaction could (another replica, whose
    lease ran out under a stalled holder): the transaction rolls back, nothing of it is taken twice."""


def _taken(turn: TurnInfo, batch: Sequence[Row[Any]]) -> Taken:
    images = tuple(image for i in batch if i.images for image in json.loads(i.images))
    attachments = tuple(a for i in batch if i.attachments for a in _attachments(i.attachments))
    text = "\n\n".join(i.text for i in batch if i.text)
    refs = tuple(MessageRef(i.platform_channel, i.platform_ts) for i in batch)
    parts = tuple((i.text or "", i.kind == InputKind.MESSAGE) for i in batch)
    return Taken(turn, text, images, refs, attachments=attachments, senders=senders_of(batch), parts=parts)


def _attachments(raw: str) -> list[Attachment]:
    """The stored attachments, read tolerantly: an entry that is not one (written by another version) is
    skipped, never a reason to fail the turn that takes it."""
    found = []
    for item in json.loads(raw):
        if isinstance(item, dict) and isinstance(item.get("name"), str) and isinstance(item.get("source"), str):
            size = item.get("size")
            found.append(Attachment(name=item["name"], mimetype=str(item.get("mimetype") or ""),
                                    size=size if type(size) is int else None, source=item["source"]))
    return found


def _fit(waiting: Sequence[Row[Any]], budget: Budget, *, one_message: bool) -> list[Row[Any]]:
    """The longest prefix that fits the budget, always reaching the first message (a large one runs
    alone, and context recorded before it never makes a turn of its own)."""
    batch: list[Row[Any]] = []
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


def _waiting(s: Session, session_id: str) -> Sequence[Row[Any]]:
    return s.connection().execute(st.WAITING, {"b_session": session_id}).all()
