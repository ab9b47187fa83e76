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
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from core.agents import AgentDirectory
from core.approval_policy import ApprovalPolicy, DecideResult
from core.clock import Clock
from core.errors import NotAllowed, NotFound
from core.events import ApprovalReminded, ApprovalRequested, ApprovalResolved, ApprovalVoted, EventBus, FreezeNotice
from core.freeze_gate import approved_by_admin, asks_during_freeze, frozen_request, is_gated, rule_of
from core.freezes import Freeze, Freezes
from core.grant_keys import grant_call, grant_view, grants_cover, rule_key
from core.grants import GRANT_VERDICTS, GrantScope, GrantTerms
from core.model import BUDGET_RISK, CAP_RISK, ApprovalInfo, ApprovalStatus, thread_of
from core.oncall import OnCallRota
from core.oncall_approvals import OnCallApprovers, RotaOutcome
from core.parking import HOLD
from core.people import Person
from core.policies import Policy, PolicyAction, PolicyBook, Ruling
from core.requests import STOPPED, PersonRequests
from core.self_approval import OPERATOR_EXEMPT, REFUSED, barred, effective
from core.store import ApprovalStore
from core.store.tables import ApprovalRow
from core.tools import SUBAGENT_CANNOT_ASK, GateDecision, Risk, Tool, ToolContext, canonical_call
from core.tracing import APPROVAL, NO_TRACING, Tracer
from core.trust import NOT_ALLOWED, is_restricted
from core.views import AuditEntry, GrantView

if TYPE_CHECKING:  # webauthn is loaded only where passkeys are made (bot.passkeys_config)
    from core.passkeys import Passkeys

log = logging.getLogger(__name__)

FREEZE_TOLD_KEPT = 1000  # turns remembered as told of a freeze
# Why a call is refused when no approver can be shown its arguments in full.
TOO_LONG_TO_SHOW = "its arguments are too long to show an approver, and attaching them in full failed"


