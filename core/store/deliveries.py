"""The outbox of answers: rows written with the answer, claimed for one attempt at a time, settled once."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, update
from sqlmodel import Session, col, select

from core.model import DeliveryStatus, SessionInfo
from core.store import statements as st
from core.store.database import Database
from core.store.row_views import session_info, trace_context
from core.store.tables import ControlRow, DeliveryRow, SessionRow, TurnRow

INSTALL_KEY = "delivery_install"  # the control row holding this database's install id (see ``install_id``)
NOTICE_TRIES = 5  # how often telling a thread its answer was given up is tried (a deleted channel never takes it)


@dataclass(frozen=True)
class OutboxClaim:
    """Given to ``ConversationStore.finish_turn``: write the outbox row, already claimed by ``holder`` (who
    makes the first attempt at once) until ``until``."""

    holder: str
    until: datetime
    written_at: datetime | None = None  # the row's created_at (when the answer was written), if known here


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

    async def trace_context(self, turn_id: int) -> str | None:
        """The trace the turn belongs to (core.tracing): a retried delivery joins it, in any process."""
        return await self.db.run_read(
            lambda s: trace_context(s.connection().execute(st.TURN_INPUTS, {"b_turn": turn_id}).all()))

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

    async def install_id(self, now: datetime) -> str:
        """This database's random id, made the first time it is asked for (once, across replicas). Turn ids
        repeat across databases (a restored backup, a new DATABASE_URL, two deployments of one Slack app):
        a delivered message names both, so only this database's answer proves a delivery."""
        async with self.db.read() as s:
            row = await s.get(ControlRow, INSTALL_KEY)
        if row is None:
            async with self.db.write() as s:  # the first writer's id stands
                await s.exec(self.db.insert(ControlRow).values(
                    key=INSTALL_KEY, value=secrets.token_hex(8), updated_at=now).on_conflict_do_nothing())
            async with self.db.read() as s:
                row = await s.get(ControlRow, INSTALL_KEY)
        assert row is not None
        return row.value

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

    async def extend_claim(self, turn_id: int, *, holder: str, attempt: int, valid_after: datetime,
                           until: datetime) -> DeliveryRow | None:
        """Keep a claim for its attempt, if it is still ``holder``'s for that attempt (nobody, this process
        included, took the row since) and runs past ``valid_after``; the row, or None: leave it alone."""
        def work(s: Session) -> DeliveryRow | None:
            result = s.exec(update(DeliveryRow).where(*st.held(turn_id, holder, attempt),
                                                      col(DeliveryRow.next_attempt_at) > valid_after)
                            .values(next_attempt_at=until))
            return s.get(DeliveryRow, turn_id) if result.rowcount == 1 else None

        return await self.db.run_write(work)

    async def delivered(self, turn_id: int, ref: str, now: datetime, *, holder: str, attempt: int) -> bool:
        """Record where it landed (the turn's ``delivered_ref`` too), in one commit; False if already settled
        or the claim was lost (its new holder finds the post and records it)."""
        if not self.db.is_sqlite:  # one round trip: a statement that is its own transaction
            return bool(await self.db.run_alone(st.DELIVERED_WITH_TURN, dict(
                b_turn=turn_id, b_holder=holder, b_attempt=attempt, b_ref=ref, b_now=now)))

        def work(s: Session) -> bool:
            conn = s.connection()  # Core statements: no ORM bookkeeping on the path of every answer
            result = conn.execute(st.UPDATE_HELD_DELIVERY, dict(
                b_turn=turn_id, b_holder=holder, b_attempt=attempt,
                status=DeliveryStatus.DELIVERED, ref=ref, claimed_by=None, finished_at=now, last_error=None))
            if result.rowcount != 1:
                return False
            conn.execute(st.UPDATE_TURN, dict(b_turn=turn_id, delivered_ref=ref, delivery_error=None))
            return True

        return await self.db.run_write(work)

    async def retry_later(self, turn_id: int, error: str, at: datetime, *, holder: str, attempt: int) -> bool:
        """An attempt failed: release the claim and say when the next one may start."""
        async with self.db.write() as s:
            result = await s.exec(update(DeliveryRow).where(*st.held(turn_id, holder, attempt))
                                  .values(claimed_by=None, next_attempt_at=at, last_error=error))
            return bool(result.rowcount == 1)

    async def give_up(self, turn_id: int, error: str, now: datetime, *, holder: str, attempt: int) -> bool:
        async with self.db.write() as s:
            result = await s.exec(
                update(DeliveryRow).where(*st.held(turn_id, holder, attempt))
                .values(status=DeliveryStatus.GIVEN_UP, claimed_by=None, finished_at=now, last_error=error,
                        next_attempt_at=now)  # the thread may be told from now on
            )
            if result.rowcount != 1:
                return False
            await s.exec(update(TurnRow).where(col(TurnRow.id) == turn_id).values(delivery_error=error))
            return True

    # A given-up row's thread is told with the same claim columns: one process at a time tries, each try
    # claims the row for a while (a dead teller's claim runs out), ``told`` only once the notice was taken.

    async def untold(self, channel: str, now: datetime, limit: int = 20) -> list[int]:
        """Given-up answers in ``channel`` whose thread may be told now (not told yet, not being told)."""
        async with self.db.read() as s:
            rows = await s.exec(select(DeliveryRow.turn_id)
                                .where(*_tellable(now), DeliveryRow.channel == channel)
                                .order_by(col(DeliveryRow.turn_id)).limit(limit))
            return list(rows.all())

    async def take_telling(self, turn_id: int, holder: str, now: datetime, until: datetime) -> Pending | None:
        """Claim a given-up row to tell its thread (one process at a time, across replicas), until ``until``."""
        async with self.db.write() as s:
            result = await s.exec(
                update(DeliveryRow).where(*_tellable(now), col(DeliveryRow.turn_id) == turn_id)
                .values(claimed_by=holder, next_attempt_at=until, notice_tries=DeliveryRow.notice_tries + 1)
            )
            if result.rowcount != 1:
                return None
            row = await s.get(DeliveryRow, turn_id)
            session = await s.get(SessionRow, row.session_id) if row is not None else None
            if row is None or session is None:
                return None
            return Pending(row, session_info(session), "")

    async def told(self, turn_id: int, holder: str) -> bool:
        """The notice was taken: the thread has been told, for good."""
        return await self._end_telling(turn_id, holder, told=True)

    async def tell_later(self, turn_id: int, holder: str, at: datetime) -> bool:
        """The notice was not taken: let another try start at ``at`` (while tries are left)."""
        return await self._end_telling(turn_id, holder, next_attempt_at=at)

    async def _end_telling(self, turn_id: int, holder: str, **values: Any) -> bool:
        async with self.db.write() as s:
            result = await s.exec(
                update(DeliveryRow)
                .where(col(DeliveryRow.turn_id) == turn_id, col(DeliveryRow.status) == DeliveryStatus.GIVEN_UP,
                       col(DeliveryRow.told).is_(False), col(DeliveryRow.claimed_by) == holder)
                .values(claimed_by=None, **values)
            )
            return bool(result.rowcount == 1)

    async def release_claims(self, now: datetime, *, keep: str) -> int:
        """At start with one process per database: claims left by a dead process end now; ``keep``'s (this
        process's own, e.g. a resumed turn's first attempt) stay."""
        async with self.db.write() as s:
            result = await s.exec(
                update(DeliveryRow)
                .where(col(DeliveryRow.status) == DeliveryStatus.PENDING, col(DeliveryRow.claimed_by).is_not(None),
                       col(DeliveryRow.claimed_by) != keep)
                .values(claimed_by=None, next_attempt_at=now)
            )
            return int(result.rowcount)

    async def count(self, status: DeliveryStatus, *, since: datetime | None = None) -> int:
        query = select(func.count()).select_from(DeliveryRow).where(DeliveryRow.status == status)
        if since is not None:
            query = query.where(col(DeliveryRow.created_at) >= since)
        async with self.db.read() as s:
            return int((await s.exec(query)).one())


def _tellable(now: datetime) -> tuple[Any, ...]:
    return (col(DeliveryRow.status) == DeliveryStatus.GIVEN_UP, col(DeliveryRow.told).is_(False),
            col(DeliveryRow.next_attempt_at) <= now, col(DeliveryRow.notice_tries) < NOTICE_TRIES)
