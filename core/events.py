"""Typed events core emits, and the bus channel adapters subscribe to.

Delivery is in order per (subscriber, session) and never blocks the emitter: a slow platform API
delays that session's rendering only, not the turn and not other sessions.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, ClassVar

from core.model import ApprovalInfo, ConnectionRequestInfo, CredentialRequestInfo, MessageRef, SessionInfo, TurnInfo

if TYPE_CHECKING:
    from core.store.deliveries import OutboxClaim

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Event:
    name: ClassVar[str] = "event"
    session: SessionInfo

    @property
    def session_id(self) -> str:
        return self.session.id

    @property
    def channel(self) -> str:
        return self.session.channel


@dataclass(frozen=True)
class InputQueued(Event):
    """A message waits behind the running turn."""

    name: ClassVar[str] = "input.queued"
    input_id: int
    ref: MessageRef


@dataclass(frozen=True)
class InputsTaken(Event):
    """A turn took these messages in: at its start, or steered in at a tool step."""

    name: ClassVar[str] = "inputs.taken"
    turn_id: int
    refs: tuple[MessageRef, ...]
    steered: bool
    resumed: bool = False  # continued after a restart: an earlier process may have shown signs on them


@dataclass(frozen=True)
class TurnEvent(Event):
    turn: TurnInfo


@dataclass(frozen=True)
class TurnStarted(TurnEvent):
    name: ClassVar[str] = "turn.started"


@dataclass(frozen=True)
class TurnFinished(TurnEvent):
    name: ClassVar[str] = "turn.finished"
    text: str
    outbox: OutboxClaim | None = None  # the claim its outbox row was written with (core.delivery)
    silent: bool = False  # a turn nobody asked for ended without an answer (core.listening): nothing to post


@dataclass(frozen=True)
class AnswerDelta(TurnEvent):
    """More of the answer as the model writes it, masked (core.answer_stream): for channels that show it
    live. Never stored; the answer itself comes with TurnFinished and is delivered by the outbox."""

    name: ClassVar[str] = "answer.delta"
    text: str
    restart: bool  # a new model call's first text: what was shown before is not how the answer begins


@dataclass(frozen=True)
class ToolStarted(TurnEvent):
    """A tool call of the turn runs now (approved, if it had to be): for a thread's status line."""

    name: ClassVar[str] = "tool.started"
    tool: str


class ToolOutcome(StrEnum):
    OK = "ok"  # it ran and returned
    ERROR = "error"  # it ran and failed; the model was told why
    DENIED = "denied"  # a rule or a person said no (or nobody decided in time, or a freeze)
    REFUSED = "refused"  # it never got as far as a decision: not offered, invalid arguments, a secret in them


@dataclass(frozen=True)
class ToolEnded(Event):
    """A tool call ended (a sub-agent's and a recovered one too): for the metrics of tool outcomes. ``tool`` is None
    when the model named no tool there is: its name is the model's text, never a label."""

    name: ClassVar[str] = "tool.ended"
    turn_id: int
    tool: str | None
    outcome: ToolOutcome


@dataclass(frozen=True)
class TurnFailed(TurnEvent):
    name: ClassVar[str] = "turn.failed"
    kind: str
    message: str


@dataclass(frozen=True)
class TurnCancelled(TurnEvent):
    name: ClassVar[str] = "turn.cancelled"
    by: str | None


@dataclass(frozen=True)
class Notice(Event):
    """Something the conversation must be told that is not an answer: stopped, busy, paused, settings."""

    name: ClassVar[str] = "notice"
    text: str
    ref: MessageRef | None = None  # the message it answers, if any


@dataclass(frozen=True)
class FreezeNotice(Notice):
    """A call of the turn refused by a change freeze (core.freezes): told as a notice, and where a channel shows a
    status line, ``status`` there ("is held by a change freeze until …")."""

    turn_id: int | None = None
    status: str = ""


@dataclass(frozen=True)
class ApprovalRequested(Event):
    """A gated call is parked (already in the database): show it with its buttons."""

    name: ClassVar[str] = "approval.requested"
    request: ApprovalInfo
    deciders: tuple[str, ...] = ()  # who is asked (user and group ids; admins may decide too)
    # One model step's gated calls asked together (issue 40.3): every request of it, ``request`` first; one card.
    batch: tuple[ApprovalInfo, ...] = ()


