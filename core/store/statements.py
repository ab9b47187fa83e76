"""The hot paths' statements, built once (SPEC §15).

Building a statement per call (``select(...).where(col == value)``) coerces every clause and computes its
cache key each time: about three quarters of the Python time of a short transaction, spent on the
writer thread that holds the GIL against the event loop. Built once with ``bindparam``, a statement
keeps its cache key, and each execution only binds values. The SET of an update and the columns of an
insert come from the parameters given (``b_`` names are the WHERE's, so they never meet a column's).
Both dialects compile them (the compiled form is cached per dialect).
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import Select, bindparam, delete, exists, func, literal, select, true, update
from sqlalchemy.dialects import postgresql

from core.model import DeliveryStatus, InputKind, InputStatus, SessionStatus, TurnStatus
from core.store.connection_tables import ConnectionRow
from core.store.tables import (
    ControlRow,
    DeliveryRow,
    InputRow,
    LeaseRow,
    MessageRow,
    ProcessedEventRow,
    SecretRow,
    SessionRow,
    TurnRow,
    UsageRow,
)

sessions = SessionRow.__table__  # type: ignore[attr-defined]
turns = TurnRow.__table__  # type: ignore[attr-defined]
inputs = InputRow.__table__  # type: ignore[attr-defined]
messages = MessageRow.__table__  # type: ignore[attr-defined]
deliveries = DeliveryRow.__table__  # type: ignore[attr-defined]
control = ControlRow.__table__  # type: ignore[attr-defined]
processed = ProcessedEventRow.__table__  # type: ignore[attr-defined]
secrets = SecretRow.__table__  # type: ignore[attr-defined]
usage = UsageRow.__table__  # type: ignore[attr-defined]
leases = LeaseRow.__table__  # type: ignore[attr-defined]

WAITING_READ = 500  # waiting inputs read at once (a batch never holds more)


def held(turn_id: Any, holder: Any, attempt: Any) -> tuple[Any, ...]:
    """The delivery row is pending and still claimed by ``holder`` for its ``attempt``-th attempt: a result
    an attempt brings back after losing its claim (it ran out and another took the row) changes nothing.
    Values, or bind parameters for a statement built once."""
    return (deliveries.c.turn_id == turn_id, deliveries.c.status == DeliveryStatus.PENDING,
            deliveries.c.claimed_by == holder, deliveries.c.attempts == attempt)


# -- reads -------------------------------------------------------------------------------------------
SESSION = select(sessions).where(sessions.c.id == bindparam("b_session"))
CONTROL_VALUE = select(control.c.value).where(control.c.key == bindparam("b_key"))
# Everyone whose words are in a conversation (messages and context, never controls): a turn runs at the least
# trusted level among them (core.trust), read in the transaction that starts it.
SENDERS = (select(inputs.c.sender).where(inputs.c.session_id == bindparam("b_session"),
                                         inputs.c.kind != InputKind.CONTROL, inputs.c.sender.is_not(None))
           .distinct())
TURN_HEAD = select(turns.c.session_id, turns.c.input_message_id).where(turns.c.id == bindparam("b_turn"))
TURN_INPUTS = (select(inputs.c.id, inputs.c.kind, inputs.c.sender, inputs.c.platform_channel, inputs.c.platform_ts,
                      inputs.c.message_id, inputs.c.answer_optional, inputs.c.trace_context)
               .where(inputs.c.turn_id == bindparam("b_turn"), inputs.c.kind != InputKind.CONTROL)
               .order_by(inputs.c.id))
WAITING = (select(inputs).where(inputs.c.session_id == bindparam("b_session"), inputs.c.status == InputStatus.WAITING)
           .order_by(inputs.c.id).limit(WAITING_READ))
WAITING_MESSAGES = (select(func.count()).select_from(inputs)
                    .where(inputs.c.session_id == bindparam("b_session"), inputs.c.status == InputStatus.WAITING,
                           inputs.c.kind == InputKind.MESSAGE))
LAST_ARRIVAL = select(func.max(inputs.c.created_at)).where(inputs.c.session_id == bindparam("b_session"),
                                                      inputs.c.status == InputStatus.WAITING)
INPUT_BY_KEY = select(inputs.c.id).where(inputs.c.session_id == bindparam("b_session"),
                                         inputs.c.idempotency_key == bindparam("b_key"))
INTERRUPTED_TURN = (select(turns.c.id, turns.c.input_message_id)
                    .where(turns.c.session_id == bindparam("b_session"), turns.c.status == TurnStatus.QUEUED)
                    .order_by(turns.c.id).limit(1))
# Changes whenever a secret is stored, replaced, re-sealed or deleted: read with each turn's start, so the
# masks are known to be current without a query of their own (core.redaction).
_connections = ConnectionRow.__table__  # type: ignore[attr-defined]
# Connections' tokens are masked too: a new, refreshed or removed one changes this.
SECRETS_FINGERPRINT = select(func.count(), func.max(secrets.c.id), func.max(secrets.c.updated_at),
                             select(func.count()).select_from(_connections).scalar_subquery(),
                             select(func.max(_connections.c.updated_at)).scalar_subquery())
# The session a turn starts in, with what the start needs besides it in the same round trip: its place's queue mode
# (``place_queue_mode``: control's ``queue_mode:<place>``, see core.store.control), its interrupted turn if any
# (``interrupted_turn``, ``interrupted_message``: INTERRUPTED_TURN's) and the secrets' fingerprint (last).
_PLACE_QUEUE_MODE = (select(control.c.value).where(control.c.key == literal("queue_mode:") + sessions.c.place)
                     .scalar_subquery())
_interrupted = INTERRUPTED_TURN.where(turns.c.session_id == sessions.c.id)  # correlated: the session's own
SESSION_FOR_TURN = select(sessions, _PLACE_QUEUE_MODE.label("place_queue_mode"),
                          _interrupted.with_only_columns(turns.c.id).scalar_subquery().label("interrupted_turn"),
                          _interrupted.with_only_columns(turns.c.input_message_id).scalar_subquery().label(
                              "interrupted_message"),
                          *(column.scalar_subquery().label(f"fingerprint_{n}") for n, column in enumerate((
                              select(func.count()).select_from(secrets), select(func.max(secrets.c.id)),
                              select(func.max(secrets.c.updated_at)),
                              select(func.count()).select_from(_connections),
                              select(func.max(_connections.c.updated_at)))))).where(
    sessions.c.id == bindparam("b_session"))
FINGERPRINT_COLUMNS = 5
# PostgreSQL: with SENDERS too, as an array (``senders``: None when there are none), before the fingerprint. SQLite
# reads SENDERS on its own (an aggregate of its own would be text to split, and a sender's id is not ours to trust).
SESSION_FOR_TURN_WITH_SENDERS = SESSION_FOR_TURN.with_only_columns(
    *list(SESSION_FOR_TURN.selected_columns)[:-FINGERPRINT_COLUMNS],
    select(func.array_agg(inputs.c.sender.distinct())).where(
        inputs.c.session_id == bindparam("b_session"), inputs.c.kind != InputKind.CONTROL,
        inputs.c.sender.is_not(None)).scalar_subquery().label("senders"),
    *list(SESSION_FOR_TURN.selected_columns)[-FINGERPRINT_COLUMNS:])
# One row whatever is found: an outer join from it leaves the columns NULL when there is no such row.
ONE_ROW = select(literal(1).label("one")).subquery("one_row")


def _lease_upsert() -> postgresql.Insert:
    """LeaseStore's take (``l_``: name, holder, until, now): free, expired, or already ours (then extended)."""
    insert = postgresql.insert(leases).values(name=bindparam("l_name", type_=leases.c.name.type),
                                              holder=bindparam("l_holder", type_=leases.c.holder.type),
                                              expires_at=bindparam("l_until", type_=leases.c.expires_at.type))
    return insert.on_conflict_do_update(
        index_elements=["name"], set_={"holder": insert.excluded.holder, "expires_at": insert.excluded.expires_at},
        where=(leases.c.expires_at < bindparam("l_now", type_=leases.c.expires_at.type))
        | (leases.c.holder == insert.excluded.holder))


