"""The audit table as the tests read it: the last lines written, oldest first."""

from __future__ import annotations

from sqlmodel import col, select

from core.store.database import Database
from core.store.tables import AuditRow


async def audit_log(db: Database, limit: int = 100) -> list[AuditRow]:
    async with db.read() as s:
        rows = (await s.exec(select(AuditRow).order_by(col(AuditRow.id).desc()).limit(limit))).all()
        return list(reversed(rows))
