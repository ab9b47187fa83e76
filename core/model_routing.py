"""Which model answers a session's calls (SPEC §17 "Fallback"): its agent's own model, or the primary, until the
primary fails for good in that session; from then on the fallback, for every agent in it, its sub-agents included.

- "For good": an error that is not retryable (a refused key, an unknown model, a refused request), one whose retries
  were spent (5xx, the network, a rate limit waited out), or a stream gone silent for LLM_IDLE_TIMEOUT_S. Not a
  context overflow: that is the request's size, which the runner answers by fitting the thread tighter.
- The same turn goes on with the fallback from the same transcript: only the failed model call is made again.
- The switch is stored with the step the fallback writes next (one commit): a crash after that step never asks the
  primary again; a fallback that fails too leaves the session as it was (its next message tries the primary).
- The thread is told once, when the switch is stored; the reason is short and masked, and never holds a URL's
  credentials or markup (an endpoint's error text is an outsider's).
- Only the session where the primary failed switches: another thread (a new session) tries the primary first, so a
  thread that makes the primary refuse it downgrades nobody else's.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from sqlmodel import Session

from core.errors import ProviderError
from core.events import EventBus, ModelCalled, ModelSwitched, Notice
from core.model import FALLBACK_MODEL, SessionInfo
from core.providers import CallObserver, Completion, Provider
from core.store.conversations import switch_model

log = logging.getLogger(__name__)

NOTICE = "answered with the fallback model: the primary failed with {reason}"
REASON_MAX_CHARS = 160
_URL_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@]*@")
_MARKUP = str.maketrans({"<": "(", ">": ")", "`": "'"})  # no link, mention or code span from an endpoint's text


@dataclass(frozen=True)
class Model:
    provider: Provider
    name: str  # what metrics and notices call it (LLM_MODEL, an agent's model)


def switches_on(error: ProviderError) -> bool:
    """Whether this failure (after the retries it was given) sends the session to the fallback model."""
    return error.kind != "context_overflow"


@dataclass
class SessionModels:
    """Where one top-level turn's calls go, shared with its sub-agents (they run inside it, in this process)."""

    thread: SessionInfo  # the conversation: its row is marked, its thread is told
    switched: bool  # on the fallback: stored, or about to be with the next step
    stored: bool  # the switch is in the database (read at the turn's start, or written since)
    primary_failure: str | None = None  # "<kind>: <detail>" (short, masked) of this process's switch
    failed_model: str | None = None  # the model that failed (the primary, or the agent's own)
    _told: bool = field(default=False, repr=False)


class ModelRouter:
    """The primary, each agent's own model ([[agents]] ``model`` / ``provider``), and the fallback (LLM_FALLBACK_*)."""

    def __init__(self, primary: Model, *, fallback: Model | None = None, agents: Mapping[str, Model] | None = None,
                 bus: EventBus | None = None, redact: Callable[[str], Awaitable[str]] | None = None) -> None:
        self.primary = primary
        self.fallback = fallback
        self.agents = dict(agents or {})
        self.bus = bus
        self.redact = redact

    def own(self, agent: str, parent_agent: str | None = None) -> Model:
        """The agent's own model; a sub-agent without one uses its parent agent's; otherwise the primary."""
        return (self.agents.get(agent) or (self.agents.get(parent_agent) if parent_agent else None)
                or self.primary)

    def answering(self, state: SessionModels, agent: str, parent_agent: str | None = None) -> Model:
        if state.switched and self.fallback is not None:
            return self.fallback
        return self.own(agent, parent_agent)

    def start(self, thread: SessionInfo) -> SessionModels:
        switched = thread.model == FALLBACK_MODEL and self.fallback is not None
        return SessionModels(thread=thread, switched=switched, stored=switched)

    async def switch(self, state: SessionModels, failed: Model, error: ProviderError) -> bool:
        """Go over to the fallback after ``failed`` failed for good (False: there is none, or it already answers)."""
        if self.fallback is None or state.switched or not switches_on(error):
            return False
        state.switched = True
        state.primary_failure = await self.reason(error)
        state.failed_model = failed.name
        log.warning("model %s failed for good in %s (%s); the fallback model %s answers this session from now on",
                    failed.name, state.thread.id, state.primary_failure, self.fallback.name)
        return True

    async def reason(self, error: ProviderError) -> str:
        """The error's kind and a short detail, safe to show in a thread: masked, no URL credentials, no markup."""
        detail = str(error)
        if self.redact is not None:
            detail = await self.redact(detail)
        detail = " ".join(_URL_CREDENTIALS.sub(r"\1", detail).translate(_MARKUP).split())
        if len(detail) > REASON_MAX_CHARS:
            detail = detail[:REASON_MAX_CHARS - 1] + "…"
        return f"{error.kind}: {detail}" if detail else error.kind

    @staticmethod
    def unstored(state: SessionModels) -> Callable[[Session], None] | None:
        """The write that stores the switch, for the transaction of the step that follows it (None: nothing to)."""
        if not state.switched or state.stored:
            return None
        return switch_model(state.thread.id, FALLBACK_MODEL)

    def stored(self, state: SessionModels) -> None:
        """The step that carried the switch is committed: said once in the thread, counted."""
        if not state.switched or state.stored:
            return
        state.stored = True
        if state._told or self.bus is None or self.fallback is None:
            return
        state._told = True
        reason = state.primary_failure or "an error"
        self.bus.emit(ModelSwitched(state.thread, from_model=state.failed_model or self.primary.name,
                                    to_model=self.fallback.name, reason=reason))
        self.bus.emit(Notice(state.thread, NOTICE.format(reason=reason)))

    def observer(self, session: SessionInfo, model: Model) -> CallObserver | None:
        """Each attempt of a call to ``model`` as an event (metrics), in the session that made it."""
        bus = self.bus
        if bus is None:
            return None

        def observe(outcome: Completion | ProviderError, duration_s: float) -> None:
            if isinstance(outcome, ProviderError):
                bus.emit(ModelCalled(session, model=model.name, outcome=outcome.kind, duration_s=duration_s))
            else:
                bus.emit(ModelCalled(session, model=model.name, outcome="ok", duration_s=duration_s,
                                     input_tokens=outcome.input_tokens, output_tokens=outcome.output_tokens))

        return observe
