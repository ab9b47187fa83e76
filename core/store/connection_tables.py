"""Tables of OAuth connections (SPEC §16): the sealed tokens, the turns parked for consent, and the
single-use ``state`` of each consent link. Every change here needs a migration too."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Column, Index, Text, UniqueConstraint
from sqlmodel import Field, SQLModel

from core.store.columns import timestamp


class ConnectionRow(SQLModel, table=True):
    """One account connected through OAuth. The tokens are sealed (``ciphertext``: JSON of the access and
    refresh tokens); everything else is plain, so listing needs no key."""

    __tablename__ = "connections"
    __table_args__ = (UniqueConstraint("name", "owner", name="uq_connections_name_owner"),)

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(max_length=64)  # the [[connections]] entry
    owner: str = Field(max_length=64)  # the person whose account it is; "" for a shared connection
    key_id: str = Field(max_length=64)
    ciphertext: str = Field(sa_column=Column(Text, nullable=False))
    scopes: str = Field(sa_column=Column(Text, nullable=False))  # JSON list granted; "null": not told
    expires_at: datetime | None = timestamp(nullable=True)  # of the access token; None: not told
    refreshable: bool = Field(default=False)
    meta: str | None = Field(default=None, sa_column=Column(Text, nullable=True))  # JSON: what else the provider said
    connected_by: str = Field(max_length=64)
    created_at: datetime = timestamp()
    updated_at: datetime = timestamp()
    refreshed_at: datetime | None = timestamp(nullable=True)
    refreshing_until: datetime | None = timestamp(nullable=True)  # one refresh at a time, across replicas
    last_used_at: datetime | None = timestamp(nullable=True)


class ConnectionRequestRow(SQLModel, table=True):
    """A tool call parked until someone connects (the third kind of park, beside approvals and credentials)."""

    __tablename__ = "connection_requests"
    __table_args__ = (Index("ix_connection_requests_status_expires", "status", "expires_at"),)

    id: int | None = Field(default=None, primary_key=True)
    session_id: str = Field(foreign_key="sessions.id", max_length=255)
    turn_id: int | None = Field(default=None, foreign_key="turns.id")
    tool_call_id: str = Field(max_length=128)
    connection: str = Field(max_length=64)
    principal: str = Field(max_length=64)  # who may complete it ("" for a shared one: an admin)
    gap: str = Field(max_length=24)  # absent, expired, insufficient_scope
    scopes: str = Field(sa_column=Column(Text, nullable=False))  # JSON list the call needs
    agent: str = Field(max_length=64)
    status: str = Field(max_length=16)  # pending, connected, expired, cancelled
    created_at: datetime = timestamp()
    expires_at: datetime = timestamp()
    settled_at: datetime | None = timestamp(nullable=True)
    settled_by: str | None = Field(default=None, max_length=64)
    resumed_at: datetime | None = timestamp(nullable=True)  # the parked call went on (never twice)
    announcement: str | None = Field(default=None, sa_column=Column(Text, nullable=True))


class OAuthStateRow(SQLModel, table=True):
    """One consent link's ``state``, stored as its hash: single-use, short-lived, bound to the connection,
    the person it was minted for and (when a turn waits) the parked request. The PKCE verifier is derived
    from the state with a key, never stored."""

    __tablename__ = "oauth_states"

    state_hash: str = Field(primary_key=True, max_length=64)
    connection: str = Field(max_length=64)
    principal: str = Field(max_length=64)
    request_id: int | None = Field(default=None, foreign_key="connection_requests.id")
    channel: str = Field(max_length=16)  # where it was minted (slack, web, cli)
    created_at: datetime = timestamp()
    expires_at: datetime = timestamp()
    opened_at: datetime | None = timestamp(nullable=True)  # the personal link was opened (once)
    used_at: datetime | None = timestamp(nullable=True)  # the callback came back with it (once)
