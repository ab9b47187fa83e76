"""Stored change freezes (SPEC §17): set, lifted and read in the database, so every replica sees one at once."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import update
from sqlmodel import col, select

from core.store.approvals import audit_row
from core.store.database import Database
from core.store.tables import FreezeRow


class FreezeStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def add(self, row: FreezeRow) -> FreezeRow:
        """The freeze and its audit line, in one transaction."""
        async with self.db.write() as s:
            s.add(row)
            await s.flush()
            s.add(audit_row(row.created_at, row.created_by, "freeze.set", f"freeze:{row.id}",
                            {"until": row.until.isoformat(), "reason": row.reason}))
        return row

    async def active(self, now: datetime) -> list[FreezeRow]:
        """Freezes in force at ``now`` (begun, not ended, not lifted), the one that lasts longest first."""
        async with self.db.read() as s:
            query = select(FreezeRow).where(col(FreezeRow.starts_at) <= now, col(FreezeRow.until) > now,
                                            col(FreezeRow.lifted_at).is_(None))
            return list((await s.exec(query.order_by(col(FreezeRow.until).desc(), col(FreezeRow.id)))).all())

    async def lift(self, by: str, now: datetime) -> list[int]:
        """Lift every stored freeze not yet over (in force or still to begin); their ids, each audited."""
        async with self.db.write() as s:
            open_ = (col(FreezeRow.until) > now, col(FreezeRow.lifted_at).is_(None))
            lifted = [int(i) for i in (await s.exec(select(FreezeRow.id).where(*open_))).all() if i is not None]
            if lifted:
                await s.exec(update(FreezeRow).where(col(FreezeRow.id).in_(lifted), *open_)
                             .values(lifted_at=now, lifted_by=by))
            for freeze_id in lifted:
                s.add(audit_row(now, by, "freeze.lifted", f"freeze:{freeze_id}", None))
        return sorted(lifted)
