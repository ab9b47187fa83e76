"""Lease rows with an expiry and a heartbeat (SPEC §11): no connection is pinned, and a dead holder's
lease simply runs out and is taken over."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import delete, update
from sqlmodel import col, select

from core.store.database import Database
from core.store.tables import LeaseRow


class LeaseStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def acquire(self, name: str, holder: str, ttl: timedelta, now: datetime) -> bool:
        """Take the lease if it is free, expired, or already ours (then it is extended)."""
        stmt = self.db.insert(LeaseRow).values(name=name, holder=holder, expires_at=now + ttl)
        stmt = stmt.on_conflict_do_update(
            index_elements=["name"],
            set_={"holder": holder, "expires_at": now + ttl},
            where=(col(LeaseRow.expires_at) < now) | (col(LeaseRow.holder) == holder),
        )
        async with self.db.write() as s:
            result = await s.exec(stmt)
            return bool(result.rowcount)

    async def renew(self, name: str, holder: str, ttl: timedelta, now: datetime) -> bool:
        async with self.db.write() as s:
            result = await s.exec(update(LeaseRow).where(col(LeaseRow.name) == name, col(LeaseRow.holder) == holder)
                                  .values(expires_at=now + ttl))
            return bool(result.rowcount)

    async def release(self, name: str, holder: str) -> None:
        async with self.db.write() as s:
            await s.exec(delete(LeaseRow).where(col(LeaseRow.name) == name, col(LeaseRow.holder) == holder))

    async def live_holders(self, names: list[str], now: datetime) -> set[str]:
        """Which of these leases are held (unexpired) by anyone."""
        if not names:
            return set()
        async with self.db.read() as s:
            rows = await s.exec(select(LeaseRow.name).where(col(LeaseRow.name).in_(names),
                                                           col(LeaseRow.expires_at) >= now))
            return set(rows.all())
