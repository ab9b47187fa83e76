"""Plain value types shared by core and the channel adapters."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

# Session ids in these namespaces are minted by core only (e.g. scheduled firings).
RESERVED_SESSION_PREFIXES = ("schedule:",)


class SessionStatus:
    IDLE = "idle"
    RUNNING = "running"
    PENDING_APPROVAL = "pending_approval"
    WAITING_CREDENTIAL = "waiting_credential"
    FAILED = "failed"


class TurnStatus:
    QUEUED = "queued"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"

    LIVE = (QUEUED, RUNNING)


@dataclass(frozen=True)
class MessageRef:
    """Where a message lives on its platform (Slack: channel id and ts)."""

    channel: str | None = None
    ts: str | None = None


@dataclass(frozen=True)
class Inbound:
    """One message from a person, as a channel adapter hands it to core.

    ``addressed`` says the person spoke to the bot (a mention, a DM); core decides what follows.
    ``idempotency_key`` identifies the message itself (the same message delivered twice has the
    same key); ``delivery_key`` identifies one delivery of it (e.g. a Slack ``event_id``).
    """

    session_id: str
    channel: str
    sender: str
    text: str
    addressed: bool
    reply_ref: dict[str, Any] = field(default_factory=dict)
    ref: MessageRef = MessageRef()
    idempotency_key: str | None = None
    delivery_key: str | None = None
    agent: str | None = None


@dataclass(frozen=True)
class SessionInfo:
    id: str
    channel: str
    agent: str
    status: str
    reply_ref: dict[str, Any]

    @staticmethod
    def parse_reply_ref(raw: str) -> dict[str, Any]:
        value = json.loads(raw) if raw else {}
        return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class TurnInfo:
    id: int
    session: SessionInfo
    inputs: tuple[MessageRef, ...]
    sender: str | None


@dataclass(frozen=True)
class SessionSummary:
    """One line of a conversation list."""

    id: str
    status: str
    title: str
    updated_at: datetime


@dataclass(frozen=True)
class TranscriptEntry:
    """One message as a person reading the conversation sees it."""

    id: int
    role: str
    content: str
    sender: str | None
    created_at: datetime
    tool_names: tuple[str, ...] = ()