# PostgreSQL: SESSION_FOR_TURN_WITH_SENDERS with the session's lease taken in the same statement (issue 39: one round
# trip less per turn), ``lease_taken`` 1 when it is ours now, before the fingerprint. Always one row (the session's
# columns NULL when there is none): a lease held elsewhere is told apart from no conversation. A data-modifying WITH
# runs once, to completion, whatever the SELECT reads of it.
_lease_taken = _lease_upsert().returning(leases.c.name).cte("lease_taken")
_head_columns = list(SESSION_FOR_TURN_WITH_SENDERS.selected_columns)
SESSION_FOR_TURN_UNDER_LEASE: Select[Any] = (select(
    *_head_columns[:-FINGERPRINT_COLUMNS],
    select(func.count()).select_from(_lease_taken).scalar_subquery().label("lease_taken"),
    *_head_columns[-FINGERPRINT_COLUMNS:])
    .select_from(ONE_ROW.outerjoin(sessions, sessions.c.id == bindparam("b_session"))))
TRANSCRIPT = (select(messages).where(messages.c.session_id == bindparam("b_session"))
              .order_by(messages.c.id.desc()).limit(bindparam("b_limit")))

# -- writes (the SET or the columns: the parameters' other names) -------------------------------------------
UPDATE_SESSION = update(sessions).where(sessions.c.id == bindparam("b_session"))
UPDATE_TURN = update(turns).where(turns.c.id == bindparam("b_turn"))
# Writes that also read what they wrote (RETURNING: one round trip, not two; SQLite has it since 3.35)
UPDATE_SESSION_RETURNING = UPDATE_SESSION.returning(*sessions.c)
UPDATE_TURN_HEAD = UPDATE_TURN.returning(turns.c.session_id, turns.c.input_message_id)
# An input taken into a turn: only while it still waits (never taken twice, see TAKE_INPUT).
TAKE_WAITING_INPUT = update(inputs).where(inputs.c.id == bindparam("b_input"), inputs.c.status == InputStatus.WAITING)
# A view context still waiting (``VIEW_KEY`` keys) is replaced by a newer one.
REPLACE_VIEWS = update(inputs).where(inputs.c.session_id == bindparam("b_session"),
                                     inputs.c.status == InputStatus.WAITING, inputs.c.kind == InputKind.CONTEXT,
                                     inputs.c.idempotency_key.like(bindparam("b_view")))
