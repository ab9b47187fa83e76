"""Sessions, turns, transcripts and what readers see of them."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Row, and_, or_, true, update
from sqlalchemy.exc import NoResultFound
from sqlmodel import Session, col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from core.model import (
    LIVE_TURN_STATUSES,
    SUBAGENT_PREFIX,
    DeliveryStatus,
    InputStatus,
    SessionInfo,
    SessionStatus,
    SessionSummary,
    TranscriptEntry,
    TurnInfo,
    TurnStatus,
)
from core.store import statements as st
from core.store.connection_tables import ConnectionRequestRow
from core.store.database import Database
from core.store.row_views import session_info, turn_info
from core.store.subagents import interrupt_subagents
from core.store.tables import (
    ApprovalRow,
    CredentialRequestRow,
    DeliveryRow,
    InputRow,
    MessageRow,
    SessionRow,
    TurnRow,
)
from core.store.usage import Count
from core.text import clean_text

_turns = TurnRow.__table__  # type: ignore[attr-defined]
_sessions = SessionRow.__table__  # type: ignore[attr-defined]
_inputs = InputRow.__table__  # type: ignore[attr-defined]
_messages = MessageRow.__table__  # type: ignore[attr-defined]
_deliveries = DeliveryRow.__table__  # type: ignore[attr-defined]

if TYPE_CHECKING:
    from core.store.deliveries import OutboxClaim
    from core.store.leases import GiveBack


class ConversationStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    # -- turns ----------------------------------------------------------------------------------

    async def running_sessions(self, *, set_aside: bool = False) -> list[str]:
        """Sessions with a turn running; ``set_aside``: also those with one to continue (``suspend_turn``)."""
        statuses = (TurnStatus.RUNNING, TurnStatus.QUEUED) if set_aside else (TurnStatus.RUNNING,)
        async with self.db.read() as s:
            rows = await s.exec(select(TurnRow.session_id).where(col(TurnRow.status).in_(statuses)).distinct())
            # A sub-agent's turn runs inside its parent's (core.subagents): never recovered as a turn of its own.
            return [r for r in rows.all() if not r.startswith(SUBAGENT_PREFIX)]

    async def suspend_turn(self, turn_id: int) -> None:
        """Set aside a running turn that waits on a person (at shutdown): it is continued at the next
        start like an interrupted one, but is no crash, so it gives back the attempt its resume takes."""
        async with self.db.write() as s:
            await s.exec(update(TurnRow).where(col(TurnRow.id) == turn_id, col(TurnRow.status) == TurnStatus.RUNNING)
                         .values(status=TurnStatus.QUEUED, attempts=col(TurnRow.attempts) - 1))

    async def requeue_interrupted(self, max_attempts: int, now: datetime,
                                  sessions: list[str] | None = None) -> list[int]:
        """Turns a dead process left ``running`` (all, or those of ``sessions``): mark them to be
        continued, or fail those already retried. Returns the ids of the turns failed here."""
        if sessions is not None and not sessions:
            return []
        # Set-based, not row by row: start-up time must not grow with the number of parked turns.
        async with self.db.write() as s:
            await interrupt_subagents(s, sessions, now)  # never continued: their parents are told instead
            running = col(TurnRow.status) == TurnStatus.RUNNING
            scope = col(TurnRow.session_id).in_(sessions) if sessions is not None else true()
            dead = list((await s.exec(select(TurnRow.id, TurnRow.session_id).where(
                running, scope, col(TurnRow.attempts) >= max_attempts))).all())
            if dead:
                await s.exec(update(TurnRow).where(col(TurnRow.id).in_([d[0] for d in dead])).values(
                    status=TurnStatus.FAILED, error="interrupted by a restart more than once", finished_at=now))
                await s.exec(update(SessionRow).where(col(SessionRow.id).in_([d[1] for d in dead])).values(
                    status=SessionStatus.FAILED, updated_at=now))
                await _cancel_requests_of(s, [d[0] for d in dead if d[0] is not None], now)
            await s.exec(update(TurnRow).where(running, scope).values(status=TurnStatus.QUEUED))
            return [d[0] for d in dead if d[0] is not None]

    async def resume_interrupted(self, session_id: str, now: datetime) -> TurnInfo | None:
        """Start continuing the session's interrupted turn, if it has one."""
        return await self.db.run_write(lambda s: resume_interrupted(s, session_id, now))

    async def turn_info(self, turn_id: int) -> TurnInfo | None:
        return await self.db.run_read(lambda s: _load_turn_info(s, turn_id))

    async def finish_turn(
        self, turn_id: int, *, status: str, answer: str | None, error: str | None, now: datetime,
        outbox: OutboxClaim | None = None, answer_message: bool = False,
        then: Callable[[Session], object] | None = None, known: TurnInfo | None = None,
        give_back: GiveBack | None = None, count: Count | None = None,
    ) -> TurnInfo:
        """Record how the turn ended; returns it with every input it took (for the events). With ``outbox``
        (the session's channel delivers answers), a finished turn's answer goes into the outbox in the same
        commit: an answer that exists is never left undelivered by a crash. With ``answer_message`` the
        answer also goes into the transcript, in the same commit (the runner left it to the turn's end).
        ``give_back``: the session's lease goes back in the same transaction unless a message waits (what that did:
        ``give_back.given_back``, once this returns). ``then`` runs last in the same transaction (a model switch
        stored). ``known``: the turn as it started, when it has taken no input since (its inputs are not read again:
        one round trip less). ``count``: the turn's last model call's usage, counted in the same commit. On
        PostgreSQL, with ``known`` and no ``then`` (and a count with no thread budget), the end is one statement, run
        alone (autocommit: committed when the server answers, in one round trip instead of three)."""
        # An error may quote what a model endpoint said: stored text never holds NUL.
        stored_answer = clean_text(answer) if answer is not None else None
        stored_error = clean_text(error) if error is not None else None
        session_status = SessionStatus.FAILED if status == TurnStatus.FAILED else SessionStatus.IDLE
        write_message = answer_message and answer is not None and status == TurnStatus.FINISHED
        # A finished turn without an answer (one that stayed silent: core.listening) has nothing to deliver.
        claim = outbox if outbox is not None and status == TurnStatus.FINISHED and answer is not None else None

        # PostgreSQL: the writes below, the lease's release and the last call's count are one statement
        alone = not self.db.is_sqlite and known is not None and then is None and (count is None or count.foldable)
        folded = count if alone else None
        if count is not None and folded is None:
            then = _both(then, count)
        statement = st.turn_end(write_message, claim is not None, give_back is not None, count=folded is not None)
        params = dict(b_turn=turn_id, e_status=status, e_answer=stored_answer, e_error=stored_error, e_now=now,
                      e_session_status=session_status,
                      **({"o_until": claim.until, "o_holder": claim.holder} if claim is not None else {}),
                      **(give_back.params() if give_back is not None else {}),
                      **(folded.params("u_") if folded is not None else {}))

        def ended(row: Row[Any]) -> None:
            if give_back is not None:
                give_back.given_back = bool(row.lease_released) or not row.lease_held

        if alone and known is not None:
            rows = await self.db.run_alone(statement, params)
            if not rows:
                raise NoResultFound(f"no turn {turn_id}")
            ended(rows[0])
            return replace(known, session=session_info(rows[0]), everyone=None, resumed=False)

        def work(s: Session) -> TurnInfo:
            conn = s.connection()
            if not self.db.is_sqlite:
                row = conn.execute(statement, params).one()
                turn, session = row, session_info(row)
                ended(row)
            else:
                turn = conn.execute(st.UPDATE_TURN_HEAD, dict(b_turn=turn_id, status=status, answer=stored_answer,
                                                              error=stored_error, finished_at=now)).one()
                if write_message:
                    conn.execute(st.INSERT_MESSAGE, dict(session_id=turn.session_id, role="assistant",
                                                         content=stored_answer, turn_id=turn_id, created_at=now))
                session = _set_status(s, turn.session_id, session_status, now)
                if claim is not None:
                    conn.execute(st.INSERT_DELIVERY, dict(
                        turn_id=turn_id, session_id=session.id, channel=session.channel,
                        status=DeliveryStatus.PENDING, attempts=1, next_attempt_at=claim.until,
                        claimed_by=claim.holder, created_at=now))
                if give_back is not None:
                    give_back.run_in(s)
            info = (replace(known, session=session, everyone=None, resumed=False) if known is not None
                    else turn_info(s, turn_id, turn.input_message_id, session))
            if then is not None:
                then(s)
            return info

        # The answer's post waits on it: ahead of the writes nobody waits on (receipts, transcript).
        return await self.db.run_write(work, urgent=True)

    async def final_answer(self, turn_id: int) -> str | None:
        """The turn's saved final answer (an assistant message without tool calls), if it got that far."""
        async with self.db.read() as s:
            row = await s.exec(
                select(MessageRow.content)
                .where(MessageRow.turn_id == turn_id, MessageRow.role == "assistant",
                       col(MessageRow.tool_calls).is_(None))
                .order_by(col(MessageRow.id).desc())
                .limit(1)
            )
            return row.first()

    async def running_turn(self, session_id: str) -> int | None:
        running = await self.running_turn_started(session_id)
        return running[0] if running is not None else None

    async def busy_sessions(self, channel: str) -> list[SessionInfo]:
        """Sessions of ``channel`` that have a turn running (or parked, or set aside) or messages waiting."""
        async with self.db.read() as s:
            running = select(TurnRow.session_id).where(col(TurnRow.status).in_(LIVE_TURN_STATUSES))
            waiting = select(InputRow.session_id).where(InputRow.status == InputStatus.WAITING)
            rows = (await s.exec(select(SessionRow).where(
                SessionRow.channel == channel,
                col(SessionRow.id).in_(running.union(waiting).scalar_subquery())))).all()
            return sorted((session_info(row) for row in rows), key=lambda info: info.id)

    async def running_turn_started(self, session_id: str) -> tuple[int, datetime | None] | None:
        """The session's running turn: its id and when it started."""
        async with self.db.read() as s:
            row = (await s.exec(
                select(TurnRow.id, TurnRow.started_at).where(TurnRow.session_id == session_id,
                                                             TurnRow.status == TurnStatus.RUNNING)
            )).first()
            return (int(row[0] or 0), row[1]) if row is not None else None

    async def sessions_with_work(self) -> list[str]:
        """Sessions with a turn to continue or a message waiting for an answer."""
        async with self.db.read() as s:
            turns = await s.exec(select(TurnRow.session_id).where(TurnRow.status == TurnStatus.QUEUED).distinct())
            inputs = await s.exec(
                select(InputRow.session_id)
                .where(InputRow.status == InputStatus.WAITING, InputRow.kind == "message")
                .distinct()
            )
            return sorted(set(turns.all()) | set(inputs.all()))

    # -- transcript -----------------------------------------------------------------------------

    async def transcript(self, session_id: str, limit: int) -> list[Row[Any]]:
        """The newest ``limit`` messages of the session, oldest first."""
        return await self.db.run_read(lambda s: transcript(s, session_id, limit))

    async def add_message(
        self,
        session_id: str,
        *,
        role: str,
        content: str,
        turn_id: int | None,
        now: datetime,
        tool_calls: Sequence[dict[str, object]] | None = None,
        tool_call_id: str | None = None,
        then: Callable[[Session], object] | None = None,
    ) -> MessageRow:
        """Store one message; ``then`` runs in the same transaction (a session's switch to the fallback model)."""
        row = MessageRow(
            session_id=session_id,
            role=role,
            content=clean_text(content),  # the last line of defence: PostgreSQL refuses NUL in text
            tool_calls=json.dumps(list(tool_calls)) if tool_calls else None,
            tool_call_id=tool_call_id,
            turn_id=turn_id,
            created_at=now,
        )
        values = row.model_dump()
        values.pop("id", None)
        def work(s: Session) -> int:
            inserted = int(s.connection().execute(st.INSERT_MESSAGE, values).inserted_primary_key[0])  # type: ignore[index]
            if then is not None:
                then(s)
            return inserted

        row.id = await self.db.run_write(work)
        return row

    # -- reads for people -----------------------------------------------------------------------

    async def conversation_senders(self, session_id: str) -> list[str]:
        """Everyone whose words the model may read in this conversation (asked, steered or recorded as
        context; never controls), each once."""
        async with self.db.read() as s:
            senders = (await s.exec(select(InputRow.sender).where(
                InputRow.session_id == session_id, InputRow.kind != "control").distinct())).all()
            return sorted(sender for sender in senders if sender)

    async def calls_and_files(self, session_id: str) -> tuple[set[str], bool]:
        """What the model read in this conversation beside people's words: the names of the tools called in it, and
        whether it holds a shared file's text (a user message nobody sent: core.turns)."""
        async with self.db.read() as s:
            rows = (await s.exec(select(MessageRow.tool_calls, MessageRow.role, MessageRow.sender).where(
                MessageRow.session_id == session_id,
                or_(col(MessageRow.tool_calls).is_not(None),
                    and_(col(MessageRow.role) == "user", col(MessageRow.sender).is_(None)))))).all()
        called = {str(call.get("name")) for calls, _role, _sender in rows if calls
                  for call in json.loads(calls) if isinstance(call, dict)}
        return called, any(role == "user" and sender is None for _calls, role, sender in rows)

    async def get_session(self, session_id: str) -> SessionInfo | None:
        async with self.db.read() as s:
            row = await s.get(SessionRow, session_id)
            return session_info(row) if row is not None else None

    async def has_live_work(self, session_id: str) -> bool:
        async with self.db.read() as s:
            turn = await s.exec(
                select(TurnRow.id)
                .where(TurnRow.session_id == session_id, col(TurnRow.status).in_(LIVE_TURN_STATUSES))
                .limit(1)
            )
            waiting = await s.exec(
                select(InputRow.id)
                .where(InputRow.session_id == session_id, InputRow.status == InputStatus.WAITING,
                       InputRow.kind == "message")
                .limit(1)
            )
            return turn.first() is not None or waiting.first() is not None

    async def list_sessions(self, channel: str, limit: int = 100) -> list[SessionSummary]:
        """The channel's conversations, most recently active first, titled by their first message."""
        first_text = (
            select(InputRow.text)
            .where(InputRow.session_id == SessionRow.id, InputRow.kind != "control")
            .order_by(col(InputRow.id))
            .limit(1)
            .correlate(SessionRow)
            .scalar_subquery()
        )
        async with self.db.read() as s:
            rows = await s.exec(
                select(SessionRow.id, SessionRow.status, SessionRow.updated_at, first_text)
                .where(SessionRow.channel == channel)
                .order_by(col(SessionRow.updated_at).desc())
                .limit(limit)
            )
            return [
                SessionSummary(id=sid, status=SessionStatus(status), title=_title(title), updated_at=updated)
                for sid, status, updated, title in rows.all()
            ]

    async def history(self, session_id: str, limit: int = 500) -> list[TranscriptEntry]:
        """What a reader sees: the transcript's user and assistant messages, notices, and queued inputs."""
        async with self.db.read() as s:
            rows = await s.exec(
                select(MessageRow)
                .where(MessageRow.session_id == session_id, col(MessageRow.role).in_(("user", "assistant")))
                .order_by(col(MessageRow.id).desc())
                .limit(limit)
            )
            notices = await s.exec(
                select(TurnRow)
                .where(TurnRow.session_id == session_id, TurnRow.status == TurnStatus.FAILED)
                .order_by(col(TurnRow.id).desc())
                .limit(limit)
            )
            waiting = await s.exec(
                select(InputRow)
                .where(InputRow.session_id == session_id, InputRow.status == InputStatus.WAITING,
                       col(InputRow.message_id).is_(None))  # converted by migration 0002: already shown
                .order_by(col(InputRow.id))
            )
            entries = [
                TranscriptEntry(id=-(t.id or 0), role="notice", content=t.error or t.status, sender=None,
                                created_at=t.finished_at or t.created_at)
                for t in notices.all()
            ]
            for row in reversed(rows.all()):
                calls = json.loads(row.tool_calls) if row.tool_calls else []
                assert row.id is not None
                entries.append(TranscriptEntry(
                    id=row.id, role=row.role, content=row.content, sender=row.sender, created_at=row.created_at,
                    tool_names=tuple(str(c.get("name")) for c in calls), turn_id=row.turn_id,
                ))
            # A failed turn leaves a notice (not a message: the model never sees it).
            entries.sort(key=lambda e: (e.created_at, e.id > 0, abs(e.id)))
            entries += [
                TranscriptEntry(id=0, role="user", content=i.text, sender=i.sender, created_at=i.created_at,
                                queued=True)
                for i in waiting.all()
            ]
            return entries

    async def replace_reply_ref(self, session_id: str, was: dict[str, Any], reply_ref: dict[str, Any]
                                ) -> dict[str, Any] | None:
        """Set the session's reply reference to ``reply_ref`` only if it is still ``was`` (compare-and-set: of
        two writers racing from the same value, one wins). The reference in force afterwards (the winner's,
        whoever it was); None: no such session."""
        def work(s: Session) -> dict[str, Any] | None:
            conn = s.connection()
            row = conn.execute(st.SESSION, {"b_session": session_id}).first()
            if row is None:
                return None
            stored = SessionInfo.parse_reply_ref(row.reply_ref)
            if stored != was:
                return stored
            # Guarded by the text read, so a writer that changed it since (another replica) is not overwritten.
            changed = conn.execute(update(_sessions).where(_sessions.c.id == session_id,
                                                           _sessions.c.reply_ref == row.reply_ref)
                                   .values(reply_ref=json.dumps(reply_ref))).rowcount
            if changed:
                return dict(reply_ref)
            return SessionInfo.parse_reply_ref(conn.execute(st.SESSION, {"b_session": session_id}).one().reply_ref)

        return await self.db.run_write(work, urgent=True)

    async def ensure_session(self, info: SessionInfo, now: datetime) -> None:
        """Create a session core starts itself (a firing, a command's request), if it does not exist."""
        async with self.db.write() as s:
            if await s.get(SessionRow, info.id) is None:
                preapproved = json.dumps([list(p) for p in info.preapproved]) if info.preapproved else None
                s.add(SessionRow(id=info.id, channel=info.channel, agent=info.agent, status=SessionStatus.IDLE,
                                 reply_ref=json.dumps(info.reply_ref), place=info.place, preapproved=preapproved,
                                 created_at=now, updated_at=now))


