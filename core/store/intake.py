"""Arrival of inputs, committed in groups: every message that arrives while one transaction is being
written goes into the next one, and each caller returns only once its own group has committed."""

from __future__ import annotations

import asyncio
import enum
import functools
import json
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from types import SimpleNamespace
from typing import Any, Generic, TypeVar

from sqlalchemy import Row, Select, bindparam, case, select, true
from sqlalchemy.dialects import postgresql
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlmodel import Session

from core.errors import InvalidInput
from core.model import VIEW_KEY, Inbound, InputKind, InputStatus, SessionInfo, SessionStatus
from core.store import statements as st
from core.store.control import INTAKE_PAUSED
from core.store.database import Database
from core.store.listen_rates import ListenRates
from core.store.row_views import session_info

MAX_GROUP = 256  # inputs per transaction: a burst larger than this is written in several



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
class Arrival:
    """One inbound message and what to do with it. ``refuse`` is an operator's reason to refuse it;
    ``refuse_if_paused`` is the reason given when intake turns out to be paused (read in the same
    transaction that stores it). ``listen_per_minute``: an unaddressed message in a listening place
    (``Inbound.listen_per_minute``), stored as a message whose answer is optional while its place's minute has room,
    else as context."""

    msg: Inbound
    kind: str
    agent: str
    refuse: str | None
    max_waiting: int
    now: datetime
    refuse_if_paused: str | None = None
    listen_per_minute: int | None = None
    trace_context: str | None = None  # its intake span's traceparent (core.tracing), stored with it


Req = TypeVar("Req")
Res = TypeVar("Res")


class GroupCommit(Generic[Req, Res]):
    """Callers queue requests; a writer task (``writers`` of them at most) writes whatever is queued in one
    transaction (``write`` returns a result or an exception per request) and wakes each caller once that
    transaction committed. Nothing waits for a window to fill: the first request goes at once, the rest
    gather behind it."""

    def __init__(self, write: Callable[[list[Req]], Awaitable[list[Res | Exception]]],
                 max_group: int = MAX_GROUP, writers: int = 1) -> None:
        self._write = write
        self._max = max_group
        self._writers = writers  # groups written at once (SQLite: one writer anyway; PostgreSQL: several)
        self._queue: list[tuple[Req, asyncio.Future[Res]]] = []
        self._drainers: set[asyncio.Task[None]] = set()
        self.groups = 0  # transactions written (``requests / groups``: how much a commit is shared)
        self.requests = 0

    async def submit(self, request: Req) -> Res:
        future: asyncio.Future[Res] = asyncio.get_running_loop().create_future()
        self._queue.append((request, future))
        # A writer that has just finished may not have been forgotten yet (done callbacks run later).
        self._drainers = {drainer for drainer in self._drainers if not drainer.done()}
        if len(self._drainers) < self._writers:
            self._drainers.add(asyncio.create_task(self._drain(), name="group-commit"))
        return await future

    async def _drain(self) -> None:
        while self._queue:
            group, self._queue = self._queue[:self._max], self._queue[self._max:]
            group = [(request, future) for request, future in group if not future.done()]  # callers gone: unwritten
            if not group:
                continue
            self.groups, self.requests = self.groups + 1, self.requests + len(group)
            try:
                results = await self._write([request for request, _ in group])
            except Exception as exc:  # the transaction failed as a whole: nothing of it was stored
                results = [exc] * len(group)
            for (_, future), result in zip(group, results, strict=True):
                if future.done():  # its caller went away; what committed stays committed
                    continue
                if isinstance(result, Exception):
                    future.set_exception(result)
                else:
                    future.set_result(result)


