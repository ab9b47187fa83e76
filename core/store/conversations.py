"""Sessions, transcripts, turns and the delivery inbox: every query the gateway runs."""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, func, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from core.model import (
    Inbound,
    MessageRef,
    SessionInfo,
    SessionStatus,
    SessionSummary,
    TranscriptEntry,
    TurnInfo,
    TurnStatus,
)
from core.store.database import Database
from core.store.tables import MessageRow, ProcessedEventRow, SessionRow, TurnRow


class AcceptOutcome(enum.Enum):
    QUEUED = "queued"  # stored, and a turn will answer it
    RECORDED = "recorded"  # stored as context for a later turn
    DUPLICATE = "duplicate"  # seen before (redelivery or second event for the same message)
    IGNORED = "ignored"  # not for the bot (no mention, no session)


@dataclass(frozen=True)
class Accepted:
    outcome: AcceptOutcome
    turn_id: int | None = None


class ConversationStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    # -- intake ---------------------------------------------------------------------------------

    async def accept(self, msg: Inbound, *, agent: str, record_context: bool, now: datetime) -> Accepted:
        """Take one inbound message in, in one transaction: dedupe, store, and queue its turn."""
        async with self.db.write() as s:
            if msg.delivery_key is not None and not await self._claim_delivery(s, msg.delivery_key, now):
                return Accepted(AcceptOutcome.DUPLICATE)
            row = await s.get(SessionRow, msg.session_id)
            if row is None:
                if not msg.addressed:
                    return Accepted(AcceptOutcome.IGNORED)
                row = SessionRow(
                    id=msg.session_id,
                    channel=msg.channel,
                    agent=msg.agent or agent,
                    status=SessionStatus.IDLE,
                    reply_ref=json.dumps(msg.reply_ref),
                    created_at=now,
                    updated_at=now,
                )
                s.add(row)
                await s.flush()  # the message below refers to it; no ORM relationship orders the inserts
            elif not msg.addressed and not record_context:
                return Accepted(AcceptOutcome.IGNORED)
            if msg.idempotency_key is not None:
                seen = await s.exec(
                    select(MessageRow.id).where(
                        MessageRow.session_id == msg.session_id,
                        MessageRow.idempotency_key == msg.idempotency_key,
                    )
                )
                if seen.first() is not None:
                    return Accepted(AcceptOutcome.DUPLICATE)
            message = MessageRow(
                session_id=msg.session_id,
                role="user",
                content=msg.text,
                sender=msg.sender,
                platform_channel=msg.ref.channel,
                platform_ts=msg.ref.ts,
                idempotency_key=msg.idempotency_key,
                created_at=now,
            )
            s.add(message)
            await s.flush()
            if not msg.addressed:
                return Accepted(AcceptOutcome.RECORDED)
            assert message.id is not None
            turn = TurnRow(
                session_id=msg.session_id,
                agent=row.agent,
                status=TurnStatus.QUEUED,
                input_message_id=message.id,
                attempts=0,
                created_at=now,
            )
            s.add(turn)
            row.updated_at = now
            await s.flush()
            return Accepted(AcceptOutcome.QUEUED, turn.id)

    async def _claim_delivery(self, s: AsyncSession, key: str, now: datetime) -> bool:
        dialect = s.bind.dialect.name if s.bind is not None else "sqlite"
        insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
        stmt = insert(ProcessedEventRow).values(key=key, received_at=now).on_conflict_do_nothing()
        result = await s.exec(stmt)
        return bool(result.rowcount)

    async def prune_deliveries(self, older_than: datetime) -> int:
        async with self.db.write() as s:
            result = await s.exec(delete(ProcessedEventRow).where(col(ProcessedEventRow.received_at) < older_than))
            return int(result.rowcount or 0)

    # -- turns ----------------------------------------------------------------------------------

    async def sessions_with_live_turns(self) -> list[str]:
        async with self.db.read() as s:
            rows = await s.exec(
                select(TurnRow.session_id).where(col(TurnRow.status).in_(TurnStatus.LIVE)).distinct()
            )
            return list(rows.all())

    async def requeue_interrupted(self, max_attempts: int, now: datetime) -> list[int]:
        """Turns a dead process left ``running``: queue them again, or fail those already retried.

        Returns the ids of the turns failed here, so their threads can be told.
        """
        async with self.db.write() as s:
            rows = (await s.exec(select(TurnRow).where(TurnRow.status == TurnStatus.RUNNING))).all()
            failed: list[int] = []
            for turn in rows:
                if turn.attempts >= max_attempts:
                    turn.status = TurnStatus.FAILED
                    turn.error = "interrupted by a restart more than once"
                    turn.finished_at = now
                    await s.exec(
                        update(SessionRow)
                        .where(col(SessionRow.id) == turn.session_id)
                        .values(status=SessionStatus.FAILED, updated_at=now)
                    )
                    assert turn.id is not None
                    failed.append(turn.id)
                else:
                    turn.status = TurnStatus.QUEUED
                s.add(turn)
            return failed

    async def start_next_turn(self, session_id: str, now: datetime) -> TurnInfo | None:
        """Mark the session's oldest queued turn running and return it, or None when none waits."""
        async with self.db.write() as s:
            turn = (
                await s.exec(
                    select(TurnRow)
                    .where(TurnRow.session_id == session_id, TurnRow.status == TurnStatus.QUEUED)
                    .order_by(col(TurnRow.id))
                    .limit(1)
                )
            ).first()
            if turn is None:
                return None
            session = await s.get(SessionRow, session_id)
            assert session is not None
            turn.status = TurnStatus.RUNNING
            turn.attempts += 1
            turn.started_at = now
            session.status = SessionStatus.RUNNING
            session.updated_at = now
            s.add(turn)
            s.add(session)
            return await self._turn_info(s, turn, session)

    async def turn_info(self, turn_id: int) -> TurnInfo | None:
        async with self.db.read() as s:
            turn = await s.get(TurnRow, turn_id)
            if turn is None:
                return None
            session = await s.get(SessionRow, turn.session_id)
            assert session is not None
            return await self._turn_info(s, turn, session)

    async def _turn_info(self, s: AsyncSession, turn: TurnRow, session: SessionRow) -> TurnInfo:
        msg = await s.get(MessageRow, turn.input_message_id)
        inputs = (MessageRef(msg.platform_channel, msg.platform_ts),) if msg is not None else ()
        assert turn.id is not None
        return TurnInfo(
            id=turn.id,
            session=_session_info(session),
            inputs=inputs,
            sender=msg.sender if msg is not None else None,
        )

    async def finish_turn(
        self, turn_id: int, *, status: str, answer: str | None, error: str | None, now: datetime
    ) -> None:
        async with self.db.write() as s:
            turn = await s.get(TurnRow, turn_id)
            assert turn is not None
            turn.status = status
            turn.answer = answer
            turn.error = error
            turn.finished_at = now
            s.add(turn)
            await s.exec(
                update(SessionRow)
                .where(col(SessionRow.id) == turn.session_id)
                .values(
                    status=SessionStatus.FAILED if status == TurnStatus.FAILED else SessionStatus.IDLE,
                    updated_at=now,
                )
            )

    # -- transcript -----------------------------------------------------------------------------

    async def transcript(self, session_id: str, turn_id: int, limit: int) -> list[MessageRow]:
        """The newest ``limit`` messages of the session, oldest first.

        Inputs of turns still waiting behind this one are left out: they are not this turn's to answer.
        """
        async with self.db.read() as s:
            waiting = (
                select(TurnRow.input_message_id)
                .where(
                    TurnRow.session_id == session_id,
                    TurnRow.status == TurnStatus.QUEUED,
                    TurnRow.id != turn_id,
                )
                .scalar_subquery()
            )
            rows = await s.exec(
                select(MessageRow)
                .where(MessageRow.session_id == session_id, col(MessageRow.id).not_in(waiting))
                .order_by(col(MessageRow.id).desc())
                .limit(limit)
            )
            return list(reversed(rows.all()))

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
    ) -> MessageRow:
        row = MessageRow(
            session_id=session_id,
            role=role,
            content=content,
            tool_calls=json.dumps(list(tool_calls)) if tool_calls else None,
            tool_call_id=tool_call_id,
            turn_id=turn_id,
            created_at=now,
        )
        async with self.db.write() as s:
            s.add(row)
        return row

    # -- reads for status pages -----------------------------------------------------------------

    async def get_session(self, session_id: str) -> SessionInfo | None:
        async with self.db.read() as s:
            row = await s.get(SessionRow, session_id)
            return _session_info(row) if row is not None else None

    async def has_live_turns(self, session_id: str) -> bool:
        async with self.db.read() as s:
            row = await s.exec(
                select(TurnRow.id)
                .where(TurnRow.session_id == session_id, col(TurnRow.status).in_(TurnStatus.LIVE))
                .limit(1)
            )
            return row.first() is not None

    async def list_sessions(self, channel: str, limit: int = 100) -> list[SessionSummary]:
        """The channel's conversations, most recently active first, titled by their first message."""
        first_text = (
            select(MessageRow.content)
            .where(MessageRow.session_id == SessionRow.id, MessageRow.role == "user")
            .order_by(col(MessageRow.id))
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
                SessionSummary(id=sid, status=status, title=_title(title), updated_at=updated)
                for sid, status, updated, title in rows.all()
            ]

    async def history(self, session_id: str, limit: int = 500) -> list[TranscriptEntry]:
        """What a reader sees: user and assistant messages, and which tools were called."""
        async with self.db.read() as s:
            rows = await s.exec(
                select(MessageRow)
                .where(MessageRow.session_id == session_id, col(MessageRow.role).in_(("user", "assistant")))
                .order_by(col(MessageRow.id).desc())
                .limit(limit)
            )
            notices = await s.exec(
                select(TurnRow)
                .where(TurnRow.session_id == session_id,
                       col(TurnRow.status).in_((TurnStatus.FAILED, TurnStatus.CANCELLED)))
                .order_by(col(TurnRow.id).desc())
                .limit(limit)
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
                    tool_names=tuple(str(c.get("name")) for c in calls),
                ))
            # A failed or stopped turn leaves a notice (not a message: the model never sees it).
            entries.sort(key=lambda e: (e.created_at, e.id > 0, abs(e.id)))
            return entries

    async def count_turns(self, status: str) -> int:
        async with self.db.read() as s:
            result = await s.exec(select(func.count()).select_from(TurnRow).where(TurnRow.status == status))
            return int(result.one())


def _title(text: str | None) -> str:
    line = (text or "").strip().split("\n", 1)[0]
    return line if len(line) <= 80 else line[:79] + "…"


def _session_info(row: SessionRow) -> SessionInfo:
    return SessionInfo(
        id=row.id,
        channel=row.channel,
        agent=row.agent,
        status=row.status,
        reply_ref=SessionInfo.parse_reply_ref(row.reply_ref),
    )