def switch_model(session_id: str, model: str) -> Callable[[Session], None]:
    """A write for another's transaction: the session's calls go to ``model`` from now on (core.model_routing)."""
    def work(s: Session) -> None:
        s.connection().execute(update(_sessions).where(_sessions.c.id == session_id).values(model=model))

    return work


def resume_interrupted(s: Session, session_id: str, now: datetime, *,
                       found: tuple[int, int | None] | None = None) -> TurnInfo | None:
    """Mark the session's interrupted turn (if any) running again, one attempt more. ``found``: its id and
    input message, when the caller read them in this transaction (``statements.SESSION_FOR_TURN``)."""
    conn = s.connection()
    if found is None:
        turn = conn.execute(st.INTERRUPTED_TURN, {"b_session": session_id}).first()
        if turn is None:
            return None
        found = (turn.id, turn.input_message_id)
    turn_id, input_message_id = found
    conn.execute(update(_turns).where(_turns.c.id == turn_id)
                 .values(status=TurnStatus.RUNNING, attempts=_turns.c.attempts + 1, started_at=now))
    info = turn_info(s, turn_id, input_message_id, _set_status(s, session_id, SessionStatus.RUNNING))
    return replace(info, resumed=True)


def _set_status(s: Session, session_id: str, status: SessionStatus, now: datetime | None = None) -> SessionInfo:
    """Set the session's status (and ``updated_at``); returns it as it is now."""
    conn = s.connection()
    values: dict[str, object] = {"status": status} | ({"updated_at": now} if now is not None else {})
    return session_info(conn.execute(st.UPDATE_SESSION_RETURNING, {"b_session": session_id, **values}).one())