class Intake:
    """``accept`` for every inbound message: deduplicated and stored before it returns."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.listen_rates = ListenRates(db)
        self._group: GroupCommit[Arrival, Accepted] = GroupCommit(self._write, writers=1 if db.is_sqlite else 4)

    async def accept(self, arrival: Arrival) -> Accepted:
        return await self._group.submit(arrival)

    @property
    def commits(self) -> GroupCommit[Arrival, Accepted]:
        return self._group

    async def _write(self, arrivals: list[Arrival]) -> list[Accepted | Exception]:
        return await written_apart(self._write_group, arrivals)

    async def _write_group(self, group: list[Arrival]) -> list[Accepted | Exception]:
        if len(group) == 1 and new_arrival_fits(self.db, group[0]):
            return await self._write_alone(group[0])
        return await self.db.run_write(lambda s: _accept_group(s, self.db, self.listen_rates, group), urgent=True)

    async def _write_alone(self, arrival: Arrival) -> list[Accepted | Exception]:
        """PostgreSQL, an arrival alone in its group (issue 39): ``new_arrival`` run alone, so a new conversation's
        first input is committed before the server answers (one round trip, not five). For a conversation that exists
        it wrote nothing, and the usual transaction follows with what it read (as fresh as a statement inside that
        transaction would have read it: READ COMMITTED)."""
        [row] = await self.db.run_alone(new_arrival(arrival.msg.delivery_key is not None), _new_arrival_params(arrival))
        stored = _new_arrival_outcome(arrival, row)
        if stored is not None:
            return [stored]
        return await self.db.run_write(
            lambda s: _accept_group(s, self.db, self.listen_rates, [arrival], known=row), urgent=True)


async def written_apart(write: Callable[[list[Req]], Awaitable[list[Res | Exception]]], group: list[Req], *,
                        retried: bool = False) -> list[Res | Exception]:
    """``write`` the group in one transaction. When another replica stored the same row at the same moment
    (IntegrityError), one at a time, each read again (a lone one once more): it turns out to be a duplicate, or
    finds the row now there. When the transaction failed otherwise (e.g. a serialization failure), one at a
    time too, so one request's trouble is only its own."""
    try:
        return await write(group)
    except IntegrityError:
        if len(group) > 1:
            return [result for one in group for result in await written_apart(write, [one])]
        if retried:
            raise
        return await written_apart(write, group, retried=True)
    except DBAPIError:
        if len(group) == 1:
            raise
        return [result for one in group for result in await written_apart(write, [one])]


def _accept_group(s: Session, db: Database, rates: ListenRates, arrivals: list[Arrival], *,
                  known: Row[Any] | None = None) -> list[Accepted | Exception]:
    """``known``: the first arrival's ``new_arrival`` row (its session, which exists, and the pause), read just
    before this transaction."""
    paused: bool | None = None
    results: dict[int, Accepted | Exception] = {}
    # Sessions are written in the order of their ids (arrival order within one): two replicas committing
    # groups that touch the same conversations lock their rows in the same order, and never deadlock.
    for index in sorted(range(len(arrivals)), key=lambda i: arrivals[i].msg.session_id):
        arrival = arrivals[index]
        head: tuple[Row[Any] | None] | None = None  # this arrival's session, when read with the pause
        row: Row[Any] | None = known if index == 0 else None
        if row is None and new_arrival_fits(db, arrival):
            # PostgreSQL: a new conversation's first input stored in the statement that finds there is none
            row = s.connection().execute(new_arrival(arrival.msg.delivery_key is not None),
                                         _new_arrival_params(arrival)).one()
            stored = _new_arrival_outcome(arrival, row)
            if stored is not None:
                results[index] = stored
                continue
        if row is not None:  # the conversation exists; the pause as fresh as it comes
            paused, head = row.intake_paused == "1", (row,)
        asks = arrival.refuse_if_paused is not None and arrival.refuse is None
        if paused is None and (asks or arrival.listen_per_minute is not None):
            # Read once per group, with the first session that needs it (one round trip, not two).
            row = s.connection().execute(SESSION_AND_PAUSED, {"b_session": arrival.msg.session_id}).one()
            paused, head = row.intake_paused == "1", (row if row.id is not None else None,)
        if asks and paused:
            assert arrival.refuse_if_paused is not None
            arrival = _refused(arrival, arrival.refuse_if_paused)
        if arrival.listen_per_minute is not None and paused:
            # nobody asked: no refusal to tell, the message is only context
            arrival = replace(arrival, kind=InputKind.CONTEXT, listen_per_minute=None)
        try:
            results[index] = _accept_one(s, db, rates, arrival, head)
        except InvalidInput as exc:  # raised before the input wrote anything: the rest of its group stands
            results[index] = exc
    return [results[i] for i in range(len(arrivals))]


