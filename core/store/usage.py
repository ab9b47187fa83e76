"""What model calls used, per UTC day, agent and person (spending caps, ``bot usage``): one row each, added to by an
upsert (exact on PostgreSQL too, where two replicas may count for the same agent at the same moment)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, case, func, or_, select, update
from sqlmodel import Session

from core.store.database import Database
from core.store.tables import SessionRow, UsageRow

usage = UsageRow.__table__  # type: ignore[attr-defined]
_sessions = SessionRow.__table__  # type: ignore[attr-defined]
# The thread budget's count (core.budget), written in the same transaction as the usage row.
_THREAD_SPEND = update(_sessions).where(_sessions.c.id == bindparam("b_session")).values(
    tokens_used=_sessions.c.tokens_used + bindparam("b_tokens"))


@dataclass(frozen=True)
class Count:
    """One model call's count: a write for a transaction that writes more (called with its session), or, on
    PostgreSQL with no thread budget to add to, a part of the turn end's own statement (``params(prefix)``,
    ``core.store.statements.turn_end``): a turn's last call is counted in the commit that ends it, no trip more."""

    statement: Any
    values: dict[str, Any]
    thread: str | None  # the thread whose budget it also adds to (core.budget)
    tokens: int

    def __call__(self, s: Session) -> None:
        conn = s.connection()
        if self.thread is not None:
            conn.execute(_THREAD_SPEND, {"b_session": self.thread, "b_tokens": self.tokens})
        conn.execute(self.statement, self.values)

    @property
    def foldable(self) -> bool:
        return self.thread is None

    def params(self, prefix: str) -> dict[str, Any]:
        return {f"{prefix}{name}": value for name, value in self.values.items()}


@dataclass(frozen=True)
class UsageKey:
    day: str  # "2026-12-05" (UTC)
    agent: str
    person: str  # the turn's requester, or NOBODY


@dataclass(frozen=True)
class Spent:
    """One call's share: tokens as counted (clamped), its cost in millionths (None: its model has no price)."""

    input_tokens: int
    output_tokens: int
    cost_micros: int | None

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True)
class Totals:
    """What is counted against the caps of one call: the agent's today and this month, the person's today."""

    agent_day_tokens: int = 0
    agent_month_tokens: int = 0
    agent_day_micros: int = 0
    agent_month_micros: int = 0
    person_day_tokens: int = 0
    person_day_micros: int = 0


@dataclass(frozen=True)
class UsageLine:
    day: str
    agent: str
    person: str
    calls: int
    input_tokens: int
    output_tokens: int
    cost_micros: int
    unpriced_calls: int


class UsageStore:
    def __init__(self, db: Database) -> None:
        self.db = db
        added = db.insert(usage).values(
            day=bindparam("day"), agent=bindparam("agent"), person=bindparam("person"), calls=1,
            input_tokens=bindparam("input_tokens"), output_tokens=bindparam("output_tokens"),
            cost_micros=bindparam("cost_micros"), unpriced_calls=bindparam("unpriced"))
        self._add = added.on_conflict_do_update(
            index_elements=[usage.c.day, usage.c.agent, usage.c.person],
            set_={"calls": usage.c.calls + 1,
                  "input_tokens": usage.c.input_tokens + added.excluded.input_tokens,
                  "output_tokens": usage.c.output_tokens + added.excluded.output_tokens,
                  "cost_micros": usage.c.cost_micros + added.excluded.cost_micros,
                  "unpriced_calls": usage.c.unpriced_calls + added.excluded.unpriced_calls})

    async def add(self, key: UsageKey, spent: Spent, *, thread: str | None = None) -> None:
        await self.db.run_write(self.adding(key, spent, thread=thread))

    def adding(self, key: UsageKey, spent: Spent, *, thread: str | None = None) -> Count:
        """The write that counts one call under ``key`` (for a transaction that writes more: the step's message);
        ``thread``: it also adds the call's tokens to that thread's budget count."""
        params = {"day": key.day, "agent": key.agent, "person": key.person, "input_tokens": spent.input_tokens,
                  "output_tokens": spent.output_tokens, "cost_micros": spent.cost_micros or 0,
                  "unpriced": 1 if spent.cost_micros is None else 0}
        return Count(self._add, params, thread, spent.tokens)

    async def totals(self, *, day: str, month_start: str, agent: str, person: str) -> Totals:
        """The agent's and the person's sums that the caps compare against, in one query."""
        tokens = usage.c.input_tokens + usage.c.output_tokens
        today, mine, theirs = usage.c.day == day, usage.c.agent == agent, usage.c.person == person

        def total(value: Any, where: Any) -> Any:
            return func.coalesce(func.sum(case((where, value), else_=0)), 0)

        query = select(total(tokens, today & mine), total(tokens, mine),
                       total(usage.c.cost_micros, today & mine), total(usage.c.cost_micros, mine),
                       total(tokens, today & theirs), total(usage.c.cost_micros, today & theirs)
                       ).where(usage.c.day >= month_start, usage.c.day <= day, or_(mine, theirs))
        async with self.db.read() as s:
            row = (await s.exec(query)).one()  # type: ignore[call-overload]
        return Totals(*(int(value or 0) for value in row))

    async def lines(self, *, since: str, agent: str | None = None, person: str | None = None) -> list[UsageLine]:
        """Every row from ``since`` (a day), newest day first."""
        query = select(usage).where(usage.c.day >= since)
        if agent is not None:
            query = query.where(usage.c.agent == agent)
        if person is not None:
            query = query.where(usage.c.person == person)
        query = query.order_by(usage.c.day.desc(), usage.c.agent, usage.c.person)
        async with self.db.read() as s:
            rows = (await s.exec(query)).all()  # type: ignore[call-overload]
        return [UsageLine(r.day, r.agent, r.person, int(r.calls), int(r.input_tokens), int(r.output_tokens),
                          int(r.cost_micros), int(r.unpriced_calls)) for r in rows]
