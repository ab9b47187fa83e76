"""The outbox of answers: rows written with the answer, claimed for one attempt at a time, settled once."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, update
from sqlmodel import col, select

from core.model import DeliveryStatus, SessionInfo
from core.store.conversations import session_info
from core.store.database import Database
from core.store.tables import DeliveryRow, SessionRow, TurnRow


@dataclass(frozen=True)
class OutboxClaim:
    """Given to ``ConversationStore.finish_turn``: write the outbox row, already claimed by ``holder`` (who
    makes the first attempt at once) until ``until``."""

    holder: str
    until: datetime


@dataclass(frozen=True)
class Pending:
    """What one attempt needs: the row, the session to answer in, and the answer."""

    row: DeliveryRow
    session: SessionInfo
    text: str


class DeliveryStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def get(self, turn_id: int) -> DeliveryRow | None:
        async with self.db.read() as s:
            return await s.get(DeliveryRow, turn_id)

    async def turn_state(self, turn_id: int) -> tuple[str, str] | None:
        """(turn status, session channel) of a turn, for a wait on a turn that has no outbox row."""
        async with self.db.read() as s:
            row = await s.exec(select(TurnRow.status, SessionRow.channel)
                               .join(SessionRow, col(SessionRow.id) == TurnRow.session_id)
                               .where(TurnRow.id == turn_id))
            found = row.first()
            return (str(found[0]), str(found[1])) if found is not None else None

    async def due(self, now: datetime, limit: int = 50) -> list[int]:
        async with self.db.read() as s:
            rows = await s.exec(select(DeliveryRow.turn_id)
                                .where(DeliveryRow.status == DeliveryStatus.PENDING, DeliveryRow.next_attempt_at <= now)
                                .order_by(col(DeliveryRow.next_attempt_at)).limit(limit))
            return list(rows.all())

    async def next_due(self) -> datetime | None:
        async with self.db.read() as s:
            row = await s.exec(select(func.min(DeliveryRow.next_attempt_at))
                               .where(DeliveryRow.status == DeliveryStatus.PENDING))
            return row.one()

    async def claim(self, turn_id: int, holder: str, now: datetime, until: datetime) -> Pending | None:
        """Take a due row for one attempt (a conditional update: one process at a time, across replicas)."""
        async with self.db.write() as s:
            result = await s.exec(
                update(DeliveryRow)
                .where(col(DeliveryRow.turn_id) == turn_id, col(DeliveryRow.status) == DeliveryStatus.PENDING,
                       col(DeliveryRow.next_attempt_at) <= now)
                .values(claimed_by=holder, next_attempt_at=until, attempts=DeliveryRow.attempts + 1)
            )
            if result.rowcount != 1:
                return None
            row = await s.get(DeliveryRow, turn_id)
            turn = await s.get(TurnRow, turn_id)
            session = await s.get(SessionRow, row.session_id) if row is not None else None
            if row is None or turn is None or session is None:
                return None
            return Pending(row, session_info(session), turn.answer or "")

    async def delivered(self, turn_id: int, ref: str, now: datetime) -> bool:
        """Record where it landed (the turn's ``delivered_ref`` too), in one commit; False if already settled."""
        async with self.db.write() as s:
            result = await s.exec(
                update(DeliveryRow)
                .where(col(DeliveryRow.turn_id) == turn_id, col(DeliveryRow.status) == DeliveryStatus.PENDING)
                .values(status=DeliveryStatus.DELIVERED, ref=ref, claimed_by=None, finished_at=now, last_error=None)
            )
            if result.rowcount != 1:
                return False
            await s.exec(update(TurnRow).where(col(TurnRow.id) == turn_id)
                         .values(delivered_ref=ref, delivery_error=None))
            return True

    async def retry_later(self, turn_id: int, holder: str, error: str, at: datetime) -> None:
        """An attempt failed: release the claim and say when the next one may start."""
        async with self.db.write() as s:
            await s.exec(
                update(DeliveryRow)
                .where(col(DeliveryRow.turn_id) == turn_id, col(DeliveryRow.status) == DeliveryStatus.PENDING,
                       col(DeliveryRow.claimed_by) == holder)
                .values(claimed_by=None, next_attempt_at=at, last_error=error)
            )

    async def give_up(self, turn_id: int, error: str, now: datetime) -> bool:
        async with self.db.write() as s:
            result = await s.exec(
                update(DeliveryRow)
                .where(col(DeliveryRow.turn_id) == turn_id, col(DeliveryRow.status) == DeliveryStatus.PENDING)
                .values(status=DeliveryStatus.GIVEN_UP, claimed_by=None, finished_at=now, last_error=error)
            )
            if result.rowcount != 1:
                return False
            await s.exec(update(TurnRow).where(col(TurnRow.id) == turn_id).values(delivery_error=error))
            return True

    async def untold(self, channel: str, limit: int = 20) -> list[int]:
        """Given-up answers in ``channel`` whose thread has not been told yet."""
        async with self.db.read() as s:
            rows = await s.exec(select(DeliveryRow.turn_id)
                                .where(DeliveryRow.channel == channel, DeliveryRow.status == DeliveryStatus.GIVEN_UP,
                                       col(DeliveryRow.told).is_(False))
                                .order_by(col(DeliveryRow.turn_id)).limit(limit))
            return list(rows.all())

    async def take_telling(self, turn_id: int) -> Pending | None:
        """Mark a given-up row as told (once, across replicas); returns it to the one that may tell."""
        async with self.db.write() as s:
            result = await s.exec(
                update(DeliveryRow)
                .where(col(DeliveryRow.turn_id) == turn_id, col(DeliveryRow.status) == DeliveryStatus.GIVEN_UP,
                       col(DeliveryRow.told).is_(False))
                .values(told=True)
            )
            if result.rowcount != 1:
                return None
            row = await s.get(DeliveryRow, turn_id)
            session = await s.get(SessionRow, row.session_id) if row is not None else None
            if row is None or session is None:
                return None
            return Pending(row, session_info(session), "")

    async def release_claims(self, now: datetime) -> int:
        """At start with one process per database: claims left by a dead process end now."""
        async with self.db.write() as s:
            result = await s.exec(
                update(DeliveryRow)
                .where(col(DeliveryRow.status) == DeliveryStatus.PENDING, col(DeliveryRow.claimed_by).is_not(None))
                .values(claimed_by=None, next_attempt_at=now)
            )
            return int(result.rowcount)

    async def count(self, status: DeliveryStatus, *, since: datetime | None = None) -> int:
        query = select(func.count()).select_from(DeliveryRow).where(DeliveryRow.status == status)
        if since is not None:
            query = query.where(col(DeliveryRow.created_at) >= since)
        async with self.db.read() as s:
            return int((await s.exec(query)).one())
