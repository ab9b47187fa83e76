"""Tables of step-up approvals (SPEC §17 ``step_up``): approvers' passkeys, and the one-time links that enrol
one or confirm an approval with one. Every change here needs a migration too."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Column, Index, Integer, LargeBinary, Text
from sqlmodel import Field, SQLModel

from core.store.columns import timestamp


class PasskeyRow(SQLModel, table=True):
    """An approver's passkey (a WebAuthn credential): only its public key is stored."""

    __tablename__ = "passkeys"
    __table_args__ = (Index("ix_passkeys_owner", "owner"),)

    id: int | None = Field(default=None, primary_key=True)
    owner: str = Field(max_length=255)  # the person, named with their channel (``slack:U1``, ``web:web``)
    credential_id: str = Field(max_length=1024, unique=True)  # base64url, as the browser reports it
    public_key: bytes = Field(sa_column=Column(LargeBinary, nullable=False))  # COSE
    sign_count: int = Field(default=0, sa_column=Column(Integer, nullable=False, server_default="0"))
    created_at: datetime = timestamp()
    created_by: str = Field(max_length=64)  # who made the enrolment link (an operator)
    last_used_at: datetime | None = timestamp(nullable=True)
    revoked_at: datetime | None = timestamp(nullable=True)


class PasskeyLinkRow(SQLModel, table=True):
    """A one-time link: ``enrol`` registers a passkey for ``owner``; ``step_up`` confirms ``owner``'s approval of
    ``approval_id`` with one of their passkeys. Only the sha256 of the link's token is stored; the challenge the
    page was given is kept here (never trusted from the browser) and used once."""

    __tablename__ = "passkey_links"

    token_digest: str = Field(primary_key=True, max_length=64)
    kind: str = Field(max_length=16)  # enrol, step_up
    owner: str = Field(max_length=255)
    approval_id: int | None = Field(default=None, foreign_key="approvals.id")
    decider: str | None = Field(default=None, max_length=64)  # the id the approver clicked as (step_up)
    verdict: str | None = Field(default=None, max_length=16)  # what they clicked: approve, always (step_up)
    created_at: datetime = timestamp()
    expires_at: datetime = timestamp()
    challenge: str | None = Field(default=None, sa_column=Column(Text, nullable=True))  # base64url
    challenge_expires_at: datetime | None = timestamp(nullable=True)
    used_at: datetime | None = timestamp(nullable=True)