UPDATE_HELD_DELIVERY = update(deliveries).where(
    *held(bindparam("b_turn"), bindparam("b_holder"), bindparam("b_attempt")))
# PostgreSQL: a delivery's landing (the held row settled, the turn's ``delivered_ref``) as one statement, run alone
# (``Database.run_alone``); it returns the turn's id when the claim still held. SQLite has no UPDATE in a WITH: there
# it is two statements in one transaction (core.store.deliveries).
_landed = (update(deliveries).where(*held(bindparam("b_turn"), bindparam("b_holder"), bindparam("b_attempt")))
           .values(status=DeliveryStatus.DELIVERED, ref=bindparam("b_ref"), claimed_by=None,
                   finished_at=bindparam("b_now"), last_error=None)
           .returning(deliveries.c.turn_id).cte("landed"))
DELIVERED_WITH_TURN = (update(turns).where(turns.c.id == _landed.c.turn_id)
                       .values(delivered_ref=bindparam("b_ref"), delivery_error=None).returning(turns.c.id))
INSERT_SESSION = sessions.insert()
INSERT_TURN = turns.insert()
INSERT_INPUT = inputs.insert()
INSERT_MESSAGE = messages.insert()
INSERT_DELIVERY = deliveries.insert()


def secrets_fingerprint(s: Any) -> tuple[object, ...]:
    """``SECRETS_FINGERPRINT``'s value, in the caller's transaction (a Session)."""
    return tuple(s.connection().execute(SECRETS_FINGERPRINT).one())


