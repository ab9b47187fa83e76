"""The rows of a request a person answers: an approval, a credential request, a connection request.

Each kind has its own table (its own columns: what is asked, what the answer carries), and every one
is handled the same way here: parked (and its session marked as waiting on a person), where a channel
showed it recorded, settled once by a conditional update of a pending row (the session runs on in the
same commit), found again for a call after a restart, listed while pending or for a conversation. What
a kind adds (an approval's votes and grants, a credential's sealed value, a connection's tokens) stays
in that kind's store, in the same transaction through ``park_in`` and ``settle_in``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any, Generic, TypeVar

from sqlalchemy import ColumnElement, update
from sqlmodel import SQLModel, col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from core.model import SessionStatus
from core.store.database import Database
from core.store.tables import SessionRow

PENDING = "pending"  # every kind's status while nobody has answered (ApprovalStatus.PENDING, ...)

R = TypeVar("R", bound=SQLModel)
V = TypeVar("V")  # the view a kind's rows are read as (ApprovalInfo, ...)


class RequestRows(Generic[R, V]):
    """One kind's table of requests. ``waiting``: its session's status while a turn waits on one;
    ``info``: a row as core passes it around."""

    def __init__(self, db: Database, row: type[R], *, waiting: SessionStatus,
                 info: Callable[[AsyncSession, R], Awaitable[V]]) -> None:
        self.db = db
        self.row = row
        self.waiting = waiting
        self.info = info
        self._c: Any = row  # its columns (every kind has these: id, session_id, status, expires_at, ...)

    # -- in a caller's transaction ------------------------------------------------------------------

    async def park_in(self, s: AsyncSession, row: R, *, session_waits: bool = True) -> V:
        """Add a pending request; ``session_waits``: a turn waits on it, so its session says so."""
        s.add(row)
        if session_waits:
            await s.exec(update(SessionRow).where(col(SessionRow.id) == self._session_of(row))
                         .values(status=self.waiting))
        await s.flush()
        return await self.info(s, row)

    async def settle_in(self, s: AsyncSession, request_id: int, values: Mapping[str, Any], *,
                        before: datetime | None = None) -> tuple[bool, R | None]:
        """Settle once: only a pending request changes (and, with ``before``, only one that has not expired
        by then). Returns whether this call settled it, and its row as it now stands; when it did, the
        session its turn waited in runs on."""
        query = update(self.row).where(col(self._c.id) == request_id, col(self._c.status) == PENDING)
        if before is not None:
            query = query.where(col(self._c.expires_at) > before)
        won = bool((await s.exec(query.values(**values))).rowcount)
        row = await s.get(self.row, request_id)
        if row is None:
            return False, None
        await s.refresh(row)
        if won:
            await s.exec(update(SessionRow).where(col(SessionRow.id) == self._session_of(row),
                                                  col(SessionRow.status) == self.waiting)
                         .values(status=SessionStatus.RUNNING))
        return won, row

    async def latest_for_call(self, s: AsyncSession, session_id: str, call_id: str,
                              *conditions: ColumnElement[bool]) -> R | None:
        """The latest request this tool call made (a restart must not ask twice)."""
        return (await s.exec(select(self.row).where(
            col(self._c.session_id) == session_id, col(self._c.tool_call_id) == call_id, *conditions)
            .order_by(col(self._c.id).desc()))).first()

    # -- each its own transaction -------------------------------------------------------------------

    async def park(self, row: R, *, session_waits: bool = True) -> V:
        async with self.db.write() as s:
            return await self.park_in(s, row, session_waits=session_waits)

    async def settle(self, request_id: int, values: Mapping[str, Any], *,
                     before: datetime | None = None) -> tuple[bool, V | None]:
        async with self.db.write() as s:
            won, row = await self.settle_in(s, request_id, values, before=before)
            return won, (await self.info(s, row) if row is not None else None)

    async def get(self, request_id: int) -> V | None:
        async with self.db.read() as s:
            row = await s.get(self.row, request_id)
            return await self.info(s, row) if row is not None else None

    async def for_call(self, session_id: str, call_id: str) -> V | None:
        async with self.db.read() as s:
            row = await self.latest_for_call(s, session_id, call_id)
            return await self.info(s, row) if row is not None else None

    async def pending(self, *conditions: ColumnElement[bool], due_before: datetime | None = None,
                      session_id: str | None = None, limit: int | None = None) -> list[V]:
        """Pending requests, oldest first: ``due_before``, those whose time ran out by then."""
        async with self.db.read() as s:
            query = select(self.row).where(col(self._c.status) == PENDING, *conditions)
            if due_before is not None:
                query = query.where(col(self._c.expires_at) <= due_before)
            if session_id is not None:
                query = query.where(col(self._c.session_id) == session_id)
            query = query.order_by(col(self._c.id))
            rows = (await s.exec(query.limit(limit) if limit is not None else query)).all()
            return [await self.info(s, r) for r in rows]

    async def recent(self, session_id: str, limit: int = 50) -> list[V]:
        """A conversation's latest requests, oldest first."""
        async with self.db.read() as s:
            rows = (await s.exec(select(self.row).where(col(self._c.session_id) == session_id)
                                 .order_by(col(self._c.id).desc()).limit(limit))).all()
            return [await self.info(s, r) for r in reversed(rows)]

    async def record_announcement(self, request_id: int, where: dict[str, Any]) -> None:
        """Where a channel showed it, so its message can be updated once it is settled."""
        async with self.db.write() as s:
            await s.exec(update(self.row).where(col(self._c.id) == request_id)
                         .values(announcement=json.dumps(where)))

    @staticmethod
    def _session_of(row: R) -> str:
        fields: Any = row
        return str(fields.session_id)
