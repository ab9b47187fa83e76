"""Lease rows with an expiry and a heartbeat (SPEC §11): no connection is pinned, and a dead holder's
lease simply runs out and is taken over.

A session's lease is taken in the transaction that starts its turn, and given back in one that also
checks nothing waits (``take_batch``, ``release_if_idle``): a turn costs no transactions of its own for
the lease. The statements are built once (see core.store.statements)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, delete, exists, select, update
from sqlmodel import Session

from core.model import InputKind, InputStatus
from core.store.database import Database
from core.store.tables import InputRow, LeaseRow

leases = LeaseRow.__table__  # type: ignore[attr-defined]
_inputs = InputRow.__table__  # type: ignore[attr-defined]

_OURS = (leases.c.name == bindparam("b_name"), leases.c.holder == bindparam("b_holder"))
RENEW = update(leases).where(*_OURS)
RELEASE = delete(leases).where(*_OURS)
# Given back only when no message of the session waits: one another replica accepted (which wakes no
# driver here) is then taken by the next turn of this holder, never left behind a lease nobody uses.
RELEASE_IF_IDLE = delete(leases).where(*_OURS, ~exists().where(
    _inputs.c.session_id == bindparam("b_session"), _inputs.c.status == InputStatus.WAITING,
    _inputs.c.kind == InputKind.MESSAGE))
HELD = select(leases.c.name).where(*_OURS)
LIVE = select(leases.c.name).where(leases.c.name.in_(bindparam("b_names", expanding=True)),
                                   leases.c.expires_at >= bindparam("b_now"))


@dataclass(frozen=True)
class LeaseClaim:
    """Who asks for a lease, and for how long from the moment it is taken."""

    name: str
    holder: str
    ttl: timedelta


@dataclass(frozen=True)
class LeaseTake:
    """Taking a lease in the transaction that starts a turn: called with that transaction's Session (True when taken),
    or, on PostgreSQL, folded into the statement that reads the turn's head (``params``; core.store.inputs)."""

    store: LeaseStore
    claim: LeaseClaim
    now: datetime

    def __call__(self, s: Session) -> bool:
        return self.store.acquire_in(s, self.claim, self.now)

    def params(self) -> dict[str, Any]:
        """For core.store.statements.SESSION_FOR_TURN_UNDER_LEASE."""
        return {"l_name": self.claim.name, "l_holder": self.claim.holder, "l_until": self.now + self.claim.ttl,
                "l_now": self.now}


@dataclass
class GiveBack:
    """A session's lease given back in the transaction that ends its turn, unless a message of the session waits
    (``finish_turn``; on PostgreSQL inside the turn end's statement). ``given_back``, once that ran: True when the
    holder does not hold it any more (given back, or not its own), False when kept (a message waits)."""

    name: str
    holder: str
    session_id: str
    given_back: bool | None = None

    def params(self) -> dict[str, Any]:
        """For core.store.statements.turn_end(..., give_back=True)."""
        return {"l_name": self.name, "l_holder": self.holder, "l_session": self.session_id}

    def run_in(self, s: Session) -> None:
        """As a statement of its own in the caller's transaction (SQLite, or a turn end of several statements)."""
        self.given_back = release_if_idle_in(s, self.name, self.holder, self.session_id)


class LeaseStore:
    def __init__(self, db: Database) -> None:
        self.db = db
        # Taken if free, expired, or already ours (then extended); built once, in the database's dialect.
        insert = db.insert(leases)
        self._acquire = insert.on_conflict_do_update(
            index_elements=["name"],
            set_={"holder": insert.excluded.holder, "expires_at": insert.excluded.expires_at},
            where=(leases.c.expires_at < bindparam("b_now")) | (leases.c.holder == insert.excluded.holder))

    def acquire_in(self, s: Session, claim: LeaseClaim, now: datetime) -> bool:
        """Take the lease inside a caller's transaction (e.g. the one that starts a turn)."""
        result: Any = s.connection().execute(self._acquire, {
            "name": claim.name, "holder": claim.holder, "expires_at": now + claim.ttl, "b_now": now})
        return bool(result.rowcount)

    async def acquire(self, name: str, holder: str, ttl: timedelta, now: datetime) -> bool:
        claim = LeaseClaim(name, holder, ttl)
        return await self.db.run_write(lambda s: self.acquire_in(s, claim, now))

    async def renew(self, name: str, holder: str, ttl: timedelta, now: datetime) -> bool:
        params = {"b_name": name, "b_holder": holder, "expires_at": now + ttl}
        return await self.db.run_write(lambda s: bool(_rowcount(s, RENEW, params)))

    async def release(self, name: str, holder: str) -> None:
        await self.db.run_write(lambda s: _rowcount(s, RELEASE, {"b_name": name, "b_holder": holder}))

    def release_if_idle_in(self, s: Session, name: str, holder: str, session_id: str) -> bool:
        """Give the session's lease back, inside a caller's transaction (the one that ends a turn), unless
        one of its messages waits. True when the holder no longer holds it (given back, or not its own)."""
        return release_if_idle_in(s, name, holder, session_id)

    async def release_if_idle(self, name: str, holder: str, session_id: str) -> bool:
        return await self.db.run_write(lambda s: self.release_if_idle_in(s, name, holder, session_id))

    async def live_holders(self, names: list[str], now: datetime) -> set[str]:
        """Which of these leases are held (unexpired) by anyone."""
        if not names:
            return set()
        rows = await self.db.run_read(
            lambda s: s.connection().execute(LIVE, {"b_names": names, "b_now": now}).scalars().all())
        return set(rows)


def release_if_idle_in(s: Session, name: str, holder: str, session_id: str) -> bool:
    """``LeaseStore.release_if_idle_in``."""
    params = {"b_name": name, "b_holder": holder, "b_session": session_id}
    if _rowcount(s, RELEASE_IF_IDLE, params):
        return True
    # Not deleted: a message waits, or the lease is not ours (then there is nothing to give back).
    return s.connection().execute(HELD, params).first() is None


def _rowcount(s: Session, statement: Any, params: dict[str, Any]) -> int:
    result: Any = s.connection().execute(statement, params)
    return int(result.rowcount or 0)