@dataclass(frozen=True)
class ApprovalReminded(Event):
    """A request still waits at its rule's ``remind_after_s``: remind its deciders (escalated ones included)."""

    name: ClassVar[str] = "approval.reminded"
    request: ApprovalInfo
    deciders: tuple[str, ...] = ()
    left: timedelta = timedelta(0)  # until it expires


@dataclass(frozen=True)
class ApprovalVoted(Event):
    """An approver's vote counted, and the request (needing several) still waits: show its progress."""

    name: ClassVar[str] = "approval.voted"
    request: ApprovalInfo


@dataclass(frozen=True)
class ApprovalResolved(Event):
    """A parked call was settled (already in the database): update its message, no buttons left."""

    name: ClassVar[str] = "approval.resolved"
    request: ApprovalInfo


@dataclass(frozen=True)
class CredentialRequested(Event):
    """The agent asked for a secret (the request is in the database): show a way to provide it."""

    name: ClassVar[str] = "credential.requested"
    request: CredentialRequestInfo


@dataclass(frozen=True)
class CredentialResolved(Event):
    """Provided, expired or cancelled: update the request's message."""

    name: ClassVar[str] = "credential.resolved"
    request: CredentialRequestInfo


@dataclass(frozen=True)
class ConnectionRequested(Event):
    """A call waits for someone to connect an account (the request is in the database): show Connect."""

    name: ClassVar[str] = "connection.requested"
    request: ConnectionRequestInfo


@dataclass(frozen=True)
class ConnectionResolved(Event):
    """Connected, expired or cancelled: update the request's message."""

    name: ClassVar[str] = "connection.resolved"
    request: ConnectionRequestInfo


@dataclass(frozen=True)
class DirectNotice(Event):
    """Tell one person privately (e.g. a schedule's creator that it keeps failing)."""

    name: ClassVar[str] = "notice.direct"
    user: str
    text: str


@dataclass(frozen=True)
class ModelCalled(Event):
    """One model call (one attempt) ended: for metrics. ``outcome`` is "ok" or the error's kind."""

    name: ClassVar[str] = "model.called"
    model: str
    outcome: str
    duration_s: float
    input_tokens: int | None = None
    output_tokens: int | None = None


@dataclass(frozen=True)
class ModelSwitched(Event):
    """A session went over to the fallback model for good (stored): for metrics. ``reason`` is short and masked."""

    name: ClassVar[str] = "model.switched"
    from_model: str
    to_model: str
    reason: str


Handler = Callable[[Event], Awaitable[None]]


class EventBus:
    def __init__(self) -> None:
        self._subscribers: list[tuple[str | None, Handler]] = []
        self._queues: dict[tuple[int, str], deque[Event]] = {}
        self._workers: set[asyncio.Task[None]] = set()

    def subscribe(self, handler: Handler, *, channel: str | None = None) -> None:
        """``channel`` limits delivery to sessions of that channel (e.g. ``"slack"``)."""
        self._subscribers.append((channel, handler))

    def emit(self, event: Event) -> None:
        for index, (channel, handler) in enumerate(self._subscribers):
            if channel is not None and channel != event.channel:
                continue
            key = (index, event.session_id)
            queue = self._queues.get(key)
            if queue is not None:
                queue.append(event)
                continue
            self._queues[key] = deque([event])
            task = asyncio.create_task(self._drain(key, handler), name=f"events:{event.session_id}")
            self._workers.add(task)
            task.add_done_callback(self._workers.discard)

    async def _drain(self, key: tuple[int, str], handler: Handler) -> None:
        queue = self._queues[key]
        try:
            while queue:
                event = queue[0]
                try:
                    await handler(event)
                except Exception:
                    log.exception("event handler failed for %s (session %s)", event.name, event.session_id)
                queue.popleft()
        finally:
            del self._queues[key]

    async def drain(self, timeout: float) -> None:
        """Wait (bounded) until every emitted event has been handled; used at shutdown and in tests."""
        if self._workers:
            await asyncio.wait(set(self._workers), timeout=timeout)
