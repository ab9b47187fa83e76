"""The approval broker (SPEC §7): park a gated call, announce it, settle it exactly once.

Order of effects: the request is committed before it is announced; a decision is committed before
the tool runs, and before the resolution is announced. Settling is a conditional update of a
pending row, so a double click, two approvers, a click racing the timeout, a stop or an operator
all produce one outcome; every later attempt is told what already happened.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from core.agents import AgentDirectory
from core.approval_policy import ApprovalPolicy, DecideResult
from core.clock import Clock
from core.errors import NotAllowed, NotFound
from core.events import ApprovalReminded, ApprovalRequested, ApprovalResolved, ApprovalVoted, EventBus
from core.model import ApprovalInfo, ApprovalStatus
from core.parking import HOLD
from core.people import Person
from core.policies import Policy, PolicyAction, PolicyBook, Ruling
from core.requests import STOPPED, PersonRequests
from core.store import ApprovalStore
from core.store.tables import ApprovalRow, GrantRow
from core.tools import DESTINATION_TOOL, SUBAGENT_CANNOT_ASK, GateDecision, Risk, Tool, ToolContext, canonical_call
from core.tracing import APPROVAL, NO_TRACING, Tracer
from core.trust import NOT_ALLOWED, is_restricted
from core.views import AuditEntry, GrantView

log = logging.getLogger(__name__)

# Why a call is refused when no approver can be shown its arguments in full.
TOO_LONG_TO_SHOW = "its arguments are too long to show an approver, and attaching them in full failed"


class ApprovalBroker:
    def __init__(
        self, store: ApprovalStore, bus: EventBus, clock: Clock, policy: ApprovalPolicy, agents: AgentDirectory,
        *, timeout_s: float, poll_s: float = 2.0, policies: PolicyBook | None = None, tracer: Tracer = NO_TRACING,
    ) -> None:
        self.store = store
        self.bus = bus
        self.clock = clock
        self.policy = policy
        self.agents = agents
        self.timeout = timedelta(seconds=timeout_s)
        self.policies = policies or PolicyBook()  # [[policies]]: the first matching rule decides a call
        self.tracer = tracer  # a wait on a person is a span of its call's trace (core.tracing)
        self.requests = PersonRequests("approval", store.requests, bus, clock, poll_s=poll_s, end=self._end,
                                       resolved=lambda request: ApprovalResolved(request.session, request))
        # One model step's requests parked together (ask_together), until its runner reaches each call.
        self._asked: dict[tuple[str, str], ApprovalInfo] = {}

    # -- the runner's side (core.tools.ToolGate) ------------------------------------------------

    async def authorize(self, ctx: ToolContext, tool: Tool, args: dict[str, Any]) -> GateDecision:
        batched = self._asked.pop((ctx.session_id, ctx.call_id), None)
        if batched is not None and not _same_call(batched, ctx, tool, args):
            self.requests.expect(batched.id, False)
            batched = None  # never another call's request (a reused call id)
        decision = await self._authorize(ctx, tool, args, batched)
        if batched is not None and decision.request_id != batched.id:  # no longer asked (e.g. granted meanwhile)
            self.requests.expect(batched.id, False)
            await self.requests.end(batched.id, ApprovalStatus.CANCELLED, "no longer needed a decision")
        return decision

    async def _authorize(self, ctx: ToolContext, tool: Tool, args: dict[str, Any],
                         batched: ApprovalInfo | None) -> GateDecision:
        ruling = self.policies.rule(tool.name, args, risk=tool.risk, trust=ctx.trust)
        if _untrusted(ctx, tool, ruling):
            return await self._refuse_untrusted(ctx, tool)
        refused = await self._ruled(ruling, ctx, tool)
        if refused is not None:
            return refused
        if ruling.action is PolicyAction.ALLOW:
            return GateDecision(True)
        # A firing's preapproved destination and an "Always allow" cover calls no rule decides: a rule's own
        # approvers and quorum are never skipped.
        if ruling.policy is None:
            subject = _subject(tool, args)
            if subject is not None and (tool.name, subject) in ctx.preapproved:  # e.g. a firing's own destination
                return GateDecision(True)
            if await self.granted(agent=ctx.agent, tool=tool.name, place=ctx.place, args=args):
                return GateDecision(True)
        if ctx.subagent:  # what would ask a person fails at once: nothing is parked, nothing is posted
            return GateDecision(False, f"error: `{tool.name}` needs a person's approval and {SUBAGENT_CANNOT_ASK}, "
                                       "so it did not run")
        if not ctx.interactive:
            return GateDecision(False, f"error: `{tool.name}` needs a person's approval and nobody can be asked "
                                       "here, so it did not run; continue without it")
        request = batched or await self.request(session_id=ctx.session_id, turn_id=ctx.turn_id, call_id=ctx.call_id,
                                                tool=tool.name, args=args, agent=ctx.agent, place=ctx.place,
                                                requester=ctx.requester, risk=tool.risk.value, policy=ruling.policy)
        if request.status == ApprovalStatus.PENDING:
            request = await self._wait(request, ctx.turn_id)
        return await self._edit_ruled(ctx, tool, request) or _decision(request)

    async def _edit_ruled(self, ctx: ToolContext, tool: Tool, request: ApprovalInfo) -> GateDecision | None:
        """An approver's edit meets the policies again as it is about to run, at the turn's own trust: a deny rule
        refuses it (the editor was checked too, but a rule may have been added, or name this turn's level)."""
        if request.status != ApprovalStatus.APPROVED or request.edited_arguments is None:
            return None
        ruling = self.policies.rule(tool.name, request.edited_arguments, risk=tool.risk, trust=ctx.trust)
        if ruling.action is not PolicyAction.DENY:
            return None
        refused = await self._ruled(ruling, ctx, tool)
        assert refused is not None
        return replace(refused, request_id=request.id)

    async def ask_together(self, ctx: ToolContext, calls: Sequence[tuple[str, Tool, dict[str, Any]]],
                           batch: str) -> None:
        """One model step's calls that will need a person are parked in one commit (sharing ``batch``) and
        announced by one event, so one card asks them all; each waits when the runner reaches it (``authorize``).
        A call a rule denies or allows, or that nobody may be asked about, is not parked. One such call: nothing
        is done here (it is asked as ever, on its own card)."""
        asking = [(call_id, tool, args, ruling) for call_id, tool, args in calls
                  if (ruling := await self._would_ask(ctx, tool, args)) is not None]
        if len(asking) < 2:
            return
        rows = [self._row(session_id=ctx.session_id, turn_id=ctx.turn_id, call_id=call_id, tool=tool.name,
                          args=args, agent=ctx.agent, place=ctx.place, requester=ctx.requester,
                          risk=tool.risk.value, policy=ruling.policy, batch=batch)
                for call_id, tool, args, ruling in asking]
        parked = await self.store.park_batch(rows)
        deciders: list[str] = []
        for (call_id, *_), request in zip(asking, parked, strict=True):
            self._asked[(ctx.session_id, call_id)] = request
            self.requests.expect(request.id)  # decided before its call is reached: announced once, not twice
            deciders += self.policy.deciders(request.requester, request.approvers
                                             or self.agents.get(request.agent).approvers)
        log.info("approvals %s requested together (batch %s, session %s)", [r.id for r in parked], batch,
                 ctx.session_id)
        self.requests.announce(ApprovalRequested(parked[0].session, parked[0], tuple(dict.fromkeys(deciders)),
                                                 batch=tuple(parked)))

    async def forget(self, ctx: ToolContext, call_ids: Sequence[str]) -> None:
        left = [request for call_id in call_ids if (request := self._asked.pop((ctx.session_id, call_id), None))]
        for request in left:
            self.requests.expect(request.id, False)
        hold = HOLD.get()
        if left and hold is not None and hold.turn_id == ctx.turn_id and hold.stopped:
            for request in left:  # the card must not offer what no turn will run
                await self.requests.end(request.id, ApprovalStatus.CANCELLED, STOPPED)

    async def _would_ask(self, ctx: ToolContext, tool: Tool, args: dict[str, Any]) -> Ruling | None:
        """The rule a call would be asked under, when ``authorize`` would ask a person about it; else None. Like
        ``authorize``, without its effects (nothing audited, parked or refused here: that happens on reaching it)."""
        ruling = self.policies.rule(tool.name, args, risk=tool.risk, trust=ctx.trust)
        if _untrusted(ctx, tool, ruling) or ruling.action is not PolicyAction.ASK:
            return None
        if ruling.policy is None:
            subject = _subject(tool, args)
            if subject is not None and (tool.name, subject) in ctx.preapproved:
                return None
            if await self.granted(agent=ctx.agent, tool=tool.name, place=ctx.place, args=args):
                return None
        if ctx.subagent or not ctx.interactive:
            return None
        return ruling

    async def request(self, *, session_id: str, turn_id: int | None, call_id: str, tool: str, args: dict[str, Any],
                      agent: str, place: str | None, requester: str | None, risk: str = "gated",
                      policy: Policy | None = None) -> ApprovalInfo:
        """Park a request (committed) and announce it; settle it later. Used by gated calls and by
        anything else a person must approve (a schedule's destination). ``policy``: the rule that asks
        (its approvers, quorum and timeout; without one, the agent's approvers and APPROVAL_TIMEOUT_S)."""
        request = await self.store.park(self._row(session_id=session_id, turn_id=turn_id, call_id=call_id, tool=tool,
                                                  args=args, agent=agent, place=place, requester=requester, risk=risk,
                                                  policy=policy))
        log.info("approval %s requested for %s (session %s)", request.id, tool, session_id)
        deciders = self.policy.deciders(requester, request.approvers or self.agents.get(agent).approvers)
        self.requests.announce(ApprovalRequested(request.session, request, deciders))
        return request

    def _row(self, *, session_id: str, turn_id: int | None, call_id: str, tool: str, args: dict[str, Any],
             agent: str, place: str | None, requester: str | None, risk: str, policy: Policy | None,
             batch: str | None = None) -> ApprovalRow:
        """A pending request's row: the rule's approvers, quorum, timeout, notify, escalation and reminder."""
        now = self.clock.now()
        timeout = timedelta(seconds=policy.timeout_s) if policy is not None and policy.timeout_s else self.timeout
        approvers = policy.approvers if policy is not None else ()
        if policy is not None and policy.escalate_to and not approvers:  # those who join add to these, written out
            approvers = self.agents.get(agent).approvers or self.policy.approvers
        remind = policy.remind_after_s if policy is not None and policy.remind_after_s else None
        return ApprovalRow(
            session_id=session_id, turn_id=turn_id, tool_call_id=call_id, tool=tool, arguments=json.dumps(args),
            agent=agent, place=place, requester=requester, risk=risk, status=ApprovalStatus.PENDING,
            parked_at=now, expires_at=now + timeout, approvers=json.dumps(list(approvers)) if approvers else None,
            quorum=policy.quorum if policy is not None else 1,
            policy=policy.describe() if policy is not None else None,
            notify=json.dumps(list(policy.notify)) if policy is not None else None,
            escalate_to=json.dumps(list(policy.escalate_to)) if policy is not None and policy.escalate_to else None,
            remind_at=now + timedelta(seconds=remind) if remind is not None and remind < timeout.total_seconds()
            else None, batch=batch,
        )

    async def granted(self, *, agent: str, tool: str, place: str | None, args: dict[str, Any]) -> bool:
        """Whether an "Always allow" covers exactly this call here (same agent, tool, place, arguments)."""
        call = grant_call(tool, args)
        return call is not None and await self.store.grant_for(agent, tool, place, call) is not None

    async def wait(self, request: ApprovalInfo) -> ApprovalInfo:
        """Until it is settled (by anyone, in any process); returns it settled. Not a turn's wait:
        being cancelled leaves it pending (e.g. a schedule's destination, across a restart)."""
        return await self._wait(request, None)

    async def audit_entries(self, since: datetime, until: datetime | None = None) -> list[AuditEntry]:
        """The audit trail from ``since`` (up to ``until``), oldest first (``bot audit export``)."""
        return [AuditEntry(r.at, r.actor, r.action, r.subject, r.detail)
                for r in await self.store.audit_between(since, until)]

    async def wait_in_turn(self, request: ApprovalInfo, turn_id: int | None) -> ApprovalInfo:
        """Until it is settled; a stop of the turn ``turn_id`` cancels it (a budget's Continue/Stop)."""
        return await self._wait(request, turn_id)

    async def for_call(self, session_id: str, call_id: str) -> ApprovalInfo | None:
        """The request already made for this call, if any (a restart must not ask twice)."""
        return await self.store.for_call(session_id, call_id)

    async def _refuse_untrusted(self, ctx: ToolContext, tool: Tool) -> GateDecision:
        """A guest's, an outsider's or a bot's words cannot make a gated call run: refused without asking anyone
        (asking would put their request in front of approvers as if an insider had made it)."""
        level = ctx.trust or "unknown"
        log.info("tool %s refused: the turn runs at %s trust (session %s)", tool.name, level, ctx.session_id)
        await self.store.audit(self.clock.now(), ctx.sender or "agent", "trust.refused", f"tool:{tool.name}",
                               {"level": level, "action": "run", "session": ctx.session_id, "place": ctx.place,
                                "turn": ctx.turn_id})
        return GateDecision(False, f"error: `{tool.name}` is {NOT_ALLOWED} ({level}): this conversation includes "
                                   f"a {level} sender, whose requests cannot make tools that need approval run, so "
                                   "it did not run and nobody was asked; do not retry it; continue without it")

    async def _ruled(self, ruling: Ruling, ctx: ToolContext, tool: Tool) -> GateDecision | None:
        """A rule's allow or deny is audited (who asked, which rule, where); a deny is the refusal returned."""
        if ruling.policy is None or ruling.action is PolicyAction.ASK:
            return None
        await self.store.audit(self.clock.now(), ctx.sender or "agent", f"policy.{ruling.action}",
                               f"tool:{tool.name}", {"rule": ruling.policy.describe(), "session": ctx.session_id,
                                                     "place": ctx.place, "turn": ctx.turn_id})
        if ruling.action is PolicyAction.ALLOW:
            return None
        log.info("tool %s refused by %s (session %s)", tool.name, ruling.policy.describe(), ctx.session_id)
        return GateDecision(False, f"error: the approval policy refuses `{tool.name}` here "
                                   f"({ruling.policy.describe()}), so it did not run; do not retry it; "
                                   "continue without it")

    async def recover(self, ctx: ToolContext, tool: Tool, args: dict[str, Any]) -> GateDecision | None:
        request = await self.store.for_call(ctx.session_id, ctx.call_id)
        if request is None or not _same_call(request, ctx, tool, args):
            return None  # another turn's request (one failed after restarts), or a reused call id: never acted on
        ruling = self.policies.rule(tool.name, args, risk=tool.risk, trust=ctx.trust)
        if _untrusted(ctx, tool, ruling) and not request.started:  # a less-trusted sender joined before the crash
            if not request.settled:
                await self.requests.end(request.id, ApprovalStatus.CANCELLED, NOT_ALLOWED)
            return await self._refuse_untrusted(ctx, tool)
        if ruling.action is PolicyAction.DENY and not request.started:  # a rule added since: it wins
            if not request.settled:
                await self.requests.end(request.id, ApprovalStatus.CANCELLED, "refused by a policy rule")
            return await self._ruled(ruling, ctx, tool)
        if request.status == ApprovalStatus.PENDING:
            request = await self._wait(request, ctx.turn_id)  # its buttons still work after a restart
        return await self._edit_ruled(ctx, tool, request) or _decision(request)

    async def started(self, decision: GateDecision) -> None:
        if decision.request_id is not None:
            await self.store.mark_started(decision.request_id, self.clock.now())

    async def _wait(self, request: ApprovalInfo, turn_id: int | None) -> ApprovalInfo:
        """Until someone decides, the timeout (counted from parked_at), or the turn ``turn_id`` is stopped;
        its approvers are reminded meanwhile when its rule says so."""
        reminder = asyncio.create_task(self._remind(request)) if request.remind_at and not request.reminded else None
        try:
            with self.tracer.span(f"{APPROVAL} {request.tool}", {"gen_ai.tool.name": request.tool,
                                                                 "chatops.approval.id": request.id}) as span:
                settled = await self.requests.wait(request, turn_id)
                span.set("chatops.approval.status", settled.status.value)
                return settled
        finally:
            if reminder is not None:
                reminder.cancel()

    async def _remind(self, request: ApprovalInfo) -> None:
        """At the request's ``remind_at``: its approvers are reminded (once, whichever process gets there
        first), and a rule's ``escalate_to`` join them."""
        assert request.remind_at is not None
        await asyncio.sleep(max(0.0, (request.remind_at - self.clock.now()).total_seconds()))
        try:
            won, current = await self.store.remind(request.id, self.clock.now())
        except Exception:  # the reminder is a courtesy: the request still waits and expires
            log.exception("could not remind the approvers of approval %s", request.id)
            return
        if won and current is not None and not current.settled:
            deciders = self.policy.deciders(current.requester,
                                            current.approvers or self.agents.get(current.agent).approvers)
            log.info("approval %s: approvers reminded", request.id)
            self.bus.emit(ApprovalReminded(current.session, current, deciders,
                                           current.expires_at - self.clock.now()))

    # -- deciders' side -------------------------------------------------------------------------

    async def decide(self, request_id: int, verdict: str, by: str, reason: str | None = None, *,
                     operator: bool = False) -> DecideResult:
        """A person's click (or an operator's override). ``verdict``: approve, deny or always."""
        request = await self.store.get(request_id)
        if request is None:
            return DecideResult(False, None)
        if not operator and (why := await self.policy.untrusted(by, request.session, "approve",
                                                                 f"approval:{request.id}")) is not None:
            return DecideResult(False, request, refused=why)
        if not operator and not await self.may_decide(by, request):
            log.info("approval %s: %s may not decide", request_id, by)
            return DecideResult(False, request, refused="You can't approve this: you are not one of its approvers.")
        if request.quorum > 1 and not operator:  # one vote of several (an operator's word settles it)
            return await self._vote(request, verdict, by, reason)
        status = ApprovalStatus.DENIED if verdict == "deny" else ApprovalStatus.APPROVED
        # A rule's request records no grant: it would let the call skip that rule's approvers from then on.
        grantable = verdict == "always" and request.grantable
        call = grant_call(request.tool, request.arguments) if grantable else None
        won, settled = await self._settle(request_id, status, by=by,
                                          reason=(reason or None) if verdict == "deny" else None, grant=call)
        if not won and not settled.settled:  # the settle refused it only because it has run out of time
            won_expiry, settled = await self.requests.end(request_id, ApprovalStatus.EXPIRED)
            log.info("approval %s: %s decided after its expiry; settled as expired", request_id, by)
            return DecideResult(False, settled, late=won_expiry)
        return DecideResult(won, settled)

    async def _vote(self, request: ApprovalInfo, verdict: str, by: str, reason: str | None) -> DecideResult:
        """Distinct approvers count; one Deny settles it denied. "Always allow" counts as an approval and
        records no grant: a standing grant would let the call skip its quorum from then on."""
        counted, won, current = await self.store.vote(request.id, by, "deny" if verdict == "deny" else "approve",
                                                      reason=(reason or None) if verdict == "deny" else None,
                                                      now=self.clock.now())
        if current is None:
            return DecideResult(False, None)
        if not counted and not current.settled and current.expires_at <= self.clock.now():
            won_expiry, current = await self.requests.end(request.id, ApprovalStatus.EXPIRED)
            return DecideResult(False, current, late=won_expiry)
        if won:
            self.requests.settled_here(current)
        elif counted:
            log.info("approval %s: %s", request.id, current.progress())
            self.bus.emit(ApprovalVoted(current.session, current))
        return DecideResult(won, current, voted=counted and not won)

    async def refuse(self, request_id: int, reason: str) -> bool:
        """A channel could not show the request as it must be shown (e.g. its arguments in full):
        nobody can decide on what they cannot see, so the call is cancelled and the model told why."""
        won, _request = await self.requests.end(request_id, ApprovalStatus.CANCELLED, reason)
        return won

    async def get(self, request_id: int) -> ApprovalInfo | None:
        return await self.requests.get(request_id)

    async def record_announcement(self, request_id: int, where: dict[str, Any]) -> None:
        await self.requests.record_announcement(request_id, where)

    async def pending(self, *, place: str | None = None, viewer: Person | None = None) -> list[ApprovalInfo]:
        """Pending requests. A ``viewer`` (a person asking in a channel) sees those asked at ``place``
        only, unless an admin; without a viewer (an operator, core itself) every one."""
        if viewer is not None and not self.policy.is_admin(viewer.user, channel=viewer.channel):
            return await self.store.pending(place=place) if place else []
        return await self.store.pending()

    async def recent(self, session_id: str) -> list[ApprovalInfo]:
        return await self.requests.recent(session_id)

    async def grants(self, *, place: str | None = None, viewer: Person | None = None) -> list[GrantView]:
        """Active grants; who sees which as for ``pending``."""
        if viewer is not None and not self.policy.is_admin(viewer.user, channel=viewer.channel):
            rows = await self.store.grants(place=place) if place else []
        else:
            rows = await self.store.grants()
        return [grant_view(g) for g in rows]

    async def revoke_grant(self, grant_id: int, by: str, *, channel: str | None, operator: bool = False) -> str:
        """Admins (``by`` of ``channel``) and operators (no channel's person: None) only; raises NotAllowed before
        anything is looked up (a refusal says nothing about which grants exist), NotFound if there is no such
        active grant."""
        if not operator and (channel is None or not self.policy.is_admin(by, channel=channel)):
            raise NotAllowed("Only admins (BOT_ADMINS) can revoke grants.")
        if not await self.store.revoke(grant_id, by, self.clock.now()):
            raise NotFound(f"There is no active grant {grant_id}.")
        return f"Grant {grant_id} revoked: that call needs approval again."

    async def may_decide(self, user: str, request: ApprovalInfo) -> bool:
        """Whether ``user`` may decide ``request``. They are a person of the request's channel: it is shown
        only there, and the gateway refuses other channels' clicks on it (``Gateway.decide``)."""
        approvers = request.approvers or self.agents.get(request.agent).approvers
        if not await self.policy.may_decide(user, request.requester, approvers, channel=request.session.channel):
            return False
        trust = self.policy.trust
        return trust is None or not is_restricted(await trust.level(request.session.channel, user,
                                                                    request.session.place))

    async def _settle(self, request_id: int, status: str, *, by: str | None, reason: str | None,
                      grant: str | None = None) -> tuple[bool, ApprovalInfo]:
        """A person's decision, if still pending and not expired; returns whether this call settled it, and
        the request as it stands. ``grant``: the exact call an "Always allow" records."""
        won, request = await self.store.settle(request_id, status, by=by, reason=reason, grant_call=grant,
                                               now=self.clock.now())
        assert request is not None
        if won:
            self.requests.settled_here(request)
        return won, request

    async def _end(self, request_id: int, status: str, reason: str | None) -> tuple[bool, ApprovalInfo | None]:
        """Expired or cancelled: nobody's decision."""
        return await self.store.settle(request_id, status, by=None, reason=reason, now=self.clock.now())

    # -- recovery and housekeeping --------------------------------------------------------------

    async def expire_overdue(self) -> int:
        """Settle as expired every request whose time ran out (e.g. while the process was down)."""
        return await self.requests.expire_overdue()


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
    if request.status == ApprovalStatus.APPROVED:  # by a person (or an operator): this call was asked about
        return GateDecision(True, request_id=request.id, already_started=request.started, asked=True,
                            arguments=request.edited_arguments, edited_by=request.edited_by)
    if request.status == ApprovalStatus.DENIED:
        reason = request.reason or "no reason given"
        return GateDecision(False, f"error: the user denied `{request.tool}`: {reason}; do not retry it; "
                                   "continue without it", request.id)
    if request.status == ApprovalStatus.EXPIRED:  # nobody's decision: never told as a denial
        return GateDecision(False, f"expired: nobody decided within {_span(request.expires_at - request.parked_at)}, "
                                   f"so `{request.tool}` did not run; nobody refused it either: it may be asked for "
                                   "again later if it is still needed", request.id)
    why = f": {request.reason}" if request.reason else ""
    return GateDecision(False, f"error: the request to run `{request.tool}` was cancelled{why}; it did not run",
                        request.id)


def _span(wait: timedelta) -> str:
    """How long a request waited, as a person says it: "45 seconds", "1 minute", "30 minutes"."""
    seconds = wait.total_seconds()
    if seconds < 90:
        return f"{seconds:.3g} second{'' if seconds == 1 else 's'}"
    minutes = round(seconds / 60)
    return f"{minutes} minute{'' if minutes == 1 else 's'}"


def _untrusted(ctx: ToolContext, tool: Tool, ruling: Ruling) -> bool:
    """Whether the turn's trust level keeps this call from running: it would need a person (a gated tool, or
    a rule that asks) or runs only because a rule allows it, and no rule names the sender's level (a rule
    that names it widens or narrows what that level may do). A deny is a deny at every level."""
    if not is_restricted(ctx.trust) or ruling.action is PolicyAction.DENY:
        return False
    if ruling.policy is not None and ctx.trust in ruling.policy.trust:
        return False
    return tool.risk is Risk.GATED or ruling.action is PolicyAction.ASK
