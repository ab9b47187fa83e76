"""A thread's token budget (THREAD_TOKEN_BUDGET): what its model calls used, and what it may use."""

from __future__ import annotations

from sqlalchemy import func, update
from sqlmodel import col, select

from core.store.database import Database
from core.store.tables import SessionRow


class BudgetStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def usage(self, session_id: str) -> tuple[int, int | None]:
        """(tokens used, allowance or None for the first budget)."""
        async with self.db.read() as s:
            row = (await s.exec(select(SessionRow.tokens_used, SessionRow.token_allowance)
                                .where(SessionRow.id == session_id))).first()
            return (int(row[0] or 0), row[1]) if row is not None else (0, None)

    async def spend(self, session_id: str, tokens: int) -> None:
        async with self.db.write() as s:
            await s.exec(update(SessionRow).where(col(SessionRow.id) == session_id)
                         .values(tokens_used=col(SessionRow.tokens_used) + max(0, tokens)))

    async def extend(self, session_id: str, *, was: int, now: int, base: int) -> bool:
        """Raise the allowance from ``was`` to ``now``, only if it still is ``was`` (``base`` when never
        raised): a Continue adds one budget exactly once, even when a restart replays it."""
        async with self.db.write() as s:
            result = await s.exec(update(SessionRow).where(
                col(SessionRow.id) == session_id,
                func.coalesce(col(SessionRow.token_allowance), base) == was).values(token_allowance=now))
            return bool(result.rowcount)
