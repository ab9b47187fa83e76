"""Connected accounts, turns parked for consent, and consent states (SPEC §16). No plaintext token here."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import delete, or_, update
from sqlalchemy.exc import IntegrityError
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from core.model import ConnectionGap, ConnectionRequestInfo, ConnectionStatus, SessionStatus
from core.store.approvals import audit_row
from core.store.connection_tables import ConnectionRequestRow, ConnectionRow, OAuthStateRow
from core.store.database import Database
from core.store.requests import RequestRows
from core.store.row_views import session_info
from core.store.schedules import conversation_writers
from core.store.tables import SessionRow

Connected = tuple[ConnectionRow, ConnectionRequestInfo | None]
# Why a state was not usable: unknown (never minted, or minted for nothing we keep), used, or expired.
StateProblem = Literal["unknown", "used", "expired"]


class ConnectionStore:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.requests = RequestRows(db, ConnectionRequestRow, waiting=SessionStatus.WAITING_CONNECTION, info=_info)

    # -- accounts -------------------------------------------------------------------------------

    async def get(self, name: str, owner: str) -> ConnectionRow | None:
        async with self.db.read() as s:
            return (await s.exec(select(ConnectionRow).where(
                ConnectionRow.name == name, ConnectionRow.owner == owner))).first()

    async def listed(self, owner: str | None = None, name: str | None = None) -> list[ConnectionRow]:
        async with self.db.read() as s:
            query = select(ConnectionRow)
            if owner is not None:
                query = query.where(ConnectionRow.owner == owner)
            if name is not None:
                query = query.where(ConnectionRow.name == name)
            return list((await s.exec(query.order_by(col(ConnectionRow.name), col(ConnectionRow.owner)))).all())

    async def connect(self, row: ConnectionRow, *, seal: Callable[[ConnectionRow], None], request_id: int | None,
                      by: str, now: datetime, audit: dict[str, Any]) -> Connected:
        """Store (or replace) an account's tokens and settle the request that waited for it, in one commit.
        Returns the row and the request as settled here (None: there was none, or it was already settled)."""
        try:
            return await self._connect(row, seal=seal, request_id=request_id, by=by, now=now, audit=audit)
        except IntegrityError:  # the same account stored by another process at the same moment: replace it
            return await self._connect(row, seal=seal, request_id=request_id, by=by, now=now, audit=audit)

    async def _connect(self, row: ConnectionRow, *, seal: Callable[[ConnectionRow], None], request_id: int | None,
                       by: str, now: datetime, audit: dict[str, Any]) -> Connected:
        async with self.db.write() as s:
            existing = (await s.exec(select(ConnectionRow).where(
                ConnectionRow.name == row.name, ConnectionRow.owner == row.owner))).first()
            if existing is not None:
                for key in ("scopes", "expires_at", "refreshable", "meta", "connected_by"):
                    setattr(existing, key, getattr(row, key))
                existing.updated_at, existing.refreshed_at = now, None
                row = existing
            s.add(row)
            await s.flush()
            seal(row)  # the row id is part of what the tokens are bound to
            s.add(row)
            s.add(audit_row(now, by, "connection.connect", f"connection:{row.name}",
                            {"owner": row.owner} | audit))
            settled = None
            if request_id is not None:
                won, request = await self.requests.settle_in(s, request_id,
                                                             _settled(ConnectionStatus.CONNECTED, now, by))
                settled = await _info(s, request) if won and request is not None else None
            return row, settled

    async def claim_refresh(self, row_id: int, *, expected_ciphertext: str, now: datetime, until: datetime) -> bool:
        """This process refreshes these tokens (a rotating refresh token works once): False while another
        one does, or once they changed."""
        async with self.db.write() as s:
            result = await s.exec(update(ConnectionRow).where(
                col(ConnectionRow.id) == row_id, col(ConnectionRow.ciphertext) == expected_ciphertext,
                or_(col(ConnectionRow.refreshing_until).is_(None), col(ConnectionRow.refreshing_until) <= now))
                .values(refreshing_until=until))
            return bool(result.rowcount)

    async def release_refresh(self, row_id: int) -> None:
        async with self.db.write() as s:
            await s.exec(update(ConnectionRow).where(col(ConnectionRow.id) == row_id).values(refreshing_until=None))

    async def replace_tokens(self, row_id: int, *, expected_ciphertext: str, key_id: str, ciphertext: str,
                             expires_at: datetime | None, refreshable: bool, scopes: str | None, now: datetime,
                             by: str) -> bool:
        """A refresh's new tokens, only if nobody refreshed meanwhile (else the caller reads theirs)."""
        async with self.db.write() as s:
            values: dict[str, Any] = {"key_id": key_id, "ciphertext": ciphertext, "expires_at": expires_at,
                                      "refreshable": refreshable, "updated_at": now, "refreshed_at": now,
                                      "refreshing_until": None}
            if scopes is not None:
                values["scopes"] = scopes
            result = await s.exec(update(ConnectionRow).where(
                col(ConnectionRow.id) == row_id, col(ConnectionRow.ciphertext) == expected_ciphertext).values(**values))
            row = await s.get(ConnectionRow, row_id)
            if result.rowcount and row is not None:
                s.add(audit_row(now, by, "connection.refresh", f"connection:{row.name}", {"owner": row.owner}))
            return bool(result.rowcount)

    async def reseal(self, row_id: int, *, expected_ciphertext: str, key_id: str, ciphertext: str,
                     now: datetime) -> bool:
        """The same tokens under another key (``bot credentials rotate``): only if they are still the ones read
        and no refresh is in flight, whose new tokens must not be lost (a rotating refresh token works once)."""
        async with self.db.write() as s:
            result = await s.exec(update(ConnectionRow).where(
                col(ConnectionRow.id) == row_id, col(ConnectionRow.ciphertext) == expected_ciphertext,
                or_(col(ConnectionRow.refreshing_until).is_(None), col(ConnectionRow.refreshing_until) <= now))
                .values(key_id=key_id, ciphertext=ciphertext))
            return bool(result.rowcount)

    async def mark_expired(self, row_id: int, *, expected_ciphertext: str, now: datetime, why: str) -> None:
        """The grant is dead (a refresh was refused): the account needs consent again."""
        async with self.db.write() as s:
            result = await s.exec(update(ConnectionRow).where(
                col(ConnectionRow.id) == row_id, col(ConnectionRow.ciphertext) == expected_ciphertext)
                .values(refreshable=False, expires_at=now, updated_at=now, refreshing_until=None))
            row = await s.get(ConnectionRow, row_id)
            if result.rowcount and row is not None:
                s.add(audit_row(now, "system", "connection.refresh_failed", f"connection:{row.name}",
                                {"owner": row.owner, "error": why}))

    async def touch(self, row_id: int, now: datetime) -> None:
        async with self.db.write() as s:
            await s.exec(update(ConnectionRow).where(col(ConnectionRow.id) == row_id).values(last_used_at=now))

    async def delete(self, row_id: int, *, expected_ciphertext: str, by: str, now: datetime,
                     detail: dict[str, Any]) -> bool:
        """Only the tokens that were revoked: False if they changed meanwhile (a reconnect, a refresh)."""
        async with self.db.write() as s:
            row = await s.get(ConnectionRow, row_id)
            if row is None or row.ciphertext != expected_ciphertext:
                return False
            await s.exec(delete(ConnectionRow).where(col(ConnectionRow.id) == row_id,
                                                     col(ConnectionRow.ciphertext) == expected_ciphertext))
            s.add(audit_row(now, by, "connection.disconnect", f"connection:{row.name}", {"owner": row.owner} | detail))
            return True

    # -- consent states ------------------------------------------------------------------------

    async def add_state(self, row: OAuthStateRow) -> None:
        async with self.db.write() as s:
            s.add(row)

    async def state(self, hashed: str) -> OAuthStateRow | None:
        async with self.db.read() as s:
            return await s.get(OAuthStateRow, hashed)

    async def open_state(self, hashed: str, now: datetime) -> tuple[OAuthStateRow | None, StateProblem | None]:
        """A personal link opened: once (a second opening, by anyone, is refused)."""
        return await self._use_state(hashed, now, OAuthStateRow.opened_at, opened_at=now)

    async def claim_state(self, hashed: str, now: datetime) -> tuple[OAuthStateRow | None, StateProblem | None]:
        """Use a state once: the first callback carrying it wins, a retry or a prefetch finds it used."""
        return await self._use_state(hashed, now, OAuthStateRow.used_at, used_at=now)

    async def _use_state(self, hashed: str, now: datetime, column: Any, **values: datetime
                         ) -> tuple[OAuthStateRow | None, StateProblem | None]:
        async with self.db.write() as s:
            result = await s.exec(update(OAuthStateRow).where(
                col(OAuthStateRow.state_hash) == hashed, col(column).is_(None),
                col(OAuthStateRow.expires_at) > now).values(**values))
            row = await s.get(OAuthStateRow, hashed)
            if row is None:
                return None, "unknown"
            if not result.rowcount:
                return row, "expired" if row.expires_at <= now else "used"
            return row, None

    async def prune_states(self, before: datetime) -> None:
        async with self.db.write() as s:
            await s.exec(delete(OAuthStateRow).where(col(OAuthStateRow.expires_at) < before))

    # -- parked calls ---------------------------------------------------------------------------

    async def park(self, row: ConnectionRequestRow) -> ConnectionRequestInfo:
        return await self.requests.park(row)

    async def settle(self, request_id: int, status: ConnectionStatus, now: datetime, by: str | None = None
                     ) -> tuple[bool, ConnectionRequestInfo | None]:
        return await self.requests.settle(request_id, _settled(status, now, by))

    async def mark_resumed(self, request_id: int, now: datetime) -> bool:
        """The parked call goes on: once. A second caller (a restart, another replica) is told no."""
        async with self.db.write() as s:
            result = await s.exec(update(ConnectionRequestRow).where(
                col(ConnectionRequestRow.id) == request_id, col(ConnectionRequestRow.resumed_at).is_(None))
                .values(resumed_at=now))
            return bool(result.rowcount)

    async def request(self, request_id: int) -> ConnectionRequestInfo | None:
        return await self.requests.get(request_id)

    async def for_call(self, session_id: str, call_id: str, turn_id: int) -> tuple[ConnectionRequestInfo, bool] | None:
        """The latest request this call parked on in this turn, and whether the call went on after it."""
        async with self.db.read() as s:
            row = await self.requests.latest_for_call(s, session_id, call_id,
                                                      col(ConnectionRequestRow.turn_id) == turn_id)
            return (await _info(s, row), row.resumed_at is not None) if row is not None else None

    async def conversation_senders(self, session_id: str) -> tuple[str, ...] | None:
        """Everyone whose words the model may read in this conversation, a firing's included
        (``core.store.schedules.conversation_writers``); None: not known."""
        async with self.db.read() as s:
            return await conversation_writers(s, session_id)

    async def session_channel(self, session_id: str) -> str | None:
        """The channel of a conversation (None: no such session)."""
        async with self.db.read() as s:
            row = await s.get(SessionRow, session_id)
            return row.channel if row is not None else None

    async def pending(self, *, due_before: datetime | None = None) -> list[ConnectionRequestInfo]:
        return await self.requests.pending(due_before=due_before)

    async def recent(self, session_id: str, limit: int = 50) -> list[ConnectionRequestInfo]:
        return await self.requests.recent(session_id, limit)

    async def record_announcement(self, request_id: int, where: dict[str, Any]) -> None:
        await self.requests.record_announcement(request_id, where)

    async def audit(self, at: datetime, actor: str, action: str, subject: str, detail: dict[str, Any]) -> None:
        async with self.db.write() as s:
            s.add(audit_row(at, actor, action, subject, detail))


def _settled(status: ConnectionStatus, now: datetime, by: str | None) -> dict[str, Any]:
    return {"status": status, "settled_at": now, "settled_by": by}


async def _info(s: AsyncSession, row: ConnectionRequestRow) -> ConnectionRequestInfo:
    session = await s.get(SessionRow, row.session_id)
    assert session is not None and row.id is not None
    return ConnectionRequestInfo(
        id=row.id, session=session_info(session), connection=row.connection, principal=row.principal,
        gap=ConnectionGap(row.gap), scopes=tuple(json.loads(row.scopes)), agent=row.agent,
        status=ConnectionStatus(row.status), created_at=row.created_at, expires_at=row.expires_at,
        settled_by=row.settled_by, announcement=json.loads(row.announcement) if row.announcement else None,
        turn_id=row.turn_id)
