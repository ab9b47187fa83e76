"""A request a person answers: one lifecycle for approvals, credential requests, connection requests and a
thread budget's Continue card (which is an approval filed as ``BUDGET_RISK``).

Every kind goes the same way. It is parked durably (committed before anything is shown), announced on the
event bus (each channel renders it and records where it showed it), decided exactly once (a conditional
update of a pending row in its store, which audits it in the same commit; an approval's votes count toward
its quorum there), expired honestly (by its own expiry: nobody's decision), and the turn that waits on it
resumes (core.parking). This class is that shared part; each kind keeps only what differs: who may answer,
what the answer carries (a verdict, a sealed value, an account's tokens) and what happens next.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, Generic, Literal, Protocol, TypeVar

from core.clock import Clock
from core.events import Event, EventBus
from core.model import SessionInfo
from core.parking import Waiters
from core.store.requests import RequestRows
from core.tools import ToolContext
from core.trust import SenderTrust, restricted

log = logging.getLogger(__name__)

# Every kind's statuses for the two endings nobody chose (ApprovalStatus.EXPIRED, CredentialStatus.EXPIRED, ...).
EXPIRED = "expired"
CANCELLED = "cancelled"
STOPPED = "the turn was stopped"  # why a request is cancelled when the person stops the turn waiting on it


class PersonRequest(Protocol):
    """What every kind's request view has (ApprovalInfo, CredentialRequestInfo, ConnectionRequestInfo)."""

    @property
    def id(self) -> int: ...
    @property
    def session(self) -> SessionInfo: ...
    @property
    def turn_id(self) -> int | None: ...
    @property
    def status(self) -> str: ...
    @property
    def expires_at(self) -> datetime: ...
    @property
    def settled(self) -> bool: ...
    @property
    def announcement(self) -> dict[str, Any] | None: ...
    def summary(self) -> str: ...


V = TypeVar("V", bound=PersonRequest)

# Why nobody may be asked on a turn's behalf: a sub-agent's turn (its parent asks), a guest's, an outsider's or a
# bot's words (refused and audited), or nobody there to answer (e.g. a schedule's firing).
Unaskable = Literal["subagent", "restricted", "not interactive"]


async def why_nobody_is_asked(ctx: ToolContext, trust: SenderTrust | None, action: str,
                              subject: str) -> Unaskable | None:
    """Whether a person may be asked for ``subject`` (what ``action`` would ask) on this call's behalf: None, or
    why not, checked in this order for every kind."""
    if ctx.subagent:
        return "subagent"
    if await restricted(trust, ctx.trust, ctx.sender or "agent", action, subject, session=ctx.session_id):
        return "restricted"
    if not ctx.interactive:
        return "not interactive"
    return None


# How nobody settles one (status: EXPIRED or CANCELLED; a reason, for kinds that keep one): whether this call
# did, and the request as it now stands.
Ending = Callable[[int, str, str | None], Awaitable[tuple[bool, V | None]]]


class PersonRequests(Generic[V]):
    """One kind's requests: ``kind`` names it in logs, ``rows`` is its table, ``end`` settles one as expired or
    cancelled, ``resolved`` is the event that tells the channels it is settled."""

    def __init__(self, kind: str, rows: RequestRows[Any, V], bus: EventBus, clock: Clock, *, poll_s: float,
                 end: Ending[V], resolved: Callable[[V], Event]) -> None:
        self.kind = kind
        self.rows = rows
        self.bus = bus
        self.clock = clock
        self.resolved = resolved
        self._end = end
        self._waiters = Waiters(clock, poll_s)

    def announce(self, event: Event) -> None:
        """A request was parked (committed): the channels show it."""
        self.bus.emit(event)

    async def wait(self, request: V, turn_id: int | None) -> V:
        """Until someone settles it (in any process), it expires (``expires_at``), or the turn ``turn_id`` is
        stopped (then it is cancelled; a shutdown leaves it pending, core.parking)."""

        async def expire(request_id: int) -> V:
            return (await self.end(request_id, EXPIRED))[1]

        async def cancel(request_id: int) -> object:
            return await self.end(request_id, CANCELLED, STOPPED)

        return await self._waiters.wait(request, turn_id=turn_id, load=self.rows.get, expire=expire, cancel=cancel,
                                        settled_elsewhere=lambda current: self.bus.emit(self.resolved(current)))

    def expect(self, request_id: int, expected: bool = True) -> None:
        """A turn of this process will wait on it later (a batch's later calls): see ``Waiters.expect``."""
        self._waiters.expect(request_id, expected)

    async def end(self, request_id: int, status: str, reason: str | None = None) -> tuple[bool, V]:
        """Settle it as nobody's decision (``EXPIRED``, ``CANCELLED``) if still pending."""
        won, request = await self._end(request_id, status, reason)
        assert request is not None
        if won:
            self.settled_here(request)
        return won, request

    def settled_here(self, request: V) -> None:
        """This process settled it: its waiter returns now, and the channels update its message."""
        log.info("%s %s settled: %s", self.kind, request.id, request.summary())
        self._waiters.wake(request.id)
        self.bus.emit(self.resolved(request))

    async def expire_overdue(self) -> int:
        """Settle as expired every request whose time ran out (e.g. while no process was up)."""
        overdue = await self.rows.pending(due_before=self.clock.now())
        for request in overdue:
            await self.end(request.id, EXPIRED)
        return len(overdue)

    async def announce_cancelled(self, session_id: str, turn_id: int) -> None:
        """A turn failed after restarts cancelled what it waited on (in the same commit): say so on each card."""
        for request in await self.rows.recent(session_id):
            if request.turn_id == turn_id and request.status == CANCELLED:
                self.bus.emit(self.resolved(request))

    async def get(self, request_id: int) -> V | None:
        return await self.rows.get(request_id)

    async def record_announcement(self, request_id: int, where: dict[str, Any]) -> None:
        """Where a channel showed it, so its message can be updated once it is settled."""
        await self.rows.record_announcement(request_id, where)

    async def recent(self, session_id: str) -> list[V]:
        return await self.rows.recent(session_id)
