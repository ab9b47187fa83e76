"""Feedback on answers: one verdict per person and turn (a second click replaces the first)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func
from sqlmodel import col, select

from core.model import TurnStatus
from core.store.database import Database
from core.store.tables import FeedbackRow, TurnRow


@dataclass(frozen=True)
class FeedbackEntry:
    turn_id: int
    session_id: str
    user: str
    positive: bool
    created_at: datetime
    updated_at: datetime


class FeedbackStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def record(self, turn_id: int, session_id: str, user: str, positive: bool,
                     now: datetime) -> bool | None:
        """Store ``user``'s verdict on the turn's answer. None when the session has no such answered turn (the
        click cannot name another conversation's turn); else whether the person's verdict changed."""
        async with self.db.write() as s:
            turn = (await s.exec(select(TurnRow.status).where(
                TurnRow.id == turn_id, TurnRow.session_id == session_id))).first()
            if turn != TurnStatus.FINISHED:
                return None
            before = (await s.exec(select(FeedbackRow.positive).where(
                FeedbackRow.turn_id == turn_id, FeedbackRow.user == user))).first()
            # An upsert: two clicks at once (two replicas) leave one row, the later verdict.
            await s.exec(self.db.insert(FeedbackRow).values(
                turn_id=turn_id, session_id=session_id, user=user, positive=positive, created_at=now, updated_at=now,
            ).on_conflict_do_update(index_elements=["turn_id", "user"],
                                    set_={"positive": positive, "updated_at": now}))
            return before is None or before != positive

    async def recent(self, *, limit: int = 50, since: datetime | None = None) -> list[FeedbackEntry]:
        """The newest verdicts first."""
        async with self.db.read() as s:
            query = select(FeedbackRow).order_by(col(FeedbackRow.updated_at).desc(), col(FeedbackRow.id).desc())
            if since is not None:
                query = query.where(col(FeedbackRow.updated_at) >= since)
            rows = (await s.exec(query.limit(limit))).all()
        return [FeedbackEntry(r.turn_id, r.session_id, r.user, r.positive, r.created_at, r.updated_at) for r in rows]

    async def counts(self) -> dict[bool, int]:
        """How many answers' verdicts are positive and negative (every person's latest)."""
        async with self.db.read() as s:
            rows = (await s.exec(select(FeedbackRow.positive, func.count()).group_by(col(FeedbackRow.positive)))).all()
        counted = {True: 0, False: 0}
        counted.update({bool(positive): int(n) for positive, n in rows})
        return counted
