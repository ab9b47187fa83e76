"""A conversation's summary of what the model's context window left out (core.context_window)."""

from __future__ import annotations

from sqlalchemy import update
from sqlmodel import col, select

from core.store.database import Database
from core.store.tables import SessionRow
from core.text import clean_text


class SummaryStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def get(self, session_id: str) -> tuple[str | None, str | None]:
        """The stored summary, and which left-out messages it covers (its key)."""
        async with self.db.read() as s:
            row = (await s.exec(select(SessionRow.summary, SessionRow.summary_key)
                                .where(SessionRow.id == session_id))).first()
            return (row[0], row[1]) if row is not None else (None, None)

    async def save(self, session_id: str, key: str, text: str) -> None:
        async with self.db.write() as s:
            await s.exec(update(SessionRow).where(col(SessionRow.id) == session_id)
                         .values(summary=clean_text(text), summary_key=key))