@functools.cache
def turn_end(answer_message: bool, outbox: bool, give_back: bool = False, count: bool = False) -> Select[Any]:
    """PostgreSQL: a turn's end as one statement (issue 39), in the transaction ``finish_turn`` opens: the turn's
    status, the session's (its row returned, with the turn's ``input_message_id``), and with ``answer_message`` the
    answer in the transcript, with ``outbox`` its outbox row claimed by ``o_holder`` until ``o_until``. SQLite has
    no INSERT or UPDATE inside WITH: there they are statements of their own (core.store.conversations).
    With ``give_back``, the session's lease (``l_name``, ``l_holder``, ``l_session``) is given back in it too unless a
    message of the session waits (core.store.leases.RELEASE_IF_IDLE's rule): ``lease_held`` says whether the holder
    held it (its row locked first, so a takeover committed meanwhile is seen), ``lease_released`` whether it went.
    With ``count``, the turn's last model call is added to its usage row (``u_``-prefixed ``core.store.usage``
    values, the same upsert as ``UsageStore``'s)."""
    now = bindparam("e_now", type_=turns.c.finished_at.type)
    answer = bindparam("e_answer", type_=turns.c.answer.type)
    turn_id = bindparam("b_turn", type_=turns.c.id.type)
    ended = (update(turns).where(turns.c.id == turn_id)
             .values(status=bindparam("e_status"), answer=answer, error=bindparam("e_error"), finished_at=now)
             .returning(turns.c.session_id, turns.c.input_message_id).cte("ended"))
    session = (update(sessions).where(sessions.c.id == ended.c.session_id)
               .values(status=bindparam("e_session_status"), updated_at=now).returning(*sessions.c).cte("session_now"))
    writes = []
    if answer_message:
        writes.append(messages.insert().from_select(
            ["session_id", "role", "content", "turn_id", "created_at"],
            select(ended.c.session_id, literal("assistant", messages.c.role.type), answer, turn_id, now),
        ).cte("answer_message"))
    if outbox:
        writes.append(deliveries.insert().from_select(
            # every NOT NULL column named: a column's Python default is not applied inside WITH
            ["turn_id", "session_id", "channel", "status", "attempts", "next_attempt_at", "claimed_by", "created_at",
             "told", "notice_tries"],
            select(turn_id, session.c.id, session.c.channel, literal(DeliveryStatus.PENDING, deliveries.c.status.type),
                   literal(1), bindparam("o_until", type_=deliveries.c.next_attempt_at.type),
                   bindparam("o_holder", type_=deliveries.c.claimed_by.type), now, literal(False), literal(0)),
            include_defaults=False,
        ).cte("outbox"))
    if count:
        writes.append(_counted())
    lease_columns = []
    if give_back:
        mine = (select(leases.c.name).where(leases.c.name == bindparam("l_name", type_=leases.c.name.type),
                                            leases.c.holder == bindparam("l_holder", type_=leases.c.holder.type))
                .with_for_update().cte("lease_mine"))
        released = (delete(leases).where(leases.c.name.in_(select(mine.c.name)), ~exists().where(
            inputs.c.session_id == bindparam("l_session", type_=inputs.c.session_id.type),
            inputs.c.status == InputStatus.WAITING, inputs.c.kind == InputKind.MESSAGE))
            .returning(leases.c.name).cte("lease_released"))
        lease_columns = [select(func.count()).select_from(mine).scalar_subquery().label("lease_held"),
                         select(func.count()).select_from(released).scalar_subquery().label("lease_released")]
    found = select(*session.c, ended.c.input_message_id, *lease_columns).select_from(session.join(ended, true()))
    return found.add_cte(*writes) if writes else found


def _counted() -> Any:
    """The usage upsert of ``core.store.usage.UsageStore`` as a CTE, its values ``u_``-prefixed."""
    added = postgresql.insert(usage).values(
        day=bindparam("u_day"), agent=bindparam("u_agent"), person=bindparam("u_person"), calls=1,
        input_tokens=bindparam("u_input_tokens"), output_tokens=bindparam("u_output_tokens"),
        cost_micros=bindparam("u_cost_micros"), unpriced_calls=bindparam("u_unpriced"))
    return added.on_conflict_do_update(
        index_elements=[usage.c.day, usage.c.agent, usage.c.person],
        set_={"calls": usage.c.calls + 1,
              "input_tokens": usage.c.input_tokens + added.excluded.input_tokens,
              "output_tokens": usage.c.output_tokens + added.excluded.output_tokens,
              "cost_micros": usage.c.cost_micros + added.excluded.cost_micros,
              "unpriced_calls": usage.c.unpriced_calls + added.excluded.unpriced_calls}).cte("counted")


