"""Spending caps (SPEC §17, issue 40.7): what each model call used, and the caps checked before every call.

- Each call is counted per UTC day, agent and person (``core.store.usage``): its tokens as the endpoint said (clamped:
  an endpoint's figures are an outsider's), and its cost from ``[[prices]]`` by the model that answered (the fallback's
  price once a session switched). A model without a price has no cost; the wiring refuses a cost cap while any model
  the bot may call has no price, so a cost cap never silently counts nothing.
- The person is the turn's requester: a firing's is its schedule's creator, an event's turn is ``nobody``'s. Someone
  whose message was steered into another person's turn does not pay for it: the requester does (the person who
  started the turn is who a cap can name and who an admin can ask). But a person past their own daily cap cannot
  spend through another's turn either: every sender's person cap is checked before each call.
- A sub-agent counts under its own agent (its caps) and the same person.
- Before every call (interactive turns, firings, events, sub-agents, listening turns) the agent's daily and monthly
  caps and the person's daily caps are checked. A reached cap parks an interactive turn on a **Continue** / **Stop**
  card that only admins decide (the thread budget's durable park: an approval filed as ``CAP_RISK``); Continue lets
  this turn go on past that cap for the rest of its period, other turns still stop. Where nobody can be asked (a
  firing, an event, a sub-agent, a turn nobody addressed) the turn ends before the call and says why.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, ClassVar

from core.clock import Clock
from core.errors import BudgetExhausted
from core.events import Event, EventBus
from core.model import CAP_RISK, EVENT_PREFIX, ApprovalStatus
from core.providers import Completion
from core.store.usage import Count, Spent, Totals, UsageKey, UsageStore
from core.tools import SUBAGENT_CANNOT_ASK, ToolContext

if TYPE_CHECKING:
    from core.approvals import ApprovalBroker

log = logging.getLogger(__name__)

CAP_TOOL = "spending_cap"  # what a cap's park is filed under (its card has Continue and Stop)
NOBODY = "nobody"  # the person of a turn nobody asked for (an event's)
FIRING_PREFIX = "schedule:"  # a firing's session: nobody is there to click Continue
# An endpoint's figures are an outsider's: a negative count would hide spending, a huge one would use up every cap
# at once. No model call's request or answer comes near this many tokens.
MAX_CALL_TOKENS = 4_000_000


@dataclass(frozen=True)
class Price:
    """``[[prices]]``: what a million tokens cost, in the price table's currency."""

    input_per_million: float
    output_per_million: float

    def micros(self, input_tokens: int, output_tokens: int) -> int:
        """The cost in millionths of the currency: tokens times the price per million tokens."""
        return round(input_tokens * self.input_per_million + output_tokens * self.output_per_million)


@dataclass(frozen=True)
class AgentCaps:
    """An agent's ``daily_tokens``, ``monthly_tokens``, ``daily_cost``, ``monthly_cost`` (None: no cap)."""

    daily_tokens: int | None = None
    monthly_tokens: int | None = None
    daily_cost: float | None = None
    monthly_cost: float | None = None

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.daily_tokens, self.monthly_tokens, self.daily_cost, self.monthly_cost))

    @property
    def costs(self) -> bool:
        return self.daily_cost is not None or self.monthly_cost is not None


@dataclass(frozen=True)
class PersonCaps:
    """``[limits] person_daily_tokens`` and ``person_daily_cost``: each person's, across agents."""

    daily_tokens: int | None = None
    daily_cost: float | None = None

    @property
    def any(self) -> bool:
        return self.daily_tokens is not None or self.daily_cost is not None


@dataclass(frozen=True)
class CapsConfig:
    prices: Mapping[str, Price] = field(default_factory=dict)
    agents: Mapping[str, AgentCaps] = field(default_factory=dict)
    person: PersonCaps = PersonCaps()

    @property
    def costs(self) -> bool:
        return self.person.daily_cost is not None or any(c.costs for c in self.agents.values())


