"""Operator switches in the database, so every process (and the CLI) sees the same state."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Row
from sqlmodel import Session

from core.store import statements
from core.store.database import Database
from core.store.tables import ControlRow, SessionRow

INTAKE_PAUSED = "intake_paused"


def queue_mode_of(s: Session, session: SessionRow | Row[Any]) -> str | None:
    if session.queue_mode:
        return session.queue_mode
    if session.place:
        value = s.connection().execute(statements.CONTROL_VALUE, {"b_key": f"queue_mode:{session.place}"}).scalar()
        return str(value) if value is not None else None
    return None


class ControlStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def get(self, key: str) -> str | None:
        async with self.db.read() as s:
            row = await s.get(ControlRow, key)
            return row.value if row is not None else None

    async def put(self, key: str, value: str | None, now: datetime) -> None:
        async with self.db.write() as s:
            row = await s.get(ControlRow, key)
            if value is None:
                if row is not None:
                    await s.delete(row)
                return
            if row is None:
                s.add(ControlRow(key=key, value=value, updated_at=now))
            else:
                row.value, row.updated_at = value, now
                s.add(row)

    async def intake_paused(self) -> bool:
        return await self.get(INTAKE_PAUSED) == "1"

    async def set_intake_paused(self, paused: bool, now: datetime) -> None:
        await self.put(INTAKE_PAUSED, "1" if paused else None, now)

    async def queue_mode(self, session_id: str) -> str | None:
        """The conversation's own queue mode, else its place's (e.g. its Slack channel), else None."""
        def work(s: Session) -> str | None:
            session = s.get(SessionRow, session_id)
            return queue_mode_of(s, session) if session is not None else None

        return await self.db.run_read(work)

    async def set_session_queue_mode(self, session_id: str, mode: str | None, now: datetime) -> None:
        async with self.db.write() as s:
            session = await s.get(SessionRow, session_id)
            if session is not None:
                session.queue_mode, session.updated_at = mode, now
                s.add(session)

    async def set_place_queue_mode(self, place: str, mode: str | None, now: datetime) -> None:
        await self.put(f"queue_mode:{place}", mode, now)
