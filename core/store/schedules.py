"""Schedules and firings (SPEC §9)."""

from __future__ import annotations

import json
from datetime import datetime

from sqlalchemy import update
from sqlalchemy.exc import IntegrityError
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from core.model import FiringStatus, InputKind, ScheduleStatus, thread_of
from core.store.approvals import audit_row
from core.store.database import Database
from core.store.tables import FiringRow, InputRow, ScheduleRow, TurnRow
from core.text import MAX_ID, clean_text


class ScheduleStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def add(self, row: ScheduleRow) -> ScheduleRow:
        async with self.db.write() as s:
            s.add(row)
            await s.flush()
            s.add(audit_row(row.created_at, row.creator or "system", "schedule.created", f"schedule:{row.id}",
                            {"place": row.origin_session, "destination": row.destination, "agent": row.agent,
                             "trigger": json.loads(row.trigger)}))
            return row

    async def firing_level(self, session_id: str) -> str | None:
        """The trust level a firing's turns run at (core.trust): its schedule's creator's at creation (a member's
        for one made before levels existed); None for a session that is not a firing."""
        schedule_id = firing_schedule(session_id)
        schedule = await self.get(schedule_id) if schedule_id is not None else None
        return None if schedule is None else (schedule.creator_trust or "member")

    async def writers(self, session_id: str) -> tuple[str, ...] | None:
        """Who had written in the conversation ``session_id`` belongs to (``conversation_writers``)."""
        async with self.db.read() as s:
            return await conversation_writers(s, session_id)

    async def get(self, schedule_id: int) -> ScheduleRow | None:
        async with self.db.read() as s:
            return await s.get(ScheduleRow, schedule_id)

    async def all(self, *, statuses: tuple[str, ...] | None = None) -> list[ScheduleRow]:
        async with self.db.read() as s:
            query = select(ScheduleRow)
            if statuses is not None:
                query = query.where(col(ScheduleRow.status).in_(statuses))
            return list((await s.exec(query.order_by(col(ScheduleRow.id)))).all())

    async def set_status(self, schedule_id: int, status: str, *, now: datetime, by: str = "system",
                         only_from: tuple[str, ...] | None = None, approval_id: int | None = None) -> bool:
        """Change the schedule's status (only from ``only_from``); a change is audited, as ``by``'s."""
        async with self.db.write() as s:
            query = update(ScheduleRow).where(col(ScheduleRow.id) == schedule_id)
            if only_from is not None:
                query = query.where(col(ScheduleRow.status).in_(only_from))
            values: dict[str, object] = {"status": status}
            if approval_id is not None:
                values["approval_id"] = approval_id
            changed = bool((await s.exec(query.values(**values))).rowcount)
            if changed:
                s.add(audit_row(now, by, f"schedule.{status}", f"schedule:{schedule_id}",
                                {"approval": approval_id} if approval_id is not None else None))
            return changed

    async def start_firing(self, schedule_id: int, now: datetime, min_gap_s: float) -> FiringRow | None:
        """Record the next firing, unless one started within ``min_gap_s`` (a re-fire after a crash)."""
        try:
            return await self._start_firing(schedule_id, now, min_gap_s)
        except IntegrityError:  # another scheduler (a lease handover) took this firing's number first
            return None

    async def _start_firing(self, schedule_id: int, now: datetime, min_gap_s: float) -> FiringRow | None:
        async with self.db.write() as s:
            schedule = await s.get(ScheduleRow, schedule_id)
            if schedule is None:
                return None
            if schedule.last_fired_at is not None and (now - schedule.last_fired_at).total_seconds() < min_gap_s:
                return None
            schedule.firings += 1
            schedule.last_fired_at = now
            firing = FiringRow(schedule_id=schedule_id, n=schedule.firings,
                               session_id=f"schedule:{schedule_id}:{schedule.firings}", status=FiringStatus.RUNNING,
                               started_at=now)
            s.add(schedule)
            s.add(firing)
            await s.flush()
            return firing

    async def finish_firing(self, firing_id: int, *, ts: str | None, error: str | None, now: datetime,
                            retire: bool) -> ScheduleRow:
        """Record how a firing ended and the schedule's running tally; ``retire`` ends a one-shot."""
        error = clean_text(error) if error is not None else None  # may quote a model endpoint: no NUL stored
        async with self.db.write() as s:
            firing = await s.get(FiringRow, firing_id)
            assert firing is not None
            firing.status = FiringStatus.FAILED if error else FiringStatus.POSTED
            firing.ts, firing.error, firing.finished_at = ts, error, now
            schedule = await s.get(ScheduleRow, firing.schedule_id)
            assert schedule is not None
            schedule.failures = schedule.failures + 1 if error else 0
            schedule.last_outcome = f"failed: {error}" if error else f"posted (ts {ts})"
            if retire and schedule.status == ScheduleStatus.ACTIVE:
                schedule.status = ScheduleStatus.DONE
            s.add(firing)
            s.add(schedule)
            return schedule

    async def unfinished_firings(self) -> list[FiringRow]:
        async with self.db.read() as s:
            return list((await s.exec(select(FiringRow).where(FiringRow.status == FiringStatus.RUNNING))).all())

    async def firing_input(self, session_id: str) -> int | None:
        async with self.db.read() as s:
            return (await s.exec(select(InputRow.id).where(InputRow.session_id == session_id)
                                 .order_by(col(InputRow.id)).limit(1))).first()

    async def firing_turn(self, session_id: str) -> int | None:
        async with self.db.read() as s:
            return (await s.exec(select(TurnRow.id).where(TurnRow.session_id == session_id)
                                 .order_by(col(TurnRow.id).desc()).limit(1))).first()

    async def firings(self, schedule_id: int, limit: int = 20) -> list[FiringRow]:
        async with self.db.read() as s:
            rows = (await s.exec(select(FiringRow).where(FiringRow.schedule_id == schedule_id)
                                 .order_by(col(FiringRow.n).desc()).limit(limit))).all()
            return list(rows)


