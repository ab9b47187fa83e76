"""Each listening place's unaddressed turns per fixed minute (``Inbound.listen_per_minute``), counted in the database
in the transaction that stores the message: the limit holds across restarts and replicas (an upsert's count is exact
on PostgreSQL too, where two replicas may store messages of one place at the same moment)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import bindparam, delete
from sqlmodel import Session

from core.store.database import Database
from core.store.tables import ListenRateRow

rates = ListenRateRow.__table__  # type: ignore[attr-defined]
# A place's earlier minutes are forgotten as its next one is counted: one row per place, never a pile of them.
FORGET_EARLIER = delete(rates).where(rates.c.place == bindparam("b_place"),
                                     rates.c.window_start < bindparam("b_start"))


class ListenRates:
    def __init__(self, db: Database) -> None:
        counted = db.insert(rates).values(place=bindparam("place"), window_start=bindparam("window_start"), count=1)
        self._count = counted.on_conflict_do_update(index_elements=[rates.c.place, rates.c.window_start],
                                                    set_={"count": rates.c.count + 1}).returning(rates.c.count)

    def admit(self, s: Session, place: str, now: datetime, per_minute: int) -> bool:
        """Count one more unaddressed turn at ``place`` in the minute of ``now``: True while within ``per_minute``.
        The count stays raised beyond it (the minute ends on its own)."""
        start = now.replace(second=0, microsecond=0)
        conn = s.connection()
        conn.execute(FORGET_EARLIER, {"b_place": place, "b_start": start})
        return int(conn.execute(self._count, {"place": place, "window_start": start}).scalar_one()) <= per_minute