# The session an arrival is for (all its columns NULL when there is none yet) and whether intake is paused
# (``intake_paused``): one read, for the first arrival of a group that needs the pause.
SESSION_AND_PAUSED: Select[Any] = (
    select(select(st.control.c.value).where(st.control.c.key == INTAKE_PAUSED).scalar_subquery().label("intake_paused"),
           *st.sessions.c, st.ONE_ROW.c.one)
    .select_from(st.ONE_ROW.outerjoin(st.sessions, st.sessions.c.id == bindparam("b_session"))))


def _refused(arrival: Arrival, reason: str) -> Arrival:
    return Arrival(arrival.msg, arrival.kind, arrival.agent, reason, arrival.max_waiting, arrival.now,
                   trace_context=arrival.trace_context)


def _accept_one(s: Session, db: Database, rates: ListenRates, arrival: Arrival,
                head: tuple[Row[Any] | None] | None = None) -> Accepted:
    """Dedupe, then store the input as waiting, a command, context, or refused. ``head``: its session (or None: a
    new one), when the caller read it already in this transaction."""
    msg, kind, now = arrival.msg, arrival.kind, arrival.now
    conn = s.connection()
    found = head[0] if head is not None else conn.execute(st.SESSION, {"b_session": msg.session_id}).first()
    if found is not None and msg.agent is not None and msg.agent != found.agent:
        # Refused before anything is written, so the group it came with is stored without it.
        raise InvalidInput(f"this conversation belongs to agent {found.agent!r}, not {msg.agent!r}")
    if msg.delivery_key is not None:
        # The first delivery claims the event's key; a redelivery inserts nothing.
        claim = db.insert_or_ignore(st.processed)
        if not conn.execute(claim, {"key": msg.delivery_key, "received_at": now}).rowcount:
            return Accepted(AcceptOutcome.DUPLICATE)
    new_session = found is None
    together = conn.dialect.name == "postgresql"
    if found is not None and msg.idempotency_key is not None:
        seen_id = conn.execute(st.INPUT_BY_KEY, {"b_session": msg.session_id, "b_key": msg.idempotency_key}).scalar()
        if seen_id is not None:
            return Accepted(AcceptOutcome.DUPLICATE, seen_id, session_info(found))
    optional = False
    if arrival.listen_per_minute is not None and kind == InputKind.MESSAGE:
        # Counted only once it is known to be new (a redelivery, or its mention's twin event, counts nothing).
        # A conversation already full of waiting messages, or a place past its minute's turns: context only, and
        # nobody is told (nobody asked).
        if (not new_session and waiting_messages(s, msg.session_id) >= arrival.max_waiting) or not rates.admit(
                s, msg.place or msg.session_id, now, arrival.listen_per_minute):
            kind = InputKind.CONTEXT
        else:
            optional = True
    if found is None:
        if kind == InputKind.CONTEXT and not msg.view_context:
            return Accepted(AcceptOutcome.IGNORED)
        values = _new_session_values(arrival)
        if not together:
            conn.execute(st.INSERT_SESSION, values)
        info = session_info(SimpleNamespace(**values))
    else:
        info = session_info(found)
    if msg.view_context and not new_session:  # only the newest view waits: one line, not a day of them
        conn.execute(st.REPLACE_VIEWS, {"b_session": msg.session_id, "b_view": f"{VIEW_KEY}%",
                                        "status": InputStatus.CANCELLED, "note": "replaced by a newer view"})
    status, outcome, note = _verdict(kind, arrival.refuse)
    if (outcome == AcceptOutcome.QUEUED and not new_session
            and waiting_messages(s, msg.session_id) >= arrival.max_waiting):
        note = (f"I'm busy: {arrival.max_waiting} messages in this conversation are already waiting for me. "
                "Send this again once I've answered them.")
        status, outcome = InputStatus.REFUSED, AcceptOutcome.REFUSED
    # On PostgreSQL a new conversation is inserted with its first input (one round trip).
    with_session = together and new_session
    insert, extra = ((st.INSERT_INPUT_OF_NEW_SESSION, {f"s_{k}": v for k, v in values.items()})
                     if with_session else (st.INSERT_INPUT, {}))
    inserted = conn.execute(insert, extra | _input_values(arrival, kind, optional) | dict(status=status, note=note))
    if not new_session:
        conn.execute(st.UPDATE_SESSION, {"b_session": msg.session_id, "updated_at": now})
    input_id = int(inserted.scalar_one() if with_session else inserted.inserted_primary_key[0])  # type: ignore[index]
    return Accepted(outcome, input_id, info, note)


