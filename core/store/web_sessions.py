"""Web chat logins: only the sha256 of the cookie's random id is stored, so a database copy logs nobody in."""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta

from sqlalchemy import delete, update
from sqlmodel import col, select

from core.store.approvals import audit_row
from core.store.database import Database
from core.store.tables import WebSessionRow


def login_digest(login_id: str) -> str:
    return hashlib.sha256(login_id.encode()).hexdigest()


class WebSessionStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def create(self, login_id: str, now: datetime, ttl: timedelta) -> None:
        async with self.db.write() as s:
            # Rows past their expiry are useless; dropping them here keeps the table small.
            await s.exec(delete(WebSessionRow).where(col(WebSessionRow.expires_at) < now))
            s.add(WebSessionRow(id_digest=login_digest(login_id), created_at=now, expires_at=now + ttl))

    async def is_active(self, login_id: str, now: datetime) -> bool:
        async with self.db.read() as s:
            row = (await s.exec(select(WebSessionRow.id_digest).where(
                col(WebSessionRow.id_digest) == login_digest(login_id),
                col(WebSessionRow.revoked_at).is_(None),
                col(WebSessionRow.expires_at) > now,
            ))).first()
            return row is not None

    async def revoke(self, login_id: str, now: datetime) -> bool:
        async with self.db.write() as s:
            result = await s.exec(update(WebSessionRow)
                                  .where(col(WebSessionRow.id_digest) == login_digest(login_id),
                                         col(WebSessionRow.revoked_at).is_(None))
                                  .values(revoked_at=now))
            return bool(result.rowcount)

    async def revoke_all(self, by: str, now: datetime) -> int:
        """End every live login (audited); returns how many were live."""
        async with self.db.write() as s:
            result = await s.exec(update(WebSessionRow)
                                  .where(col(WebSessionRow.revoked_at).is_(None), col(WebSessionRow.expires_at) > now)
                                  .values(revoked_at=now))
            count = int(result.rowcount or 0)
            s.add(audit_row(now, by, "web.logout_all", "web_sessions", {"revoked": count}))
            return count
