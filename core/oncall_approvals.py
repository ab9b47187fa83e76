"""A request whose approvers name an on-call rota (core.oncall): who is asked, and what happens when the rota
cannot be read. It falls back to the rule's ``escalate_to`` (they join at once), or to the other approvers
named; with nobody left it is refused. An empty list of approvers never reaches the store, where it would
mean "the agent's approvers": a rota that fails never widens who may decide."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from core.clock import Clock
from core.events import EventBus, Notice
from core.model import ApprovalInfo
from core.oncall import OnCall, OnCallRota, names_oncall, on_call
from core.store import ApprovalStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RotaOutcome:
    """Who a request asks once its rotas are read; ``problem``: what the thread is told (a rota failed),
    ``refused``: nobody is left to ask."""

    approvers: tuple[str, ...]
    escalate_to: tuple[str, ...]
    unavailable: OnCall
    problem: str | None = None
    refused: bool = False


class OnCallApprovers:
    def __init__(self, rota: OnCallRota | None, store: ApprovalStore, bus: EventBus, clock: Clock,
                 cancel: Callable[[int, str], Awaitable[ApprovalInfo]]) -> None:
        self.rota = rota
        self.store = store
        self.bus = bus
        self.clock = clock
        self._cancel = cancel  # the broker's: ends a parked request as nobody's decision, with the reason

    async def resolve(self, approvers: tuple[str, ...], escalate_to: tuple[str, ...]) -> RotaOutcome | None:
        """The request's approvers and escalation with each rota's people in place of its entry; None when
        neither names a rota (nothing changes)."""
        if not names_oncall(approvers) and not names_oncall(escalate_to):
            return None
        asked = await on_call(approvers, self.rota)
        joined = await on_call(escalate_to, self.rota)
        if joined.unavailable:  # those it escalates to are asked without that rota, later
            log.warning("escalate_to: %s", joined.said())
        if not asked.unavailable:
            return RotaOutcome(asked.entries, joined.entries, joined)
        # Everyone the rule would escalate to joins now; the other approvers named stay. Nobody else, ever.
        fallback = tuple(dict.fromkeys(asked.entries + joined.entries))
        failed = OnCall((), asked.unavailable + joined.unavailable)
        if not fallback:
            why = (f"nobody on call could be asked ({failed.said()}) and no one else is named to approve it"
                   + (" (escalate_to too)" if escalate_to else ""))
            # Written as configured, for the moment it is pending: an unread rota names nobody (core.people), where
            # an empty list would mean the agent's approvers. It is cancelled before any card is shown.
            return RotaOutcome(approvers, (), failed, why, refused=True)
        instead = "the rule's escalate_to" if joined.entries else "only the other approvers named"
        return RotaOutcome(fallback, (), failed, f"The on-call rota could not be read ({failed.said()}): "
                                                 f"asking {instead} instead.")

    async def told(self, request: ApprovalInfo, outcome: RotaOutcome) -> ApprovalInfo:
        """A rota failed for this (parked) request: audited; refused (cancelled before anyone is asked: its card
        says why, and the model is told) or the thread is told whom it asks instead."""
        assert outcome.problem is not None
        log.warning("approval %s: %s", request.id, outcome.problem)
        await self.store.audit(self.clock.now(), "bot", "approval.oncall_unavailable", f"approval:{request.id}",
                               {"schedules": dict(outcome.unavailable.unavailable), "refused": outcome.refused,
                                "asked": [] if outcome.refused else list(outcome.approvers),
                                "session": request.session.id})
        if outcome.refused:
            return await self._cancel(request.id, outcome.problem)
        self.bus.emit(Notice(request.session, outcome.problem))
        return request