@dataclass(frozen=True)
class CapReached:
    """One cap at or past its limit for this call."""

    key: str  # "agent-day-tokens", … : with the period, what one Continue of a turn covers
    period: str  # "2026-12-05" or "2026-12"
    what: str  # "the agent ops's daily token cap"
    used: int  # tokens, or millionths
    limit: int
    cost: bool

    def amounts(self) -> str:
        if self.cost:
            return f"{self.used / 1e6:,.4f} of {self.limit / 1e6:,.4f}"
        return f"{self.used:,} of {self.limit:,} tokens"

    def describe(self) -> str:
        return f"{self.what} is reached ({self.amounts()})"


@dataclass(frozen=True)
class ModelSpent(Event):
    """One model call counted (for /metrics): by agent, never person (see bot.metrics)."""

    name: ClassVar[str] = "model.spent"
    agent: str
    model: str
    input_tokens: int
    output_tokens: int
    cost: float | None


def cost_cap_problem(config: CapsConfig, models: list[str]) -> str | None:
    """Why the caps cannot hold: a cost cap while one of the models the bot may call has no price (its calls would
    cost nothing, so the cap would never be reached). None when they can."""
    if not config.costs:
        return None
    missing = sorted({name for name in models if name not in config.prices})
    if not missing:
        return None
    return (f"a cost cap (daily_cost, monthly_cost or [limits] person_daily_cost) is set, but these models have no "
            f"[[prices]] table: {', '.join(missing)}; add one per model (input_per_million, output_per_million), or "
            "cap tokens instead")


def clamp(tokens: int | None) -> int | None:
    return None if tokens is None else min(max(0, int(tokens)), MAX_CALL_TOKENS)


def person_of(ctx: ToolContext) -> str:
    """Whom a call is counted under: the turn's requester (a firing's creator), else nobody."""
    return ctx.requester or NOBODY


def steered_in(ctx: ToolContext, who: str) -> tuple[str, ...]:
    """The people besides ``who`` whose words the turn took (steered or merged into it)."""
    return tuple(s for s in dict.fromkeys(ctx.senders) if s and s != who and not s.startswith(EVENT_PREFIX))


def can_ask(ctx: ToolContext) -> bool:
    """Whether an admin can be asked to Continue here: not in a sub-agent, a firing, an event's turn or a turn nobody
    addressed (there is nobody there, or nobody asked the bot for anything)."""
    return (ctx.interactive and not ctx.subagent and not ctx.unaddressed
            and not ctx.session_id.startswith((FIRING_PREFIX, EVENT_PREFIX)))


def reached(caps: AgentCaps, person: PersonCaps, totals: Totals, *, agent: str, who: str, day: str,
            month: str) -> list[CapReached]:
    """The caps at or past their limit, the agent's first."""
    checks = (
        ("agent-day-tokens", day, f"the agent {agent}'s daily token cap", totals.agent_day_tokens, caps.daily_tokens,
         False),
        ("agent-month-tokens", month, f"the agent {agent}'s monthly token cap", totals.agent_month_tokens,
         caps.monthly_tokens, False),
        ("agent-day-cost", day, f"the agent {agent}'s daily cost cap", totals.agent_day_micros,
         _micros(caps.daily_cost), True),
        ("agent-month-cost", month, f"the agent {agent}'s monthly cost cap", totals.agent_month_micros,
         _micros(caps.monthly_cost), True),
        ("person-day-tokens", day, f"{who}'s daily token cap", totals.person_day_tokens, person.daily_tokens, False),
        ("person-day-cost", day, f"{who}'s daily cost cap", totals.person_day_micros, _micros(person.daily_cost),
         True),
    )
    return [CapReached(key, period, what, used, limit, cost)
            for key, period, what, used, limit, cost in checks if limit is not None and used >= limit]


def _micros(amount: float | None) -> int | None:
    return None if amount is None else round(amount * 1e6)