def firing_schedule(session_id: str) -> int | None:
    """The schedule whose firing ``session_id`` is (``schedule:<id>:<n>``, minted by core only), or None."""
    parts = session_id.split(":")
    if (len(parts) != 3 or parts[0] != "schedule" or not (parts[1].isascii() and parts[1].isdigit())
            or len(parts[1]) > 19 or int(parts[1]) > MAX_ID):  # (a longer run of digits is no id, and slow to read)
        return None
    return int(parts[1])


def recorded_senders(schedule: ScheduleRow) -> tuple[str, ...] | None:
    """Who had written where the schedule was asked for, as recorded when it was created; None: not recorded."""
    try:
        senders = json.loads(schedule.origin_senders) if schedule.origin_senders is not None else None
    except json.JSONDecodeError:
        return None
    if not isinstance(senders, list) or not all(isinstance(who, str) and who for who in senders):
        return None
    return tuple(senders)


async def conversation_writers(s: AsyncSession, session_id: str) -> tuple[str, ...] | None:
    """Everyone whose words the model may read in the conversation ``session_id`` belongs to (a sub-agent's:
    its parent's), asked, steered or recorded as context (never controls), in order of their first message.
    A firing's session holds only its creator's prompt, but its schedule was shaped where it was asked for: the
    people recorded there count too. None: not known (a firing of a schedule that recorded nobody), never
    "the creator alone"."""
    thread = thread_of(session_id)
    senders = (await s.exec(select(InputRow.sender).where(
        InputRow.session_id == thread, InputRow.kind != InputKind.CONTROL).order_by(col(InputRow.id)))).all()
    here = tuple(dict.fromkeys(sender for sender in senders if sender))
    if not thread.startswith("schedule:"):
        return here
    schedule_id = firing_schedule(thread)
    schedule = await s.get(ScheduleRow, schedule_id) if schedule_id is not None else None
    recorded = recorded_senders(schedule) if schedule is not None else None
    return None if recorded is None else tuple(dict.fromkeys((*recorded, *here)))
