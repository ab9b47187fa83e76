"""Sealed secrets, grants, credential requests and one-time link ids (SPEC §8). No plaintext here."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import delete, or_, update
from sqlalchemy.exc import IntegrityError
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from core.model import CredentialRequestInfo, CredentialStatus, SessionStatus
from core.store.approvals import audit_row
from core.store.database import Database
from core.store.requests import RequestRows
from core.store.row_views import session_info
from core.store.statements import secrets_fingerprint
from core.store.tables import (
    CredentialLinkRow,
    CredentialRequestRow,
    SecretGrantRow,
    SecretRow,
    SessionRow,
)

# How providing a value ended: stored; already settled by someone else; too late (now settled as
# expired); or a secret of that name, scope and owner exists (request cancelled, nothing replaced).
Provided = Literal["stored", "settled", "expired", "exists"]


class CredentialStore:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.requests = RequestRows(db, CredentialRequestRow, waiting=SessionStatus.WAITING_CREDENTIAL, info=_info)

    # -- secrets --------------------------------------------------------------------------------

    async def save_secret(self, row: SecretRow, *, seal: Callable[[SecretRow], None], grant: str | None, by: str,
                          now: datetime, s: AsyncSession | None = None) -> SecretRow:
        """Insert or replace (same name, scope, owner) a secret; grant a shared one to ``grant``.

        The row id is part of what the ciphertext is bound to, so ``seal`` fills in ``key_id``,
        ``ciphertext`` and ``aad_version`` once the row has its id, in the same transaction."""
        if s is None:
            async with self.db.write() as session:
                return await self.save_secret(row, seal=seal, grant=grant, by=by, now=now, s=session)
        existing = (await s.exec(select(SecretRow).where(
            SecretRow.name == row.name, SecretRow.scope == row.scope, SecretRow.agent == row.agent))).first()
        if existing is not None:
            existing.hosts, existing.updated_at, existing.created_by = row.hosts, now, by
            row = existing
        s.add(row)
        await s.flush()
        assert row.id is not None
        seal(row)
        s.add(row)
        if grant is not None and row.scope == "shared":
            if await s.get(SecretGrantRow, (row.id, grant)) is None:
                s.add(SecretGrantRow(secret_id=row.id, agent=grant, granted_by=by, granted_at=now))
        s.add(audit_row(now, by, "credential.stored", f"credential:{row.name}",
                     {"scope": row.scope, "agent": row.agent or None, "key_id": row.key_id,
                      "hosts": json.loads(row.hosts) if row.hosts else None}))
        return row

    async def stored(self, name: str, scope: str, agent: str) -> SecretRow | None:
        """The secret of that name, scope and owner (``agent`` is "" for a shared one), if any."""
        async with self.db.read() as s:
            return await _stored(s, name, scope, agent)

    async def usable(self, agent: str, name: str | None = None) -> list[SecretRow]:
        """Secrets this agent may use: its own, and shared ones granted to it."""
        async with self.db.read() as s:
            granted = select(SecretGrantRow.secret_id).where(SecretGrantRow.agent == agent)
            query = select(SecretRow).where(or_(
                (col(SecretRow.scope) == "agent") & (col(SecretRow.agent) == agent),
                (col(SecretRow.scope) == "shared") & col(SecretRow.id).in_(granted),
            ))
            if name is not None:
                query = query.where(SecretRow.name == name)
            return list((await s.exec(query.order_by(col(SecretRow.name)))).all())

    async def all_secrets(self) -> list[SecretRow]:
        async with self.db.read() as s:
            return list((await s.exec(select(SecretRow).order_by(col(SecretRow.name)))).all())

    async def fingerprint(self) -> tuple[object, ...]:
        """Changes whenever a secret is stored, replaced, re-sealed or deleted (one small query): the
        mask cache of every process compares it to know when to reload."""
        return await self.db.run_read(secrets_fingerprint)

    async def grants_of(self, secret_id: int) -> list[str]:
        async with self.db.read() as s:
            return list((await s.exec(select(SecretGrantRow.agent).where(SecretGrantRow.secret_id == secret_id))).all())

    async def delete_secret(self, name: str, *, by: str, now: datetime) -> int:
        async with self.db.write() as s:
            ids = list((await s.exec(select(SecretRow.id).where(SecretRow.name == name))).all())
            if not ids:
                return 0
            await s.exec(delete(SecretGrantRow).where(col(SecretGrantRow.secret_id).in_(ids)))
            await s.exec(delete(SecretRow).where(col(SecretRow.id).in_(ids)))
            s.add(audit_row(now, by, "credential.deleted", f"credential:{name}", None))
            return len(ids)

    async def reseal(self, secret_id: int, *, expected_ciphertext: str, key_id: str, ciphertext: str,
                     aad_version: int, now: datetime) -> bool:
        """Replace one ciphertext, only if it is still the one read (safe to run twice, or on two replicas)."""
        async with self.db.write() as s:
            result = await s.exec(update(SecretRow)
                                  .where(col(SecretRow.id) == secret_id,
                                         col(SecretRow.ciphertext) == expected_ciphertext)
                                  .values(key_id=key_id, ciphertext=ciphertext, aad_version=aad_version,
                                          updated_at=now))
            return bool(result.rowcount)

    async def touch(self, secret_ids: list[int], now: datetime) -> None:
        if secret_ids:
            async with self.db.write() as s:
                await s.exec(update(SecretRow).where(col(SecretRow.id).in_(secret_ids)).values(last_used_at=now))

    # -- requests -------------------------------------------------------------------------------

    async def park(self, row: CredentialRequestRow) -> CredentialRequestInfo:
        return await self.requests.park(row)

    async def provide(self, request_id: int, secret: SecretRow, *, seal: Callable[[SecretRow], None], by: str,
                      now: datetime) -> tuple[Provided, CredentialRequestInfo | None]:
        """Store the sealed value and settle the request in one commit, once: a second submission loses.

        Only before ``expires_at`` (after it the request is settled as expired), and never over a stored
        secret: a request adds a value, only an operator replaces one (``save_secret`` directly)."""
        try:
            return await self._provide(request_id, secret, seal=seal, by=by, now=now)
        except IntegrityError:  # another process stored that name at the same moment: it exists now
            return await self._provide(request_id, secret, seal=seal, by=by, now=now)

    async def _provide(self, request_id: int, secret: SecretRow, *, seal: Callable[[SecretRow], None], by: str,
                       now: datetime) -> tuple[Provided, CredentialRequestInfo | None]:
        async with self.db.write() as s:
            outcome: Provided = "settled"
            won, row = await self.requests.settle_in(
                s, request_id, {"status": CredentialStatus.PROVIDED, "provided_by": by, "provided_at": now}, before=now)
            if won and row is not None and await _stored(s, secret.name, secret.scope, secret.agent) is not None:
                outcome = "exists"
                row.status, row.provided_by = CredentialStatus.CANCELLED, None
                s.add(row)
                await s.flush()
            elif won:
                outcome = "stored"
            else:  # still pending, refused only because its time had run out: it expires now
                won, row = await self.requests.settle_in(
                    s, request_id, {"status": CredentialStatus.EXPIRED, "provided_at": now})
                outcome = "expired" if won else "settled"
            if row is None:
                return "settled", None
            if outcome == "stored":  # no row of that name, scope and owner: this inserts, never replaces
                await self.save_secret(secret, seal=seal, grant=row.agent, by=by, now=now, s=s)
            return outcome, await _info(s, row)

    async def settle(self, request_id: int, status: str, now: datetime) -> tuple[bool, CredentialRequestInfo | None]:
        return await self.requests.settle(request_id, {"status": status, "provided_at": now})

    async def get(self, request_id: int) -> CredentialRequestInfo | None:
        return await self.requests.get(request_id)

    async def for_call(self, session_id: str, tool_call_id: str) -> CredentialRequestInfo | None:
        return await self.requests.for_call(session_id, tool_call_id)

    async def pending(self, *, due_before: datetime | None = None, session_id: str | None = None
                      ) -> list[CredentialRequestInfo]:
        return await self.requests.pending(due_before=due_before, session_id=session_id)

    async def recent(self, session_id: str, limit: int = 50) -> list[CredentialRequestInfo]:
        return await self.requests.recent(session_id, limit)

    async def record_announcement(self, request_id: int, where: dict[str, Any]) -> None:
        await self.requests.record_announcement(request_id, where)

    # -- one-time links -------------------------------------------------------------------------

    async def add_link(self, jti: str, request_id: int, expires_at: datetime) -> None:
        async with self.db.write() as s:
            s.add(CredentialLinkRow(jti=jti, request_id=request_id, expires_at=expires_at))

    async def link(self, jti: str) -> CredentialLinkRow | None:
        async with self.db.read() as s:
            return await s.get(CredentialLinkRow, jti)

    async def burn(self, jti: str, now: datetime) -> bool:
        async with self.db.write() as s:
            result = await s.exec(update(CredentialLinkRow)
                                  .where(col(CredentialLinkRow.jti) == jti, col(CredentialLinkRow.used_at).is_(None))
                                  .values(used_at=now))
            return bool(result.rowcount)


async def _stored(s: AsyncSession, name: str, scope: str, agent: str) -> SecretRow | None:
    return (await s.exec(select(SecretRow).where(
        SecretRow.name == name, SecretRow.scope == scope, SecretRow.agent == agent))).first()


async def _info(s: AsyncSession, row: CredentialRequestRow) -> CredentialRequestInfo:
    session = await s.get(SessionRow, row.session_id)
    assert session is not None and row.id is not None
    return CredentialRequestInfo(
        id=row.id, session=session_info(session), name=row.name, reason=row.reason, scope=row.scope,
        agent=row.agent, requester=row.requester, status=CredentialStatus(row.status), created_at=row.created_at,
        expires_at=row.expires_at,
        provided_by=row.provided_by, announcement=json.loads(row.announcement) if row.announcement else None,
        turn_id=row.turn_id,
    )