def _days(now: datetime) -> tuple[str, str, str]:
    """(today, the first day of this month, this month), UTC."""
    day = now.astimezone(UTC).date().isoformat()
    return day, day[:8] + "01", day[:7]


class SpendingCaps:
    def __init__(self, store: UsageStore, clock: Clock, broker: ApprovalBroker | None, config: CapsConfig, *,
                 bus: EventBus | None = None) -> None:
        self.store = store
        self.clock = clock
        self.broker = broker
        self.config = config
        self.bus = bus

    def _caps(self, agent: str) -> AgentCaps:
        return self.config.agents.get(agent, AgentCaps())

    async def before_call(self, ctx: ToolContext, agent: str) -> None:
        """Return once the call may be made: no cap reached, or each reached one continued for this turn. Raises
        ``BudgetExhausted`` (the turn ends and says why) where nobody can be asked, or on Stop or expiry."""
        caps, who = self._caps(agent), person_of(ctx)
        # An event's turn is nobody's: a person's cap is not theirs to share (the agent's caps and the source's
        # rate_per_minute bound events).
        person = self.config.person if who != NOBODY else PersonCaps()
        others = steered_in(ctx, who) if self.config.person.any else ()
        if not caps.any and not person.any and not others:
            return  # nothing to check: no read on the hot path
        day, month_start, month = _days(self.clock.now())
        totals = await self.store.totals(day=day, month_start=month_start, agent=agent, person=who)
        for cap in reached(caps, person, totals, agent=agent, who=who, day=day, month=month):
            await self._continue_past(ctx, agent, cap)
        # Someone whose words were steered into this turn is held to their own cap (the requester still pays):
        # past it, their words may not make the model spend on another person's turn.
        for other in others:
            theirs = await self.store.totals(day=day, month_start=month_start, agent=agent, person=other)
            for cap in reached(AgentCaps(), self.config.person, theirs, agent=agent, who=other, day=day, month=month):
                await self._continue_past(ctx, agent, replace(cap, key=f"{cap.key}:{other}"))

    async def _continue_past(self, ctx: ToolContext, agent: str, cap: CapReached) -> None:
        if ctx.subagent:
            raise BudgetExhausted(f"{_first(cap.describe())}; {SUBAGENT_CANNOT_ASK}.")
        if self.broker is None or not can_ask(ctx):
            raise BudgetExhausted(f"{_first(cap.describe())}, and nobody can be asked to continue here, so I stopped "
                                  "before calling the model.")
        # One request per turn, cap and period: a restart finds it again, and a Continue holds for the rest of it.
        call_id = f"cap:{ctx.turn_id}:{cap.key}:{cap.period}"
        request = await self.broker.for_call(ctx.session_id, call_id)
        if request is None:
            request = await self.broker.request(
                session_id=ctx.session_id, turn_id=ctx.turn_id, call_id=call_id, tool=CAP_TOOL,
                args={"cap": cap.what, "amounts": cap.amounts(), "period": cap.period, "agent": agent},
                agent=ctx.agent, place=ctx.place, requester=ctx.requester, risk=CAP_RISK)
            log.info("turn %s parked on %s (%s)", ctx.turn_id, cap.key, cap.amounts())
        if not request.settled:
            request = await self.broker.wait_in_turn(request, ctx.turn_id)
        if request.status != ApprovalStatus.APPROVED:
            why = {ApprovalStatus.DENIED: f"{request.decided_by or 'someone'} chose Stop",
                   ApprovalStatus.EXPIRED: "no admin chose Continue in time"}.get(request.status, "it was cancelled")
            raise BudgetExhausted(f"{_first(cap.describe())} and {why}, so I stopped here.")

    async def record(self, ctx: ToolContext, agent: str, model: str, reply: Completion, *, estimated_input: int,
                     estimated_output: int, thread: str | None) -> Spent:
        """Count one call now (and, with ``thread``, add it to that thread's budget in the same write)."""
        spent = self.spent(model, reply, estimated_input=estimated_input, estimated_output=estimated_output)
        await self.store.db.run_write(self._counting(ctx, agent, model, spent, thread))
        return spent

    def count(self, ctx: ToolContext, agent: str, model: str, reply: Completion, *, estimated_input: int,
              estimated_output: int, thread: str | None) -> Count:
        """The write that counts one call, for the transaction of the step it wrote (the runner's)."""
        spent = self.spent(model, reply, estimated_input=estimated_input, estimated_output=estimated_output)
        return self._counting(ctx, agent, model, spent, thread)

    def _counting(self, ctx: ToolContext, agent: str, model: str, spent: Spent,
                  thread: str | None) -> Count:
        key = UsageKey(_days(self.clock.now())[0], agent, person_of(ctx))
        if self.bus is not None and ctx.session is not None:  # /metrics: this process's counters
            self.bus.emit(ModelSpent(ctx.session, agent, model, spent.input_tokens, spent.output_tokens,
                                     None if spent.cost_micros is None else spent.cost_micros / 1e6))
        return self.store.adding(key, spent, thread=thread)

    def spent(self, model: str, reply: Completion, *, estimated_input: int, estimated_output: int) -> Spent:
        """The call's tokens: the endpoint's split, else its total split by our estimate of the answer, else our
        estimates; each clamped."""
        input_tokens, output_tokens = clamp(reply.input_tokens), clamp(reply.output_tokens)
        if not _believed(reply.input_tokens, reply.output_tokens):  # a request is never free: 0 would switch caps off
            input_tokens = output_tokens = None
        if input_tokens is None or output_tokens is None:
            total = clamp(reply.usage) if reply.usage is not None and reply.usage > 0 else None
            if output_tokens is None:
                output_tokens = min(estimated_output, total) if total is not None else clamp(estimated_output) or 0
            if input_tokens is None:
                input_tokens = max(0, total - output_tokens) if total is not None else clamp(estimated_input) or 0
        price = self.config.prices.get(model)
        return Spent(input_tokens, output_tokens, price.micros(input_tokens, output_tokens) if price else None)

    async def status(self, agent: str, person: str | None) -> str | None:
        """"agent ops today 1,234 tokens of 10,000; this month …" for ``/bot status``; None where no cap applies and
        nothing is priced (then there is nothing to hold the figures against)."""
        caps, mine = self._caps(agent), self.config.person
        if not (caps.any or mine.any or self.config.prices):
            return None
        day, month_start, _month = _days(self.clock.now())
        totals = await self.store.totals(day=day, month_start=month_start, agent=agent, person=person or NOBODY)
        priced = bool(self.config.prices)

        def shown(tokens: int, micros: int, token_cap: int | None, cost_cap: float | None) -> str:
            text = f"{tokens:,} tokens" + (f" of {token_cap:,}" if token_cap is not None else "")
            if priced:
                text += f", cost {micros / 1e6:,.4f}" + (f" of {cost_cap:,.4f}" if cost_cap is not None else "")
            return text

        today = shown(totals.agent_day_tokens, totals.agent_day_micros, caps.daily_tokens, caps.daily_cost)
        month = shown(totals.agent_month_tokens, totals.agent_month_micros, caps.monthly_tokens, caps.monthly_cost)
        parts = [f"agent {agent} today {today}", f"this month {month}"]
        if person is not None and mine.any:
            yours = shown(totals.person_day_tokens, totals.person_day_micros, mine.daily_tokens, mine.daily_cost)
            parts.append(f"you today {yours}")
        return "; ".join(parts)


def _believed(input_tokens: int | None, output_tokens: int | None) -> bool:
    """Whether an endpoint's split can be true: a request has at least one token, an answer none or more. Said
    otherwise (zero or negative: broken or hostile), both are put aside for the total or our estimates."""
    return (input_tokens is None or input_tokens > 0) and (output_tokens is None or output_tokens >= 0)


def _first(text: str) -> str:
    return text[:1].upper() + text[1:]
