"""Events in, stored (SPEC §17): each delivery deduplicated by its delivery id (GitHub: or its body), counted in its
source's rate window (duplicates in a window of their own) and stored in one transaction before it is answered;
then taken by the processor, finished, listed, replayed and pruned. Deliveries that arrive together are committed
in groups (``core.store.intake.GroupCommit``)."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, delete, func, insert, select, text, update
from sqlmodel import Session, col
from sqlmodel import select as model_select

from core.errors import NotFound
from core.store.database import Database
from core.store.intake import GroupCommit, written_apart
from core.store.tables import WebhookEventRow, WebhookRateRow
from core.webhooks.model import DUPLICATE, FILTERED, QUEUED, EventArrival, Received

events = WebhookEventRow.__table__  # type: ignore[attr-defined]
rates = WebhookRateRow.__table__  # type: ignore[attr-defined]
WINDOW = timedelta(minutes=1)
DUPLICATES = "/dup"  # a source's duplicates are counted under its name + this (no source name holds a "/")

# The first row of a delivery: the same delivery id, or (GitHub) the same signed body. A NULL matches nothing.
# One look-up each, with the partial unique indexes' own condition written out (not an OR, not a bound status):
# otherwise SQLite and PostgreSQL cannot use those indexes, and every delivery scanned the whole table.
_FIRST = text(f"status <> '{DUPLICATE}'")
FIRST_BY_ID = select(events.c.id).where(events.c.source == bindparam("b_source"),
                                        events.c.delivery_id == bindparam("b_delivery"), _FIRST).limit(1)
FIRST_BY_BODY = select(events.c.id).where(events.c.source == bindparam("b_source"),
                                          events.c.body_digest == bindparam("b_digest"), _FIRST).limit(1)
INSERT_EVENT = insert(events)
# An event's end, with (or without) the session and input its turn took it as: built once, not per row.
END = update(events).where(events.c.id == bindparam("b_id")).values(
    status=bindparam("status"), note=bindparam("note"), finished_at=bindparam("finished_at"))
END_TAKEN = END.values(session_id=bindparam("session_id"), input_id=bindparam("input_id"))


def window_start(now: datetime) -> datetime:
    """The fixed minute ``now`` falls in."""
    return now.replace(second=0, microsecond=0)


class WebhookEventStore:
    def __init__(self, db: Database) -> None:
        self.db = db
        # One transaction at a time on SQLite (one writer anyway); on PostgreSQL a few groups at once.
        self._group: GroupCommit[EventArrival, Received] = GroupCommit(self._write, writers=1 if db.is_sqlite else 4)
        # Events settle as fast as they arrive: their ends are written in groups too, not a transaction each.
        self._ends: GroupCommit[dict[str, Any], None] = GroupCommit(self._write_ends, writers=1 if db.is_sqlite else 2)
        counted = db.insert(rates).values(source=bindparam("source"), window_start=bindparam("window_start"), count=1)
        self._count = counted.on_conflict_do_update(
            index_elements=[rates.c.source, rates.c.window_start],
            set_={"count": rates.c.count + 1}).returning(rates.c.count)

    @property
    def commits(self) -> GroupCommit[EventArrival, Received]:
        return self._group

    async def receive(self, arrival: EventArrival) -> Received:
        """A delivery id (or GitHub body) already taken is a ``duplicate``: recorded up to the rate's number a
        minute, never counted against new deliveries. Anything else is counted in its source's minute; over the
        rate nothing is stored (``limited``), else it is stored ``queued`` or ``filtered``. Returns once
        committed."""
        return await self._group.submit(arrival)

    async def _write(self, arrivals: list[EventArrival]) -> list[Received | Exception]:
        # Another replica storing the same delivery id at the same moment: the loser finds the winner's row.
        return await written_apart(
            lambda group: self.db.run_write(lambda s: [self._receive_one(s, a) for a in group], urgent=True), arrivals)

    def _receive_one(self, s: Session, arrival: EventArrival) -> Received:
        conn = s.connection()
        start = window_start(arrival.now)
        first = None
        if arrival.delivery_id is not None:
            first = conn.execute(FIRST_BY_ID, {"b_source": arrival.source, "b_delivery": arrival.delivery_id}).scalar()
        if first is None and arrival.body_digest is not None:
            first = conn.execute(FIRST_BY_BODY, {"b_source": arrival.source, "b_digest": arrival.body_digest}).scalar()
        if first is not None:
            # Counted apart: a captured delivery sent over and over must not use up the source's rate (its real
            # events would be refused), and only so many of its copies are recorded.
            counted = {"source": arrival.source + DUPLICATES, "window_start": start}
            if int(conn.execute(self._count, counted).scalar_one()) > arrival.rate_per_minute:
                return Received("duplicate", int(first))  # answered as one, not recorded
            status, note = DUPLICATE, f"duplicate of {first}"
        else:
            count = int(conn.execute(self._count, {"source": arrival.source, "window_start": start}).scalar_one())
            if count > arrival.rate_per_minute:
                # The count stays raised (it only says how hard the source knocked); the window ends on its own.
                left = (start + WINDOW - arrival.now).total_seconds()
                return Received("limited", retry_after_s=max(1, math.ceil(left)))
            status, note = (FILTERED if arrival.filtered else QUEUED), None
        inserted = conn.execute(INSERT_EVENT, dict(
            source=arrival.source, kind=arrival.kind, event_type=arrival.event_type, delivery_id=arrival.delivery_id,
            body_digest=arrival.body_digest, status=status, payload=arrival.payload, thread_key=arrival.thread_key,
            note=note, received_at=arrival.now))
        event_id = int(inserted.inserted_primary_key[0])  # type: ignore[index]
        return Received(status, event_id)  # type: ignore[arg-type]

    async def get(self, event_id: int) -> WebhookEventRow | None:
        async with self.db.read() as s:
            return await s.get(WebhookEventRow, event_id)

    async def queued(self) -> list[WebhookEventRow]:
        """Events still to answer, oldest first, whole (the processor polls ``queued_ids``)."""
        async with self.db.read() as s:
            found = await s.exec(model_select(WebhookEventRow).where(col(WebhookEventRow.status) == QUEUED)
                                 .order_by(col(WebhookEventRow.id)))
            return list(found.all())

    async def queued_ids(self) -> list[int]:
        """The ids of the events still to answer, oldest first: what the processor polls for (a backlog's
        payloads, up to EVENT_MAX_BODY_BYTES each, are read one by one as their events are taken, not at every
        poll)."""
        async with self.db.read() as s:
            found = await s.exec(select(events.c.id).where(events.c.status == QUEUED)  # type: ignore[call-overload]
                                 .order_by(events.c.id))
            return [int(event_id) for event_id in found.scalars().all()]

    async def finish(self, event_id: int, *, status: str, note: str | None, now: datetime,
                     session_id: str | None = None, input_id: int | None = None) -> None:
        """Answered or failed (why, in ``note``); with the session and input its turn took it as, when it got one."""
        values: dict[str, Any] = {"b_id": event_id, "status": status, "note": note, "finished_at": now}
        if session_id is not None:
            values |= {"session_id": session_id, "input_id": input_id}
        await self._ends.submit(values)

    async def _write_ends(self, ends: list[dict[str, Any]]) -> list[Exception | None]:
        def write(s: Session) -> list[Exception | None]:
            conn = s.connection()
            for values in ends:
                conn.execute(END_TAKEN if "session_id" in values else END, values)
            return [None] * len(ends)

        return await self.db.run_write(write)

    async def list(self, *, source: str | None = None, limit: int = 50) -> list[WebhookEventRow]:
        """The newest events first, of one source or all."""
        query = model_select(WebhookEventRow).order_by(col(WebhookEventRow.id).desc()).limit(limit)
        if source is not None:
            query = query.where(col(WebhookEventRow.source) == source)
        async with self.db.read() as s:
            return list((await s.exec(query)).all())

    async def replay(self, event_id: int, now: datetime) -> WebhookEventRow:
        """A new queued event with the same source, type, payload and thread as ``event_id`` (no delivery id: it
        is nobody's redelivery). NotFound for an unknown id."""

        def copy(s: Session) -> WebhookEventRow:
            old = s.get(WebhookEventRow, event_id)
            if old is None:
                raise NotFound(f"there is no event {event_id}; `bot events list` shows them")
            new = WebhookEventRow(source=old.source, kind=old.kind, event_type=old.event_type, delivery_id=None,
                                  status=QUEUED, payload=old.payload, thread_key=old.thread_key, received_at=now,
                                  replay_of=old.id)
            s.add(new)
            s.flush()
            return new

        return await self.db.run_write(copy)

    async def prune(self, before: datetime) -> int:
        """Forget events received before ``before`` (except those still queued: work not done yet) and rate
        windows that started before it. Returns the events removed."""

        def forget(s: Session) -> int:
            conn = s.connection()
            removed = conn.execute(delete(events).where(events.c.received_at < before, events.c.status != QUEUED))
            conn.execute(delete(rates).where(rates.c.window_start < before))
            return int(removed.rowcount or 0)

        return await self.db.run_write(forget)

    async def counts(self) -> dict[tuple[str, str], int]:
        """Events by (source, status), for /metrics."""
        query = select(events.c.source, events.c.status, func.count()).group_by(events.c.source, events.c.status)
        async with self.db.read() as s:
            rows = (await s.exec(query)).all()  # type: ignore[call-overload]
        return {(str(source), str(status)): int(n) for source, status, n in rows}