def _verdict(kind: str, refuse: str | None) -> tuple[str, AcceptOutcome, str | None]:
    """How an input that is new is stored (its status, the outcome, the note), before the check for a conversation
    already full of waiting messages (which only a QUEUED one gets)."""
    if kind == InputKind.CONTEXT:
        return InputStatus.WAITING, AcceptOutcome.RECORDED, None
    if kind == InputKind.CONTROL:
        return InputStatus.TAKEN, AcceptOutcome.COMMAND, None
    if refuse is not None:
        return InputStatus.REFUSED, AcceptOutcome.REFUSED, refuse
    return InputStatus.WAITING, AcceptOutcome.QUEUED, None


def _new_session_verdict(arrival: Arrival, *, paused: bool) -> tuple[str, AcceptOutcome, str | None]:
    """``_verdict`` for the first input of a new conversation, with intake paused or not (``_accept_group``'s rule)."""
    refuse = arrival.refuse
    if refuse is None and paused and arrival.refuse_if_paused is not None:
        refuse = arrival.refuse_if_paused
    return _verdict(arrival.kind, refuse)


def new_arrival_fits(db: Database, arrival: Arrival) -> bool:
    """Whether ``new_arrival`` can store the arrival: on PostgreSQL, a message or a command, whose storing in a new
    conversation the pause alone decides (no listening place's minute, no view to replace)."""
    return (not db.is_sqlite and arrival.kind in (InputKind.MESSAGE, InputKind.CONTROL)
            and arrival.listen_per_minute is None and not arrival.msg.view_context)


def _new_arrival_params(arrival: Arrival) -> dict[str, Any]:
    """``new_arrival``'s parameters: the session and input as a new conversation stores them, paused or not."""
    msg = arrival.msg
    if_running, if_paused = _new_session_verdict(arrival, paused=False), _new_session_verdict(arrival, paused=True)
    return {"b_session": msg.session_id, "a_key": msg.delivery_key, "a_now": arrival.now,
            **{f"s_{name}": value for name, value in _new_session_values(arrival).items()},
            **{f"i_{name}": value for name, value in _input_values(arrival, arrival.kind).items()},
            "a_status": if_running[0], "a_note": if_running[2], "a_status_paused": if_paused[0],
            "a_note_paused": if_paused[2]}


def _new_arrival_outcome(arrival: Arrival, row: Row[Any]) -> Accepted | None:
    """What ``new_arrival``'s row says: the input stored in a new conversation, a redelivery, or None: the
    conversation exists, and nothing was written."""
    if row.id is not None:
        return None
    if row.input_id is None:  # its event's key was claimed before
        return Accepted(AcceptOutcome.DUPLICATE)
    _status, outcome, note = _new_session_verdict(arrival, paused=row.intake_paused == "1")
    return Accepted(outcome, int(row.input_id), session_info(SimpleNamespace(**_new_session_values(arrival))), note)


