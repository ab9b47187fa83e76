"""The per-thread token budget (THREAD_TOKEN_BUDGET, SPEC §16).

Each model call's tokens (the provider's usage figures, else an estimate) are added to the thread's count.
Before a model call, a thread at or past its allowance parks its turn on a request with **Continue** and
**Stop**: the same durable park as an approval (the request is in the database, its buttons work after a
restart, it expires), decided by those who decide the thread's approvals. Continue adds one budget, exactly
once; Stop, expiry or a stop of the turn end the turn and say why. Where nobody can be asked (a call context
that is not interactive), the turn ends at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.errors import BudgetExhausted
from core.model import BUDGET_RISK, ApprovalStatus, thread_of
from core.store.budgets import BudgetStore
from core.tools import SUBAGENT_CANNOT_ASK, ToolContext

if TYPE_CHECKING:
    from core.approvals import ApprovalBroker

BUDGET_TOOL = "thread_budget"  # what a budget park is filed under (its card has Continue and Stop)


class ThreadBudget:
    def __init__(self, tokens: int | None, store: BudgetStore, broker: ApprovalBroker | None) -> None:
        self.tokens = tokens  # None: no budget (nothing is counted)
        self.store = store
        self.broker = broker

    @property
    def enabled(self) -> bool:
        return self.tokens is not None

    async def spend(self, session_id: str, tokens: int) -> None:
        if self.tokens is not None:
            await self.store.spend(thread_of(session_id), tokens)  # a sub-agent spends its parent thread's

    async def status(self, session_id: str) -> str | None:
        """"12,345 of 100,000 tokens used" for ``/bot status`` in a thread; None without a budget."""
        if self.tokens is None:
            return None
        used, allowance = await self.store.usage(session_id)
        return f"{used:,} of {allowance or self.tokens:,} tokens of its budget used"

    async def before_call(self, ctx: ToolContext) -> None:
        """Park the turn while the thread is at or past its allowance; return once it may go on."""
        if self.tokens is None:
            return
        used, allowance = await self.store.usage(thread_of(ctx.session_id))
        allowance = allowance or self.tokens
        while used >= allowance:
            if ctx.subagent:  # its parent parks on Continue at its own next call, if it must
                raise BudgetExhausted(f"This thread used its token budget ({used:,} of {allowance:,} tokens); "
                                      f"{SUBAGENT_CANNOT_ASK}.")
            if self.broker is None or not ctx.interactive:
                raise BudgetExhausted(f"This thread used its token budget ({used:,} of {allowance:,} tokens), and "
                                      "nobody can be asked to continue here, so I stopped.")
            call_id = f"budget:{ctx.turn_id}:{allowance}"  # one request per budget: a restart finds it again
            request = await self.broker.for_call(ctx.session_id, call_id)
            if request is None:
                request = await self.broker.request(
                    session_id=ctx.session_id, turn_id=ctx.turn_id, call_id=call_id, tool=BUDGET_TOOL,
                    args={"used": used, "budget": allowance, "more": self.tokens}, agent=ctx.agent,
                    place=ctx.place, requester=ctx.requester, risk=BUDGET_RISK)
            if not request.settled:
                request = await self.broker.wait_in_turn(request, ctx.turn_id)
            if request.status != ApprovalStatus.APPROVED:
                why = {ApprovalStatus.DENIED: f"{request.decided_by or 'someone'} chose Stop",
                       ApprovalStatus.EXPIRED: "nobody chose Continue in time"}.get(request.status, "it was cancelled")
                raise BudgetExhausted(f"This thread used its token budget ({used:,} of {allowance:,} tokens) and "
                                      f"{why}, so I stopped here.")
            await self.store.extend(ctx.session_id, was=allowance, now=allowance + self.tokens, base=self.tokens)
            used, raised = await self.store.usage(ctx.session_id)
            allowance = raised or self.tokens
