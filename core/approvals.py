"""The approval broker (SPEC §7): park a gated call, announce it, settle it exactly once.

Order of effects: the request is committed before it is announced; a decision is committed before
the tool runs, and before the resolution is announced. Settling is a conditional update of a
pending row, so a double click, two approvers, a click racing the timeout, a stop or an operator
all produce one outcome; every later attempt is told what already happened.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

from core.agents import AgentDirectory
from core.clock import Clock
from core.errors import NotAllowed, NotFound
from core.events import ApprovalRequested, ApprovalResolved, EventBus
from core.model import ApprovalInfo, ApprovalStatus
from core.parking import Waiters
from core.store import ApprovalStore
from core.store.tables import ApprovalRow, GrantRow
from core.tools import DESTINATION_TOOL, GateDecision, Tool, ToolContext, canonical_call
from core.views import GrantView

log = logging.getLogger(__name__)

REQUESTER = "requester"
# Why a call is refused when no approver can be shown its arguments in full.
TOO_LONG_TO_SHOW = "its arguments are too long to show an approver, and attaching them in full failed"


class GroupResolver(Protocol):
    async def members(self, group_id: str) -> set[str]:
        """User ids in a user group (e.g. a Slack user group ``S…``)."""
        ...


class ApprovalPolicy:
    """Who may decide: admins always; approvers by user id, by user group, or as the requester."""

    def __init__(self, approvers: tuple[str, ...], admins: tuple[str, ...], groups: GroupResolver | None = None):
        self.approvers = approvers
        self.admins = admins
        self.groups = groups

    async def may_decide(self, user: str, requester: str | None, agent_approvers: tuple[str, ...] = ()) -> bool:
        """Whether ``user`` may decide for something ``requester`` asked for (approvals and credentials)."""
        if not user:
            return False
        if user in self.admins:
            return True
        approvers = agent_approvers or self.approvers
        if user in approvers or (REQUESTER in approvers and user == requester):
            return True
        for group in (a for a in approvers if a.startswith("S")):
            if self.groups is not None and user in await self.groups.members(group):
                return True
        return False

    def deciders(self, requester: str | None, agent_approvers: tuple[str, ...] = ()) -> tuple[str, ...]:
        """Who is asked to decide (user and group ids, ``requester`` resolved; admins may too but are not
        named): what a channel shows as "waiting for approval from …"."""
        named = (requester if a == REQUESTER else a for a in (agent_approvers or self.approvers))
        return tuple(dict.fromkeys(a for a in named if a))

    def is_admin(self, user: str) -> bool:
        return user in self.admins


@dataclass(frozen=True)
class DecideResult:
    """What a click (or an operator) achieved: ``won`` when it settled the request."""

    won: bool
    request: ApprovalInfo | None
    refused: str | None = None  # the clicker may not decide: why
    late: bool = False  # it was still pending, but past its expiry: settled as expired instead

    @property
    def expired(self) -> bool:
        """The decision came after the request ran out of time (now, or earlier): nothing was decided."""
        return not self.won and self.request is not None and self.request.status == ApprovalStatus.EXPIRED

    @property
    def message(self) -> str:
        if self.refused is not None:
            return self.refused
        if self.request is None:
            return "That approval request does not exist."
        if self.won:
            return self.request.summary() + "."
        if self.late:
            return (f"Too late: request {self.request.id} expired at {self.request.expires_at:%Y-%m-%d %H:%M:%S} UTC; "
                    "nothing was approved or denied, and it did not run.")
        return f"Already settled: {self.request.summary()}."


class ApprovalBroker:
    def __init__(
        self, store: ApprovalStore, bus: EventBus, clock: Clock, policy: ApprovalPolicy, agents: AgentDirectory,
        *, timeout_s: float, poll_s: float = 2.0,
    ) -> None:
        self.store = store
        self.bus = bus
        self.clock = clock
        self.policy = policy
        self.agents = agents
        self.timeout = timedelta(seconds=timeout_s)
        self._waiters = Waiters(clock, poll_s)

    # -- the runner's side (core.tools.ToolGate) ------------------------------------------------

    async def authorize(self, ctx: ToolContext, tool: Tool, args: dict[str, Any]) -> GateDecision:
        subject = _subject(tool, args)
        if subject is not None and (tool.name, subject) in ctx.preapproved:  # e.g. a firing's own destination
            return GateDecision(True)
        if await self.granted(agent=ctx.agent, tool=tool.name, place=ctx.place, args=args):
            return GateDecision(True)
        if not ctx.interactive:
            return GateDecision(False, f"error: `{tool.name}` needs a person's approval and nobody can be asked "
                                       "here, so it did not run; continue without it")
        request = await self.request(session_id=ctx.session_id, turn_id=ctx.turn_id, call_id=ctx.call_id,
                                     tool=tool.name, args=args, agent=ctx.agent, place=ctx.place,
                                     requester=ctx.sender, risk=tool.risk.value)
        return _decision(await self._wait(request, ctx.turn_id))

    async def request(self, *, session_id: str, turn_id: int | None, call_id: str, tool: str, args: dict[str, Any],
                      agent: str, place: str | None, requester: str | None, risk: str = "gated") -> ApprovalInfo:
        """Park a request (committed) and announce it; settle it later. Used by gated calls and by
        anything else a person must approve (a schedule's destination)."""
        now = self.clock.now()
        request = await self.store.park(ApprovalRow(
            session_id=session_id, turn_id=turn_id, tool_call_id=call_id, tool=tool, arguments=json.dumps(args),
            agent=agent, place=place, requester=requester, risk=risk, status=ApprovalStatus.PENDING,
            parked_at=now, expires_at=now + self.timeout,
        ))
        log.info("approval %s requested for %s (session %s)", request.id, tool, session_id)
        deciders = self.policy.deciders(requester, self.agents.get(agent).approvers)
        self.bus.emit(ApprovalRequested(request.session, request, deciders))
        return request

    async def granted(self, *, agent: str, tool: str, place: str | None, args: dict[str, Any]) -> bool:
        """Whether an "Always allow" covers exactly this call here (same agent, tool, place, arguments)."""
        call = grant_call(tool, args)
        return call is not None and await self.store.grant_for(agent, tool, place, call) is not None

    async def wait(self, request: ApprovalInfo) -> ApprovalInfo:
        """Until it is settled (by anyone, in any process); returns it settled. Not a turn's wait:
        being cancelled leaves it pending (e.g. a schedule's destination, across a restart)."""
        return await self._wait(request, None)

    async def for_call(self, session_id: str, call_id: str) -> ApprovalInfo | None:
        """The request already made for this call, if any (a restart must not ask twice)."""
        return await self.store.for_call(session_id, call_id)

    async def recover(self, ctx: ToolContext, tool: Tool, args: dict[str, Any]) -> GateDecision | None:
        request = await self.store.for_call(ctx.session_id, ctx.call_id)
        if request is None or not _same_call(request, ctx, tool, args):
            return None  # another turn's request (one failed after restarts), or a reused call id: never acted on
        if request.status == ApprovalStatus.PENDING:
            request = await self._wait(request, ctx.turn_id)  # its buttons still work after a restart
        return _decision(request)

    async def started(self, decision: GateDecision) -> None:
        if decision.request_id is not None:
            await self.store.mark_started(decision.request_id, self.clock.now())

    async def _wait(self, request: ApprovalInfo, turn_id: int | None) -> ApprovalInfo:
        """Until someone decides, the timeout (counted from parked_at), or the turn ``turn_id`` is stopped."""

        async def expire(request_id: int) -> ApprovalInfo:
            return (await self._settle(request_id, ApprovalStatus.EXPIRED, by=None, reason=None))[1]

        async def cancel(request_id: int) -> object:
            return await self._settle(request_id, ApprovalStatus.CANCELLED, by=None, reason="the turn was stopped")

        return await self._waiters.wait(
            request, turn_id=turn_id, load=self.store.get, expire=expire, cancel=cancel,
            settled_elsewhere=lambda current: self.bus.emit(ApprovalResolved(current.session, current)),
        )

    # -- deciders' side -------------------------------------------------------------------------

    async def decide(self, request_id: int, verdict: str, by: str, reason: str | None = None, *,
                     operator: bool = False) -> DecideResult:
        """A person's click (or an operator's override). ``verdict``: approve, deny or always."""
        request = await self.store.get(request_id)
        if request is None:
            return DecideResult(False, None)
        if not operator and not await self.may_decide(by, request):
            log.info("approval %s: %s may not decide", request_id, by)
            return DecideResult(False, request, refused="You can't approve this: you are not one of its approvers.")
        status = ApprovalStatus.DENIED if verdict == "deny" else ApprovalStatus.APPROVED
        call = grant_call(request.tool, request.arguments) if verdict == "always" else None
        won, settled = await self._settle(request_id, status, by=by,
                                          reason=(reason or None) if verdict == "deny" else None, grant=call)
        if not won and not settled.settled:  # the settle refused it only because it has run out of time
            won_expiry, settled = await self._settle(request_id, ApprovalStatus.EXPIRED, by=None, reason=None)
            log.info("approval %s: %s decided after its expiry; settled as expired", request_id, by)
            return DecideResult(False, settled, late=won_expiry)
        return DecideResult(won, settled)

    async def refuse(self, request_id: int, reason: str) -> bool:
        """A channel could not show the request as it must be shown (e.g. its arguments in full):
        nobody can decide on what they cannot see, so the call is cancelled and the model told why."""
        won, _request = await self._settle(request_id, ApprovalStatus.CANCELLED, by=None, reason=reason)
        return won

    async def get(self, request_id: int) -> ApprovalInfo | None:
        return await self.store.get(request_id)

    async def record_announcement(self, request_id: int, where: dict[str, Any]) -> None:
        """Where a channel showed the request, so its message can be updated when settled."""
        await self.store.record_announcement(request_id, where)

    async def pending(self, *, place: str | None = None, viewer: str | None = None) -> list[ApprovalInfo]:
        """Pending requests. A ``viewer`` (a person asking in a channel) sees those asked at ``place``
        only, unless an admin; without a viewer (an operator, core itself) every one."""
        if viewer is not None and not self.policy.is_admin(viewer):
            return await self.store.pending(place=place) if place else []
        return await self.store.pending()

    async def recent(self, session_id: str) -> list[ApprovalInfo]:
        return await self.store.recent(session_id)

    async def grants(self, *, place: str | None = None, viewer: str | None = None) -> list[GrantView]:
        """Active grants; who sees which as for ``pending``."""
        if viewer is not None and not self.policy.is_admin(viewer):
            rows = await self.store.grants(place=place) if place else []
        else:
            rows = await self.store.grants()
        return [grant_view(g) for g in rows]

    async def revoke_grant(self, grant_id: int, by: str, *, operator: bool = False) -> str:
        """Admins and operators only; raises NotAllowed before anything is looked up (a refusal says
        nothing about which grants exist), NotFound if there is no such active grant."""
        if not operator and not self.policy.is_admin(by):
            raise NotAllowed("Only admins (BOT_ADMINS) can revoke grants.")
        if not await self.store.revoke(grant_id, by, self.clock.now()):
            raise NotFound(f"There is no active grant {grant_id}.")
        return f"Grant {grant_id} revoked: that call needs approval again."

    async def may_decide(self, user: str, request: ApprovalInfo) -> bool:
        agent = self.agents.get(request.agent)
        return await self.policy.may_decide(user, request.requester, agent.approvers)

    async def _settle(self, request_id: int, status: str, *, by: str | None, reason: str | None,
                      grant: str | None = None) -> tuple[bool, ApprovalInfo]:
        """Settle if still pending (a decision: and not expired); returns whether this call did, and
        the request as it stands. ``grant``: the exact call an "Always allow" records."""
        won, request = await self.store.settle(request_id, status, by=by, reason=reason, grant_call=grant,
                                               now=self.clock.now())
        assert request is not None
        if won:
            log.info("approval %s settled: %s", request_id, request.summary())
            self._waiters.wake(request_id)
            self.bus.emit(ApprovalResolved(request.session, request))
        return won, request

    # -- recovery and housekeeping --------------------------------------------------------------

    async def expire_overdue(self) -> int:
        """Settle as expired every request whose time ran out (e.g. while the process was down)."""
        overdue = await self.store.pending(due_before=self.clock.now())
        for request in overdue:
            await self._settle(request.id, ApprovalStatus.EXPIRED, by=None, reason=None)
        return len(overdue)


def _same_call(request: ApprovalInfo, ctx: ToolContext, tool: Tool, args: dict[str, Any]) -> bool:
    """Whether a stored request is this very call of this turn (what was approved is what would run)."""
    return (request.turn_id == ctx.turn_id and request.tool == tool.name
            and canonical_call(request.arguments) == canonical_call(args))


def grant_call(tool: str, args: dict[str, Any]) -> str | None:
    """What an "Always allow" of this call is keyed by: every argument, exactly (compact sorted
    JSON), so another command, timeout or credential list is another call. A destination approval
    is keyed by the destination's id and the schedule's creator, not by the schedule or its prompt.
    None: it cannot be granted."""
    if tool == DESTINATION_TOOL:
        destination, creator = args.get("destination_id"), args.get("creator")
        if not (isinstance(destination, str) and destination and isinstance(creator, str) and creator):
            return None
        return canonical_call({"creator": creator, "destination": destination})
    return canonical_call(args)


def grant_view(grant: GrantRow) -> GrantView:
    assert grant.id is not None
    return GrantView(id=grant.id, agent=grant.agent, tool=grant.tool, place=grant.place, created_by=grant.created_by,
                     created_at=grant.created_at, call_text=grant.call_text)


def _subject(tool: Tool, args: dict[str, Any]) -> str | None:
    value = args.get(tool.pattern_arg) if tool.pattern_arg else None
    return str(value) if value is not None else None


def _decision(request: ApprovalInfo) -> GateDecision:
    if request.status == ApprovalStatus.APPROVED:
        return GateDecision(True, request_id=request.id, already_started=request.started)
    if request.status == ApprovalStatus.DENIED:
        reason = request.reason or "no reason given"
        return GateDecision(False, f"error: the user denied `{request.tool}`: {reason}; do not retry it; "
                                   "continue without it", request.id)
    if request.status == ApprovalStatus.EXPIRED:
        return GateDecision(False, f"error: nobody approved `{request.tool}` in time, so it did not run; "
                                   "do not retry it; continue without it", request.id)
    why = f": {request.reason}" if request.reason else ""
    return GateDecision(False, f"error: the request to run `{request.tool}` was cancelled{why}; it did not run",
                        request.id)
