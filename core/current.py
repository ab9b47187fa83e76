"""The session the running turn serves, carried by a context variable through the turn's task.

For code a turn calls that has no other way to know where it acts: a channel's port posting for a tool (which
workspace's token a Slack call takes). Set at each turn's start, in the turn's own context: never stale.
"""

from __future__ import annotations

from contextvars import ContextVar

from core.model import SessionInfo

session: ContextVar[SessionInfo | None] = ContextVar("current_session", default=None)