def transcript(s: Session, session_id: str, limit: int) -> list[Row[Any]]:
    """The newest ``limit`` messages of the session, oldest first (what the model is shown)."""
    rows = s.connection().execute(st.TRANSCRIPT, {"b_session": session_id, "b_limit": limit}).all()
    return list(reversed(rows))


def _load_turn_info(s: Session, turn_id: int) -> TurnInfo | None:
    conn = s.connection()
    turn = conn.execute(st.TURN_HEAD, {"b_turn": turn_id}).first()
    if turn is None:
        return None
    session = conn.execute(st.SESSION, {"b_session": turn.session_id}).one()
    return turn_info(s, turn_id, turn.input_message_id, session_info(session))


def _title(text: str | None) -> str:
    line = (text or "").strip().split("\n", 1)[0]
    return line if len(line) <= 80 else line[:79] + "…"


async def _cancel_requests_of(s: AsyncSession, turn_ids: list[int], now: datetime) -> None:
    """A failed turn's pending approvals and credential requests end with it: approving one later must
    not run its call (nor a later turn pick it up), and its buttons say it was cancelled."""
    from core.store.approvals import audit_row  # approvals builds on this module

    reason = "its turn was stopped after being interrupted by restarts"
    for table, kind in ((ApprovalRow, "approval"), (CredentialRequestRow, "credential"),
                        (ConnectionRequestRow, "connection")):
        pending = list((await s.exec(select(table.id).where(
            col(table.turn_id).in_(turn_ids), col(table.status) == "pending"))).all())
        if not pending:
            continue
        values: dict[str, object] = {"status": "cancelled"}
        if table is ApprovalRow:
            values |= {"decided_at": now, "reason": reason}
        await s.exec(update(table).where(col(table.id).in_(pending)).values(**values))
        for request_id in pending:
            s.add(audit_row(now, "system", f"{kind}.cancelled", f"{kind}:{request_id}", {"reason": reason}))


def _both(first: Callable[[Session], object] | None,
          second: Callable[[Session], object]) -> Callable[[Session], object]:
    """Two writes of one transaction, in order."""
    if first is None:
        return second

    def work(s: Session) -> None:
        first(s)
        second(s)

    return work
