"""What core hands across the boundary instead of table rows: frozen views that describe themselves.

A view carries what its listings show and nothing else (no internal ids, no raw pattern of a
revoked grant): a channel can render any field of it without leaking more than core meant to.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from core.model import ScheduleStatus
from core.tools import CANONICAL_KEYS, DESTINATION_TOOL, canonical_call, canonical_text
from core.triggers import TriggerSpec


@dataclass(frozen=True)
class ScheduleView:
    """A schedule as its creator, admins and operators see it listed."""

    id: int
    prompt: str
    trigger: TriggerSpec
    destination: str  # as the person wrote it ("#ops")
    creator: str
    status: ScheduleStatus
    firings: int = 0
    failures: int = 0  # consecutive failed deliveries
    last_outcome: str | None = None

    def describe(self) -> str:
        """When it fires, as a person reads it (e.g. "every 60 s")."""
        return self.trigger.describe()


@dataclass(frozen=True)
class GrantView:
    """An "Always allow" (this agent may run exactly this call at this place again) or an "Allow in this thread"
    (...in that one conversation there), for good or until ``expires_at``."""

    id: int
    agent: str
    tool: str
    place: str | None
    created_by: str
    created_at: datetime
    call_text: str | None  # the exact canonical call it covers (what ``describe`` renders)
    thread: str | None = None  # the conversation it holds in; None: the whole place
    expires_at: datetime | None = None  # None: never
    revoked_by: str | None = None
    revoked_at: datetime | None = None
    rule: str | None = None  # the [[policies]] rule it was made under; None: a call no rule decides

    @property
    def scope(self) -> str:
        """"place" (Always allow) or "thread" (Allow in this thread): core.grants.GrantScope."""
        return "thread" if self.thread is not None else "place"

    def expiry(self, now: datetime) -> str:
        """When it stops covering the call: "never", "2026-12-05 13:00 UTC", or "expired 2026-12-05 13:00 UTC"."""
        if self.expires_at is None:
            return "never"
        when = f"{self.expires_at:%Y-%m-%d %H:%M} UTC"
        return f"expired {when}" if self.expires_at <= now else when

    def describe(self) -> str:
        """The exact call a grant covers, as a person reads it (e.g. the command, then any other argument)."""
        try:
            args = json.loads(self.call_text or "")
        except json.JSONDecodeError:
            args = None
        if not isinstance(args, dict):
            return self.call_text or "(nothing: a grant from before exact calls, revoked)"
        if self.tool == DESTINATION_TOOL:
            return f"schedules by {args.get('creator')} posting to {args.get('destination')}"
        text = canonical_text(self.tool, args)
        rest = {k: v for k, v in args.items() if k not in CANONICAL_KEYS.get(self.tool, tuple(args))}
        return f"{text} (with {canonical_call(rest)})" if rest else text


@dataclass(frozen=True)
class CredentialView:
    """A stored credential as an operator sees it listed: never its value, sealed or not."""

    name: str
    scope: str  # "agent" (one agent's) or "shared" (agents granted it)
    agent: str  # the owner for scope "agent"; "" for shared
    granted_to: tuple[str, ...]  # the agents a shared one is granted to
    hosts: tuple[str, ...] | None  # where it may be sent; None: anywhere
    key_id: str
    created_by: str
    updated_at: datetime
    last_used_at: datetime | None

    def describe(self) -> str:
        """Whose it is, e.g. "agent (default)" or "shared (granted to ops, deploy)"."""
        owner = self.agent if self.scope == "agent" else "granted to " + (", ".join(self.granted_to) or "nobody")
        return f"{self.scope} ({owner})"


@dataclass(frozen=True)
class ConnectionView:
    """A connected account as listed: never a token."""

    name: str
    owner: str  # whose account; "" for a shared connection
    scopes: tuple[str, ...] | None  # granted; None: the provider did not say
    expires_at: datetime | None  # of the access token (refreshed before use when it can be)
    refreshable: bool
    connected_by: str
    updated_at: datetime
    last_used_at: datetime | None

    def describe(self) -> str:
        whose = "shared" if not self.owner else f"of {self.owner}"
        scopes = " ".join(self.scopes) if self.scopes else "scopes not told"
        if self.expires_at is None:
            expiry = "no expiry told"
        else:
            expiry = f"token until {self.expires_at:%Y-%m-%d %H:%M} UTC"
            if self.refreshable:
                expiry += ", refreshed as needed"
        used = f", last used {self.last_used_at:%Y-%m-%d %H:%M} UTC" if self.last_used_at else ""
        return f"{self.name} ({whose}): {scopes}; {expiry}{used}"


@dataclass(frozen=True)
class AuditEntry:
    """One audit line: who did what to which subject, when; ``detail`` is its JSON (never a secret)."""

    at: datetime
    actor: str
    action: str
    subject: str
    detail: str | None
