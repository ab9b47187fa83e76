"""The values of events in: a configured source, a verified delivery on its way to the store, what the store
made of it, and the HTTP answer the intake gives."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

SourceKind = Literal["github", "standard", "bearer"]
SOURCE_KINDS: tuple[SourceKind, ...] = ("github", "standard", "bearer")
# Event statuses (SPEC §17 clarifications): queued until its turn ends answered or failed; filtered and
# duplicate rows only record that the delivery came.
QUEUED, ANSWERED, FAILED, FILTERED, DUPLICATE = "queued", "answered", "failed", "filtered", "duplicate"
EVENT_STATUSES = (QUEUED, ANSWERED, FAILED, FILTERED, DUPLICATE)


@dataclass(frozen=True)
class EventSource:
    """One ``[[event_sources]]`` table. Its secret is not here: the wiring reads ``secret_env`` at start."""

    name: str
    kind: SourceKind
    secret_env: str
    destination: str  # "#name" or a channel id
    agent: str | None = None  # None: the default agent
    prompt: str | None = None
    events: tuple[str, ...] = ("*",)
    thread: str | None = None  # a template of {dotted.path} fields; None: each event its own thread
    rate_per_minute: int = 60
    trust: str = "external"


@dataclass(frozen=True)
class EventArrival:
    """A verified delivery to store: what ``WebhookEventStore.receive`` needs, decided by the intake."""

    source: str
    kind: SourceKind
    event_type: str
    delivery_id: str | None  # X-GitHub-Delivery, webhook-id; bearer: None (never a duplicate)
    payload: str  # the body as received (UTF-8 JSON text)
    thread_key: str | None
    filtered: bool  # the source's `events` leave it out: recorded, nothing started
    rate_per_minute: int
    now: datetime
    # GitHub: the body's SHA-256. Its delivery id is not signed, its body is: a second delivery of the same body
    # under any id is a capture sent again (GitHub's redeliveries keep their id), stored as a duplicate.
    body_digest: str | None = None


@dataclass(frozen=True)
class Received:
    """What the store made of an arrival. ``limited``: over the source's rate, nothing stored."""

    outcome: Literal["queued", "filtered", "duplicate", "limited"]
    event_id: int | None = None
    retry_after_s: int | None = None


@dataclass(frozen=True)
class IntakeAnswer:
    """The HTTP answer to a delivery: status, a short text, and ``Retry-After`` seconds for a 429."""

    status: int
    text: str
    retry_after_s: int | None = None
    event_id: int | None = None