def _new_session_values(arrival: Arrival) -> dict[str, Any]:
    msg, now = arrival.msg, arrival.now
    return dict(
        id=msg.session_id, channel=msg.channel, agent=msg.agent or arrival.agent, status=SessionStatus.IDLE,
        reply_ref=json.dumps(msg.reply_ref), place=msg.place, created_at=now, updated_at=now,
        preapproved=json.dumps([list(p) for p in msg.preapproved]) if msg.preapproved else None,
        queue_mode=None,
    )


def _input_values(arrival: Arrival, kind: str, optional: bool = False) -> dict[str, Any]:
    """An input's columns but its status and note."""
    msg = arrival.msg
    return dict(
        session_id=msg.session_id, kind=kind, text=msg.text,
        images=json.dumps(list(msg.images)) if msg.images else None,
        attachments=json.dumps([asdict(a) for a in msg.attachments]) if msg.attachments else None, sender=msg.sender,
        agent=msg.agent, platform_channel=msg.ref.channel, platform_ts=msg.ref.ts,
        idempotency_key=msg.idempotency_key, created_at=arrival.now, answer_optional=optional,
        trace_context=arrival.trace_context,
    )


_SESSION_COLUMNS = ("id", "channel", "agent", "status", "reply_ref", "place", "created_at", "updated_at", "preapproved",
                    "queue_mode")
_INPUT_COLUMNS = ("session_id", "kind", "text", "images", "attachments", "sender", "agent", "platform_channel",
                  "platform_ts", "idempotency_key", "created_at", "answer_optional", "trace_context")


@functools.cache
def new_arrival(claims: bool) -> Select[Any]:
    """PostgreSQL: SESSION_AND_PAUSED (always one row), and when there is no such session yet, in the same statement:
    the event's key claimed (``claims``; ``a_key``, ``a_now``), then, unless a redelivery's claim found it taken, the
    session (``s_`` columns) with its input (``i_`` columns; status and note ``a_status``/``a_note``, or
    ``a_status_paused``/``a_note_paused`` when intake is paused). ``input_id``: the input stored, else NULL. When
    two replicas store the same new conversation at once, the second statement fails as a whole (the session's key)
    and nothing of it is stored (``written_apart`` reads again)."""
    head = SESSION_AND_PAUSED.cte("head")
    if claims:
        claim = (postgresql.insert(st.processed).from_select(
            ["key", "received_at"],
            select(bindparam("a_key", type_=st.processed.c.key.type),
                   bindparam("a_now", type_=st.processed.c.received_at.type)).where(
                select(head.c.one).where(head.c.id.is_(None)).exists()))
            .on_conflict_do_nothing().returning(st.processed.c.key).cte("claim"))
        new_only = select(claim.c.key).exists()  # claimed now: new, and not a redelivery
    else:
        new_only = select(head.c.one).where(head.c.id.is_(None)).exists()
    session = (st.sessions.insert().from_select(
        list(_SESSION_COLUMNS),
        select(*(bindparam(f"s_{name}", type_=st.sessions.c[name].type) for name in _SESSION_COLUMNS)).where(new_only),
        include_defaults=False).returning(st.sessions.c.id).cte("new_session"))
    paused = head.c.intake_paused == "1"
    stored = (st.inputs.insert().from_select(
        [*_INPUT_COLUMNS, "status", "note"],
        select(*(bindparam(f"i_{name}", type_=st.inputs.c[name].type) for name in _INPUT_COLUMNS),
               case((paused, bindparam("a_status_paused", type_=st.inputs.c.status.type)),
                    else_=bindparam("a_status", type_=st.inputs.c.status.type)),
               case((paused, bindparam("a_note_paused", type_=st.inputs.c.note.type)),
                    else_=bindparam("a_note", type_=st.inputs.c.note.type)))
        .select_from(session.join(head, true())), include_defaults=False)
        .returning(st.inputs.c.id).cte("new_input"))
    return select(head, select(stored.c.id).scalar_subquery().label("input_id"))


def waiting_messages(s: Session, session_id: str) -> int:
    return int(s.connection().execute(st.WAITING_MESSAGES, {"b_session": session_id}).scalar_one())