# PostgreSQL: a turn's start (issue 39). The turn is inserted and its session marked running in one statement;
# each input taken becomes its transcript message and is marked taken in one statement (``TAKE_INPUT``; an input
# already in the transcript only gets the TAKE_WAITING_INPUT). SQLite: statements of their own (core.store.inputs).
_now = bindparam("t_now", type_=turns.c.started_at.type)
_session_running = (update(sessions).where(sessions.c.id == bindparam("t_session", type_=sessions.c.id.type))
                    .values(status=SessionStatus.RUNNING).cte("session_running"))
START_TURN = (turns.insert().values(session_id=bindparam("t_session", type_=sessions.c.id.type),
                                    agent=bindparam("t_agent", type_=turns.c.agent.type), status=TurnStatus.RUNNING,
                                    attempts=1, created_at=_now, started_at=_now)
              .returning(turns.c.id).add_cte(_session_running))
_turn = bindparam("t_turn", type_=turns.c.id.type)
# The input is locked first and taken only while it still waits: an input another replica took meanwhile (its lease
# ran out under a stalled holder) is neither written to the transcript again nor taken twice; no row comes back.
_still_waiting = (select(inputs.c.id)
                  .where(inputs.c.id == bindparam("b_input", type_=inputs.c.id.type),
                         inputs.c.status == InputStatus.WAITING)
                  .with_for_update().cte("still_waiting"))
def _input_message(turn_id: Any, *sources: Any) -> Any:
    """The taken input's transcript message (``m_`` columns, for ``turn_id``), written only when ``sources`` (its
    still_waiting row, and what else gives ``turn_id``) has a row."""
    return (messages.insert().from_select(
        ["session_id", "role", "content", "sender", "platform_channel", "platform_ts", "idempotency_key", "turn_id",
         "created_at"],
        select(bindparam("m_session", type_=messages.c.session_id.type), literal("user", messages.c.role.type),
               bindparam("m_content", type_=messages.c.content.type),
               bindparam("m_sender", type_=messages.c.sender.type),
               bindparam("m_channel", type_=messages.c.platform_channel.type),
               bindparam("m_ts", type_=messages.c.platform_ts.type),
               bindparam("m_key", type_=messages.c.idempotency_key.type), turn_id, _now)
        .select_from(sources[0].join(sources[1], true()) if len(sources) > 1 else sources[0]),
        include_defaults=False).returning(messages.c.id).cte("input_message"))


_message = _input_message(_turn, _still_waiting)
TAKE_INPUT = (update(inputs).where(inputs.c.id.in_(select(_still_waiting.c.id)))
              .values(status=InputStatus.TAKEN, turn_id=_turn, taken_at=_now,
                      message_id=select(_message.c.id).scalar_subquery())
              .returning(inputs.c.message_id))
# A turn that takes one input not yet in the transcript (one mention: the usual turn) started in one statement:
# START_TURN and TAKE_INPUT together (``turn_id``, ``message_id``). No row when the input was taken meanwhile: the
# turn and the session's status it wrote are then rolled back with the transaction.
_started = (turns.insert().values(session_id=bindparam("t_session", type_=sessions.c.id.type),
                                  agent=bindparam("t_agent", type_=turns.c.agent.type), status=TurnStatus.RUNNING,
                                  attempts=1, created_at=_now, started_at=_now)
            .returning(turns.c.id).cte("new_turn"))
_first_message = _input_message(_started.c.id, _still_waiting, _started)
START_TURN_TAKING_ONE = (update(inputs).where(inputs.c.id.in_(select(_still_waiting.c.id)))
                         .values(status=InputStatus.TAKEN, turn_id=select(_started.c.id).scalar_subquery(),
                                 taken_at=_now, message_id=select(_first_message.c.id).scalar_subquery())
                         .returning(inputs.c.turn_id, inputs.c.message_id).add_cte(_session_running))

# PostgreSQL: a new conversation's first input, and the conversation, in one statement (``s_``: the session's
# columns, the rest the input's). SQLite: INSERT_SESSION, then INSERT_INPUT (core.store.intake).
_new_session = sessions.insert().values(
    {column: bindparam(f"s_{column.name}", type_=column.type) for column in sessions.c
     if column.name in ("id", "channel", "agent", "status", "reply_ref", "place", "created_at", "updated_at",
                        "preapproved", "queue_mode")}).cte("new_session")
INSERT_INPUT_OF_NEW_SESSION = inputs.insert().returning(inputs.c.id).add_cte(_new_session)