class ApprovalBroker:
    def __init__(
        self, store: ApprovalStore, bus: EventBus, clock: Clock, policy: ApprovalPolicy, agents: AgentDirectory,
        *, timeout_s: float, poll_s: float = 2.0, policies: PolicyBook | None = None, tracer: Tracer = NO_TRACING,
        rota: OnCallRota | None = None,
        freezes: Freezes | None = None,
        self_approval: bool = True,
        passkeys: Passkeys | None = None,
    ) -> None:
        self.store = store
        self.bus = bus
        self.clock = clock
        self.policy = policy
        self.agents = agents
        self.timeout = timedelta(seconds=timeout_s)
        self.policies = policies or PolicyBook()  # [[policies]]: the first matching rule decides a call
        self.tracer = tracer  # a wait on a person is a span of its call's trace (core.tracing)
        self.on_call = OnCallApprovers(rota, store, bus, clock, self._end_unasked)
        self.freezes = freezes  # change freezes (core.freezes); None: there are none
        self._freeze_told: dict[tuple[str, int], None] = {}  # turns whose thread heard of the freeze (the newest)
        self.self_approval = self_approval  # BOT_SELF_APPROVAL: rules that do not say, and calls no rule decides
        self.passkeys = passkeys  # a step_up rule's approvals count once confirmed with one (None: no such rule)
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
        freeze = await self._freeze(tool, ruling)
        if freeze is not None and not asks_during_freeze(ruling.policy):
            return await self._refuse_frozen(ctx, tool.name, freeze)
        refused = await self._ruled(ruling, ctx, tool) if freeze is None else None
        if refused is not None:
            return refused
        if ruling.action is PolicyAction.ALLOW and freeze is None:
            return GateDecision(True)
        # A firing's preapproved destination covers calls no rule decides: a rule's own approvers and quorum are
        # never skipped. A grant covers them too, and a rule's calls when the rule itself offers grants (its
        # grant_ttl_s, quorum 1): only one made under that very rule, until it expires. In a freeze, none of them
        # does (a rule's during_freeze = "ask" asks a person).
        if ruling.policy is None and freeze is None:
            subject = _subject(tool, args)
            if subject is not None and (tool.name, subject) in ctx.preapproved:  # e.g. a firing's own destination
                return GateDecision(True)
        if freeze is None and grants_cover(ruling.policy) and await self.granted(
                agent=ctx.agent, tool=tool.name, place=ctx.place, args=args, session_id=ctx.session_id,
                policy=ruling.policy, not_by=self._not_granting(ctx, ruling)):
            return GateDecision(True)
        if ctx.subagent:  # what would ask a person fails at once: nothing is parked, nothing is posted
            return GateDecision(False, f"error: `{tool.name}` needs a person's approval and {SUBAGENT_CANNOT_ASK}, "
                                       "so it did not run")
        if not ctx.interactive:
            return GateDecision(False, f"error: `{tool.name}` needs a person's approval and nobody can be asked "
                                       "here, so it did not run; continue without it")
        request = batched or await self.request(session_id=ctx.session_id, turn_id=ctx.turn_id, call_id=ctx.call_id,
                                                tool=tool.name, args=args, agent=ctx.agent, place=ctx.place,
                                                requester=ctx.requester, risk=tool.risk.value, policy=ruling.policy,
                                                senders=ctx.senders)
        if request.status == ApprovalStatus.PENDING:
            request = await self._wait(request, ctx.turn_id)
        return (await self._edit_ruled(ctx, tool, request)
                or await self._unless_frozen(ctx, tool, request, ruling.policy))

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
        rows: list[tuple[str, ApprovalRow]] = []
        for call_id, tool, args, ruling in asking:
            row, rota = await self._row(session_id=ctx.session_id, turn_id=ctx.turn_id, call_id=call_id,
                                        tool=tool.name, args=args, agent=ctx.agent, place=ctx.place,
                                        requester=ctx.requester, risk=tool.risk.value, policy=ruling.policy,
                                        senders=ctx.senders, batch=batch)
            if rota is None or rota.problem is None:  # a rota that could not be read: asked on its own card, told
                rows.append((call_id, row))
        if len(rows) < 2:
            return
        parked = await self.store.park_batch([row for _, row in rows])
        deciders: list[str] = []
        for (call_id, _), request in zip(rows, parked, strict=True):
            self._asked[(ctx.session_id, call_id)] = request
            self.requests.expect(request.id)  # decided before its call is reached: announced once, not twice
            deciders += self._asked_of(request, request.approvers or self.agents.get(request.agent).approvers)
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
        if _untrusted(ctx, tool, ruling) or ctx.subagent or not ctx.interactive:
            return None
        freeze = await self._freeze(tool, ruling)
        if freeze is not None:  # refused on reaching it, or (during_freeze = "ask") asked whatever would skip it
            return ruling if asks_during_freeze(ruling.policy) else None
        if ruling.action is not PolicyAction.ASK:
            return None
        if ruling.policy is None:
            subject = _subject(tool, args)
            if subject is not None and (tool.name, subject) in ctx.preapproved:
                return None
        if grants_cover(ruling.policy) and await self.granted(
                agent=ctx.agent, tool=tool.name, place=ctx.place, args=args, session_id=ctx.session_id,
                policy=ruling.policy, not_by=self._not_granting(ctx, ruling)):
            return None
        return ruling

    async def request(self, *, session_id: str, turn_id: int | None, call_id: str, tool: str, args: dict[str, Any],
                      agent: str, place: str | None, requester: str | None, risk: str = "gated",
                      policy: Policy | None = None, senders: tuple[str, ...] = ()) -> ApprovalInfo:
        """Park a request (committed) and announce it; settle it later. Used by gated calls and by
        anything else a person must approve (a schedule's destination). ``policy``: the rule that asks
        (its approvers, quorum and timeout; without one, the agent's approvers and APPROVAL_TIMEOUT_S).
        ``senders``: everyone whose words the turn took so far (the store adds the requester and the turn's
        taken messages): with self-approval off, none of them may approve it."""
        row, rota = await self._row(session_id=session_id, turn_id=turn_id, call_id=call_id, tool=tool, args=args,
                                    agent=agent, place=place, requester=requester, risk=risk, policy=policy,
                                    senders=senders)
        request = await self.store.park(row)
        log.info("approval %s requested for %s (session %s)", request.id, tool, session_id)
        if rota is not None and rota.problem is not None:  # the thread is told; a refusal ends it, nobody asked
            request = await self.on_call.told(request, rota)
            if rota.refused:
                return request
        deciders = self._asked_of(request, request.approvers or self.agents.get(agent).approvers)
        if risk == CAP_RISK:  # a spending cap: admins only (core.spending)
            deciders = self.policy.admins
        self.requests.announce(ApprovalRequested(request.session, request, deciders))
        return request

    async def _row(self, *, session_id: str, turn_id: int | None, call_id: str, tool: str, args: dict[str, Any],
                   agent: str, place: str | None, requester: str | None, risk: str, policy: Policy | None,
                   senders: tuple[str, ...] = (), batch: str | None = None) -> tuple[ApprovalRow, RotaOutcome | None]:
        """A pending request's row: the rule's approvers (whoever is on call now, for a rota's), quorum, timeout,
        notify, escalation, reminder, grants, senders and step-up; and what the rota said, if one was read."""
        now = self.clock.now()
        timeout = timedelta(seconds=policy.timeout_s) if policy is not None and policy.timeout_s else self.timeout
        approvers = policy.approvers if policy is not None else ()
        if policy is not None and policy.escalate_to and not approvers:  # those who join add to these, written out
            approvers = self.agents.get(agent).approvers or self.policy.approvers
        escalate_to = policy.escalate_to if policy is not None else ()
        # A cap's Continue is for admins only: the rota would name nobody who decides, and its outage would cancel it.
        rota = None if risk == CAP_RISK else await self.on_call.resolve(
            approvers or self.agents.get(agent).approvers or self.policy.approvers, escalate_to)
        if rota is not None:  # whoever is on call now, written out (the decision uses them, not the rota then)
            approvers, escalate_to = rota.approvers, rota.escalate_to
        remind = policy.remind_after_s if policy is not None and policy.remind_after_s else None
        return ApprovalRow(
            session_id=session_id, turn_id=turn_id, tool_call_id=call_id, tool=tool, arguments=json.dumps(args),
            agent=agent, place=place, requester=requester, risk=risk, status=ApprovalStatus.PENDING,
            parked_at=now, expires_at=now + timeout, approvers=json.dumps(list(approvers)) if approvers else None,
            quorum=policy.quorum if policy is not None else 1,
            policy=policy.describe() if policy is not None else None,
            notify=json.dumps(list(policy.notify)) if policy is not None else None,
            escalate_to=json.dumps(list(escalate_to)) if escalate_to else None,
            remind_at=now + timedelta(seconds=remind) if remind is not None and remind < timeout.total_seconds()
            else None,
            grant_ttl_s=policy.grant_ttl_s if policy is not None and grants_cover(policy) else None,
            grant_rule_key=rule_key(policy) if policy is not None and grants_cover(policy) else None,
            senders=json.dumps(list(senders)) if senders else None,
            # A thread budget's or a cap's Continue is no tool call: the self-approval rule is about tool calls.
            self_approval=effective(policy, self.self_approval) or risk in (BUDGET_RISK, CAP_RISK),
            step_up=policy is not None and policy.step_up, batch=batch,
        ), rota

    async def granted(self, *, agent: str, tool: str, place: str | None, args: dict[str, Any],
                      session_id: str | None = None, policy: Policy | None = None, not_by: tuple[str, ...] = ()
                      ) -> bool:
        """Whether a live grant covers exactly this call here (same agent, tool, place, arguments): one for the
        place, or one for the conversation of ``session_id`` (a sub-agent's is its parent's), made under
        ``policy`` (the rule deciding the call now; None: a call no rule decides), by someone not in ``not_by``
        (a grant is its maker's decision: it never approves that person's own call where they may not)."""
        call = grant_call(tool, args)
        if call is None:
            return False
        thread = thread_of(session_id) if session_id else None
        key = rule_key(policy) if policy is not None else None
        return await self.store.grant_for(agent, tool, place, call, thread=thread, rule_key=key,
                                          now=self.clock.now(), not_by=not_by) is not None

    def _not_granting(self, ctx: ToolContext, ruling: Ruling) -> tuple[str, ...]:
        """Whose grants cannot cover this call: with self-approval off (its rule's, else BOT_SELF_APPROVAL), the
        turn's senders. A grant is its maker's one decision, never their approval of their own later call."""
        if effective(ruling.policy, self.self_approval):
            return ()
        return tuple(dict.fromkeys(s for s in (ctx.requester, *ctx.senders) if s))

    def sole_approvers(self, requester: str | None, senders: tuple[str, ...]) -> tuple[str, ...]:
        """Whose grants do not cover a call no rule decides: its senders while BOT_SELF_APPROVAL is off."""
        return () if self.self_approval else tuple(dict.fromkeys(s for s in (requester, *senders) if s))

    def _asked_of(self, request: ApprovalInfo, approvers: tuple[str, ...]) -> tuple[str, ...]:
        """Who is asked (named on the card, sent a DM): not the senders when their approval would not count."""
        return tuple(d for d in self.policy.deciders(request.requester, approvers) if not barred(request, d))

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
        if request.started:
            return _decision(request)
        return (await self._edit_ruled(ctx, tool, request)
                or await self._unless_frozen(ctx, tool, request, rule_of(request, self.policies)))

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
            deciders = self._asked_of(current, current.approvers or self.agents.get(current.agent).approvers)
            log.info("approval %s: approvers reminded", request.id)
            self.bus.emit(ApprovalReminded(current.session, current, deciders,
                                           current.expires_at - self.clock.now()))

    # -- deciders' side -------------------------------------------------------------------------

    async def decide(self, request_id: int, verdict: str, by: str, reason: str | None = None, *,
                     operator: bool = False, stepped_up: bool = False) -> DecideResult:
        """A person's click (or an operator's override). ``verdict``: approve, deny, always (a grant for the place)
        or thread (a grant for this conversation only). ``stepped_up``: the approver has just confirmed it with a
        passkey (core.step_up), as a ``step_up`` rule requires."""
        request = await self.store.get(request_id)
        if request is None:
            return DecideResult(False, None)
        if not operator and (why := await self.policy.untrusted(by, request.session, "approve",
                                                                 f"approval:{request.id}")) is not None:
            return DecideResult(False, request, refused=why)
        if not operator and not await self.may_decide(by, request):
            log.info("approval %s: %s may not decide", request_id, by)
            return DecideResult(False, request, refused="You can't approve this: you are not one of its approvers.")
        if verdict != "deny" and (frozen := await self._frozen_approval(request, by, operator=operator)) is not None:
            return DecideResult(False, request, refused=frozen)  # still pending: Deny works, and so does a lift
        # A sender may always deny (withdraw) it; a settled request says what happened, to them too.
        if not operator and verdict != "deny" and not request.settled and barred(request, by):
            return await self._refuse_own(request, by, verdict)
        if (request.step_up and not operator and not stepped_up and verdict != "deny"
                and not request.settled and request.expires_at > self.clock.now()):
            return await self._ask_step_up(request, verdict, by)  # nothing counts until the passkey says so
        if request.quorum > 1 and not operator:  # one vote of several (an operator's word settles it)
            return await self._vote(request, verdict, by, reason)
        status = ApprovalStatus.DENIED if verdict == "deny" else ApprovalStatus.APPROVED
        # A rule's request records no grant unless the rule offers one (grant_ttl_s): it would let the call skip
        # that rule's approvers from then on.
        grant = self._grant_terms(request, verdict)
        won, settled = await self._settle(request_id, status, by=by,
                                          reason=(reason or None) if verdict == "deny" else None, grant=grant,
                                          detail=_operator_exempt(request, verdict) if operator else None)
        if not won and not settled.settled:  # the settle refused it only because it has run out of time
            won_expiry, settled = await self.requests.end(request_id, ApprovalStatus.EXPIRED)
            log.info("approval %s: %s decided after its expiry; settled as expired", request_id, by)
            return DecideResult(False, settled, late=won_expiry)
        return DecideResult(won, settled)

    def _grant_terms(self, request: ApprovalInfo, verdict: str) -> GrantTerms | None:
        """The grant an "Always allow" or "Allow in this thread" records on ``request``, if it offers that one
        (else the click is a plain approval). It lasts the rule's grant_ttl_s from now (no rule: for good)."""
        scope = GRANT_VERDICTS.get(verdict)
        if scope is None or not request.grantable or (scope is GrantScope.THREAD and not request.thread_grantable):
            return None
        call = grant_call(request.tool, request.arguments)
        if call is None:
            return None
        ttl = request.grant_ttl_s
        return GrantTerms(call=call, scope=scope,
                          thread=thread_of(request.session.id) if scope is GrantScope.THREAD else None,
                          expires_at=self.clock.now() + timedelta(seconds=ttl) if ttl is not None else None,
                          rule=request.policy, rule_key=request.grant_rule_key)

    async def _refuse_own(self, request: ApprovalInfo, by: str, verdict: str) -> DecideResult:
        """A sender's approval while self-approval is off: nothing changes, and the attempt is audited."""
        log.info("approval %s: %s asked for it and may not approve it", request.id, by)
        await self.store.audit(self.clock.now(), by, "approval.self_refused", f"approval:{request.id}",
                               {"tool": request.tool, "session": request.session.id, "verdict": verdict})
        return DecideResult(False, request, refused=REFUSED)

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

    async def _ask_step_up(self, request: ApprovalInfo, verdict: str, by: str) -> DecideResult:
        """The approver's private way to confirm with a passkey (a one-time link), or how to get one."""
        if self.passkeys is None:  # start refuses a step_up rule without BOT_PUBLIC_URL: only a rule added since
            return DecideResult(False, request, refused="This approval needs a passkey, and this bot has no "
                                                        "passkey page (BOT_PUBLIC_URL): ask an operator.")
        return DecideResult(False, request, step_up=await self.passkeys.ask(request, verdict, by))

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

    async def grants(self, *, place: str | None = None, viewer: Person | None = None,
                     every: bool = False) -> list[GrantView]:
        """Active grants (not revoked, not expired); who sees which as for ``pending``. ``every``: revoked and
        expired ones too (an operator's listing)."""
        now = None if every else self.clock.now()
        if viewer is not None and not self.policy.is_admin(viewer.user, channel=viewer.channel):
            rows = await self.store.grants(place=place, now=now, include_revoked=every) if place else []
        else:
            rows = await self.store.grants(now=now, include_revoked=every)
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
        if request.risk == CAP_RISK:  # past a spending cap: only an admin, never the requester or an approver
            return self.policy.is_admin(user, channel=request.session.channel)
        approvers = request.approvers or self.agents.get(request.agent).approvers
        if not await self.policy.may_decide(user, request.requester, approvers, channel=request.session.channel):
            return False
        trust = self.policy.trust
        return trust is None or not is_restricted(await trust.level(request.session.channel, user,
                                                                    request.session.place))

    async def _settle(self, request_id: int, status: str, *, by: str | None, reason: str | None,
                      grant: GrantTerms | None = None, detail: dict[str, Any] | None = None
                      ) -> tuple[bool, ApprovalInfo]:
        """A person's decision, if still pending and not expired; returns whether this call settled it, and
        the request as it stands. ``grant``: what an "Always allow" or "Allow in this thread" records;
        ``detail``: more for its audit line."""
        won, request = await self.store.settle(request_id, status, by=by, reason=reason, grant=grant,
                                               now=self.clock.now(), detail=detail)
        assert request is not None
        if won:
            self.requests.settled_here(request)
        return won, request

    async def _end_unasked(self, request_id: int, reason: str) -> ApprovalInfo:
        """Cancelled before anyone was asked (nobody on call to ask): the model and the thread are told why."""
        return (await self.requests.end(request_id, ApprovalStatus.CANCELLED, reason))[1]

    async def _end(self, request_id: int, status: str, reason: str | None) -> tuple[bool, ApprovalInfo | None]:
        """Expired or cancelled: nobody's decision."""
        return await self.store.settle(request_id, status, by=None, reason=reason, now=self.clock.now())

    # -- change freezes (core.freezes, core.freeze_gate) -----------------------------------------

    async def _freeze(self, tool: Tool, ruling: Ruling) -> Freeze | None:
        """The freeze in force that covers this call, if any (read from the database: every replica's)."""
        if self.freezes is None or not is_gated(tool, ruling):
            return None
        return await self.freezes.active()

    async def _refuse_frozen(self, ctx: ToolContext, tool: str, freeze: Freeze, request_id: int | None = None
                             ) -> GateDecision:
        """Refused for the freeze: audited, the thread told why and until when, the model told not to retry."""
        log.info("tool %s refused: change freeze (session %s)", tool, ctx.session_id)
        await self.store.audit(self.clock.now(), ctx.sender or "agent", "freeze.refused", f"tool:{tool}",
                               {"freeze": freeze.id, "until": freeze.until.isoformat(), "session": ctx.session_id,
                                "place": ctx.place, "turn": ctx.turn_id, "request": request_id})
        if ctx.session is not None and self._first_freeze_notice(ctx):
            self.bus.emit(FreezeNotice(ctx.session, f"`{tool}` was refused: {freeze.describe()}", turn_id=ctx.turn_id,
                                       status=f"is held by a change freeze until {freeze.until:%H:%M} UTC…"))
        return GateDecision(False, freeze.refusal(tool), request_id)

    def _first_freeze_notice(self, ctx: ToolContext) -> bool:
        """Whether this turn's thread is yet to hear of the freeze: once per turn, however many calls it refuses."""
        key = (ctx.session_id, ctx.turn_id)
        if key in self._freeze_told:
            return False
        self._freeze_told[key] = None
        if len(self._freeze_told) > FREEZE_TOLD_KEPT:  # the oldest turn forgotten: at worst told once more
            del self._freeze_told[next(iter(self._freeze_told))]
        return True

    async def _unless_frozen(self, ctx: ToolContext, tool: Tool, request: ApprovalInfo, policy: Policy | None
                             ) -> GateDecision:
        """An approved request checked once more right before its call runs: a freeze that began while it waited
        (here or on another replica) refuses it, unless its rule asks during freezes and an admin approved it."""
        decision = _decision(request)
        if not decision.allowed or self.freezes is None or request.risk in (BUDGET_RISK, CAP_RISK):
            return decision
        freeze = await self.freezes.active()
        if freeze is None or (asks_during_freeze(policy) and approved_by_admin(request, self._admin_of(request))):
            return decision
        return await self._refuse_frozen(ctx, tool.name, freeze, request.id)

    async def frozen_approval(self, request: ApprovalInfo, by: str) -> str | None:
        """Why ``by`` may not approve ``request`` now because of a freeze (an edit approves too); None if they may."""
        return await self._frozen_approval(request, by, operator=False)

    async def goes_on(self, ctx: ToolContext, tool: Tool, args: dict[str, Any], request_id: int | None
                      ) -> str | None:
        """After a pause inside a call allowed before it (a connection's consent waits up to CONNECTION_TIMEOUT_S):
        a freeze that began meanwhile refuses it as the gate would have (audited, the thread told), unless its rule
        asks during freezes and an admin approved it. None: it goes on."""
        ruling = self.policies.rule(tool.name, args, risk=tool.risk, trust=ctx.trust)
        freeze = await self._freeze(tool, ruling)
        if freeze is None:
            return None
        if asks_during_freeze(ruling.policy) and request_id is not None:
            request = await self.store.get(request_id)
            if request is not None and approved_by_admin(request, self._admin_of(request)):
                return None
        return (await self._refuse_frozen(ctx, tool.name, freeze, request_id)).result

    async def _frozen_approval(self, request: ApprovalInfo, by: str, *, operator: bool) -> str | None:
        """Why ``by`` may not approve ``request`` now, because of a freeze; None when they may."""
        if self.freezes is None or not frozen_request(request) or (freeze := await self.freezes.active()) is None:
            return None
        if asks_during_freeze(rule_of(request, self.policies)):
            if operator or self._admin_of(request)(by):
                return None
            return (f"You can't approve this during the {freeze.describe()}. Only admins can approve it until "
                    "the freeze ends (its rule says during_freeze = \"ask\").")
        return (f"Not approved: {freeze.describe()}. Calls that need approval are refused until the freeze ends "
                "or is lifted; this request stays open until then (or until it expires), and Deny still works.")

    def _admin_of(self, request: ApprovalInfo) -> Callable[[str], bool]:
        return lambda user: self.policy.is_admin(user, channel=request.session.channel)

    # -- recovery and housekeeping --------------------------------------------------------------

    async def expire_overdue(self) -> int:
        """Settle as expired every request whose time ran out (e.g. while the process was down)."""
        return await self.requests.expire_overdue()


def _operator_exempt(request: ApprovalInfo, verdict: str) -> dict[str, Any] | None:
    """What an operator's decision skipped of the request's rule, for its audit line: self-approval (refused to the
    turn's senders), and for an approval the passkey (step_up) and the other votes (quorum); None when nothing."""
    exempt = dict(OPERATOR_EXEMPT) if not request.self_approval else {}
    if verdict != "deny" and request.step_up:
        exempt["step_up_exempt"] = "operator"
    if verdict != "deny" and request.quorum > 1:
        exempt["quorum_exempt"] = "operator"
    return exempt or None


def _same_call(request: ApprovalInfo, ctx: ToolContext, tool: Tool, args: dict[str, Any]) -> bool:
    """Whether a stored request is this very call of this turn (what was approved is what would run)."""
    return (request.turn_id == ctx.turn_id and request.tool == tool.name
            and canonical_call(request.arguments) == canonical_call(args))


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
