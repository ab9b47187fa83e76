"""Passkeys and their one-time links (core.passkeys). A link is used once: taking it is a conditional update,
so two browsers (or replicas) racing one link get one use between them."""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any

from sqlalchemy import update
from sqlmodel import col, select

from core.store.approvals import audit_row
from core.store.database import Database
from core.store.passkey_tables import PasskeyLinkRow, PasskeyRow


def token_digest(token: str) -> str:
    """What is stored of a link's token: a database copy opens no link."""
    return hashlib.sha256(token.encode()).hexdigest()


class PasskeyStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def add_link(self, link: PasskeyLinkRow, *, audit: tuple[str, str, dict[str, Any]] | None = None) -> None:
        """``audit``: (actor, action, detail) written in the same commit."""
        async with self.db.write() as s:
            s.add(link)
            if audit is not None:
                actor, action, detail = audit
                s.add(audit_row(link.created_at, actor, action, f"passkey:{link.owner}", detail))

    async def link(self, token: str) -> PasskeyLinkRow | None:
        async with self.db.read() as s:
            return await s.get(PasskeyLinkRow, token_digest(token))

    async def set_challenge(self, token: str, challenge: str, until: datetime, now: datetime) -> bool:
        """A new challenge for an open link (the last one given is the only one accepted)."""
        async with self.db.write() as s:
            result = await s.exec(update(PasskeyLinkRow).where(
                col(PasskeyLinkRow.token_digest) == token_digest(token), col(PasskeyLinkRow.used_at).is_(None),
                col(PasskeyLinkRow.expires_at) > now).values(challenge=challenge, challenge_expires_at=until))
            return bool(result.rowcount)

    async def take(self, token: str, now: datetime) -> PasskeyLinkRow | None:
        """Use the link once: the row as it was (with its challenge) when this call used it; None when it was
        used, expired, had no live challenge, or never existed."""
        digest = token_digest(token)
        async with self.db.write() as s:
            row = await s.get(PasskeyLinkRow, digest)
            if row is None:
                return None
            challenge = row.challenge
            result = await s.exec(update(PasskeyLinkRow).where(
                col(PasskeyLinkRow.token_digest) == digest, col(PasskeyLinkRow.used_at).is_(None),
                col(PasskeyLinkRow.expires_at) > now, col(PasskeyLinkRow.challenge) == challenge,
                col(PasskeyLinkRow.challenge_expires_at) > now).values(used_at=now, challenge=None))
            if not result.rowcount:
                return None
            taken = PasskeyLinkRow.model_validate(row.model_dump())
            taken.challenge, taken.used_at = challenge, now
            return taken

    async def passkeys_of(self, owner: str) -> list[PasskeyRow]:
        async with self.db.read() as s:
            return list((await s.exec(select(PasskeyRow).where(
                col(PasskeyRow.owner) == owner, col(PasskeyRow.revoked_at).is_(None)).order_by(
                col(PasskeyRow.id)))).all())

    async def credential_known(self, credential_id: str) -> bool:
        async with self.db.read() as s:
            return (await s.exec(select(PasskeyRow.id).where(col(PasskeyRow.credential_id) == credential_id))
                    ).first() is not None

    async def all(self) -> list[PasskeyRow]:
        async with self.db.read() as s:
            return list((await s.exec(select(PasskeyRow).where(col(PasskeyRow.revoked_at).is_(None)).order_by(
                col(PasskeyRow.owner), col(PasskeyRow.id)))).all())

    async def add_passkey(self, passkey: PasskeyRow) -> int:
        async with self.db.write() as s:
            s.add(passkey)
            await s.flush()
            assert passkey.id is not None
            s.add(audit_row(passkey.created_at, passkey.owner, "passkey.enrolled", f"passkey:{passkey.id}",
                            {"owner": passkey.owner, "enrolment_link_by": passkey.created_by}))
            return passkey.id

    async def used(self, passkey_id: int, seen_count: int, new_count: int, now: datetime,
                   audit: tuple[str, str, str, dict[str, Any]]) -> bool:
        """Record an assertion's sign count, only if nobody else's assertion with this passkey moved it since
        ``seen_count`` was read (a cloned authenticator racing the real one); its audit line (actor, action,
        subject, detail) in the same commit."""
        async with self.db.write() as s:
            result = await s.exec(update(PasskeyRow).where(
                col(PasskeyRow.id) == passkey_id, col(PasskeyRow.sign_count) == seen_count,
                col(PasskeyRow.revoked_at).is_(None)).values(sign_count=new_count, last_used_at=now))
            if not result.rowcount:
                return False
            actor, action, subject, detail = audit
            s.add(audit_row(now, actor, action, subject, detail))
            return True

    async def revoke(self, passkey_id: int, by: str, now: datetime) -> PasskeyRow | None:
        async with self.db.write() as s:
            result = await s.exec(update(PasskeyRow).where(
                col(PasskeyRow.id) == passkey_id, col(PasskeyRow.revoked_at).is_(None)).values(revoked_at=now))
            if not result.rowcount:
                return None
            row = await s.get(PasskeyRow, passkey_id)
            assert row is not None
            s.add(audit_row(now, by, "passkey.revoked", f"passkey:{passkey_id}", {"owner": row.owner}))
            return row
