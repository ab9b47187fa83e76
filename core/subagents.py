"""Sub-agents (SPEC §16): ``delegate(agent, task)`` runs another agent for the calling one.

- A sub-agent runs the named agent with its tools narrowed to those its parent may use, never ``delegate``
  (depth 1), in a reserved session ``sub:<parent session>:<n>`` with its own stored transcript
  (core.store.subagents). Its answer is the call's result (truncated and masked by the runner like any).
- It asks nobody: whatever would ask a person fails at once (core.tools.SUBAGENT_CANNOT_ASK); it acts for its
  parent's sender, at its parent's trust. Nothing is posted from its session.
- At most ``max_per_turn`` run at once per parent turn; the others wait for a slot. The runner runs a step's
  delegate calls together and cancels them with the turn: a stop reaches running sub-agents and waiters.
- A run a crash interrupted is never re-run: the parent is told (``recover``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

from core.agents import DELEGATE_TOOL, Agent, AgentDirectory
from core.clock import Clock
from core.errors import BudgetExhausted, ProviderError, StepLimitReached, ToolError
from core.model import TurnInfo, TurnStatus
from core.runner import AgentRunner
from core.store.subagents import INTERRUPTED, SubAgentStore
from core.tools import Risk, Tool, ToolContext

log = logging.getLogger(__name__)

SUBAGENT_CHANNEL = "subagent"  # no channel renders it: nothing is ever posted from a sub-agent's session
TIMEOUT_S = 1800.0  # one delegate call, waiting for its slot included
# Sub-agents one parent turn may run in all (one guest's mention must not fan out without end; several of a
# step's calls may pass this check together, at most MAX_SUBAGENTS_PER_TURN - 1 more).
MAX_RUNS_PER_TURN = 20
NOTE = ("\n\nYou are working as a sub-agent on one task for another agent, which reads your answer. Nobody can "
        "be asked anything from here (no approvals, credentials or connections): do what you can with your "
        "tools, then answer with what you found or did, and what you could not do.")
NO_ANSWER = "(the sub-agent gave no answer)"


@dataclass
class _Slots:
    semaphore: asyncio.Semaphore
    users: int = 0


class SubAgents:
    def __init__(self, runner: AgentRunner, agents: AgentDirectory, clock: Clock, *, max_per_turn: int = 4,
                 max_steps: int = 10, timeout_s: float = TIMEOUT_S) -> None:
        if max_per_turn < 1 or max_steps < 1:
            raise ValueError("max_per_turn and max_steps must be at least 1")
        self.runner = runner
        self.agents = agents
        self.clock = clock
        self.max_per_turn = max_per_turn  # MAX_SUBAGENTS_PER_TURN
        self.max_steps = max_steps  # SUBAGENT_MAX_STEPS
        self.timeout_s = timeout_s
        self.store = SubAgentStore(runner.store.db)
        self._slots: dict[int, _Slots] = {}  # per parent turn (a turn runs in one process at a time)

    def tool(self) -> Tool:
        listed = "; ".join(f"{a.name}: {_gist(a.instructions)}" for a in map(self.agents.get, self.agents.names()))
        return Tool(
            name=DELEGATE_TOOL,
            description=("Hand a self-contained task to another agent (a sub-agent) and get its answer back. It "
                         "works with its own tools (never more than yours), cannot ask anyone anything and cannot "
                         f"delegate further. Several calls in one step run together. Agents: {listed}"),
            parameters={
                "type": "object",
                "properties": {
                    "agent": {"type": "string", "minLength": 1, "maxLength": 64, "description": "the agent's name"},
                    "task": {"type": "string", "minLength": 1, "maxLength": 20_000,
                             "description": "everything it needs to know: it sees nothing of this conversation"},
                },
                "required": ["agent", "task"],
                "additionalProperties": False,
            },
            risk=Risk.SAFE,  # it only runs tools its parent may run, each through the same gate
            function=self._delegate,
            timeout_s=self.timeout_s + 60,  # a backstop: the call keeps its own time (below)
            recover=self._recover,
            explicit=True,  # offered to the default agent (core.agents) and to agents that name it
            concurrent=True,
        )

    # -- a call ---------------------------------------------------------------------------------

    async def _delegate(self, ctx: ToolContext, args: dict[str, Any]) -> str:
        name, task = str(args["agent"]).strip(), str(args["task"])
        if ctx.subagent:  # depth 1 (a sub-agent is never offered delegate: this is a second lock)
            raise ToolError("a sub-agent cannot delegate; return to the parent")
        target = self.agents.find(name)
        if target is None or name == ctx.agent:
            others = ", ".join(n for n in self.agents.names() if n != ctx.agent) or "none"
            what = "yourself" if name == ctx.agent else f"no agent named {name!r}"
            raise ToolError(f"cannot delegate to {what}; the agents available are: {others}")
        agent = replace(target, tools=self.slice(self.agents.get(ctx.agent), target),
                        instructions=target.instructions + NOTE)
        deadline = asyncio.timeout(self.timeout_s)
        try:
            async with deadline, self._slot(ctx.turn_id):
                ran = sum(1 for r in await self.store.runs(ctx.session_id) if r.parent_turn == ctx.turn_id)
                if ran >= MAX_RUNS_PER_TURN:
                    raise ToolError(f"this turn already ran {ran} sub-agents, the most one turn may; do the rest "
                                    "yourself, or answer with what you have")
                turn = await self.store.open(ctx.session_id, parent_turn=ctx.turn_id, call_id=ctx.call_id,
                                             agent=name, task=task, sender=ctx.sender, place=ctx.place,
                                             channel=SUBAGENT_CHANNEL, now=self.clock.now())
                log.info("sub-agent %s started in %s (turn %s) for turn %s", name, turn.session.id, turn.id,
                         ctx.turn_id)
                return await self._run(turn, agent, ctx, deadline)
        except TimeoutError:
            raise ToolError(f"the sub-agent {name} did not finish within {self.timeout_s:g} s") from None

    def slice(self, parent: Agent, target: Agent) -> tuple[str, ...]:
        """The sub-agent's tools: its own that its parent may also use, never delegate (depth 1)."""
        tools = self.runner.tools
        mine = {t.name for t in tools.allowed(target.tools)}
        theirs = {t.name for t in tools.allowed(parent.tools)}
        return tuple(sorted((mine & theirs) - {DELEGATE_TOOL}))

    async def _run(self, turn: TurnInfo, agent: Agent, parent: ToolContext, deadline: asyncio.Timeout) -> str:
        name = agent.name
        steps = agent.max_steps or self.max_steps  # its own ([[agents]] max_steps), else SUBAGENT_MAX_STEPS
        try:
            answer = await self.runner.run(turn, agent, save_answer=False, parent=parent, max_steps=steps)
        except asyncio.CancelledError:
            timed_out = deadline.expired()
            await self._end(turn.id, TurnStatus.FAILED if timed_out else TurnStatus.CANCELLED,
                            error="timed out" if timed_out else "stopped with its parent's turn")
            raise
        except StepLimitReached:
            await self._end(turn.id, TurnStatus.FAILED, error=f"used all {steps} steps")
            raise ToolError(f"the sub-agent {name} used all its {steps} steps "
                            f"({'its max_steps' if agent.max_steps else 'SUBAGENT_MAX_STEPS'}) "
                            "without finishing; give it a smaller task, or do it yourself") from None
        except BudgetExhausted as exc:
            await self._end(turn.id, TurnStatus.FAILED, error=str(exc))
            raise ToolError(str(exc)) from None
        except ProviderError as exc:
            await self._end(turn.id, TurnStatus.FAILED, error=exc.user_message)
            raise ToolError(f"the sub-agent {name} failed: {exc.user_message}") from None
        except Exception as exc:
            log.exception("sub-agent %s (turn %s) failed", name, turn.id)
            await self._end(turn.id, TurnStatus.FAILED, error=f"internal error ({type(exc).__name__})")
            raise
        await self._end(turn.id, TurnStatus.FINISHED, answer=answer)
        log.info("sub-agent %s finished (%s)", name, turn.session.id)
        return answer or NO_ANSWER

    async def _end(self, turn_id: int, status: TurnStatus, *, answer: str | None = None,
                   error: str | None = None) -> None:
        """Record how the run ended (with its answer in its transcript). Shielded: a stop or shutdown that
        cancels the parent again cannot cut the record short."""
        if error is not None:
            error = await self.runner.redact(error)
        # A switch to the fallback model that its answer carries (the thread's, stored in the same commit).
        switch = self.runner.unsaved_switch(turn_id)
        count = self.runner.uncounted(turn_id)
        write = self.runner.store.finish_turn(turn_id, status=status, answer=answer, error=error,
                                              now=self.clock.now(), answer_message=answer is not None,
                                              then=self.runner.models.unstored(switch) if switch else None,
                                              count=count)
        try:
            await asyncio.shield(write)
        except Exception:  # the end was not stored, the call was made: counted on its own
            self.runner.still_uncounted(turn_id, count)
            await self.runner.count_alone(turn_id)
            raise
        if switch is not None:
            self.runner.models.stored(switch)

    @asynccontextmanager
    async def _slot(self, turn_id: int) -> AsyncIterator[None]:
        """One of the parent turn's MAX_SUBAGENTS_PER_TURN slots (waiting, in order, while all are taken)."""
        slots = self._slots.get(turn_id)
        if slots is None:
            slots = self._slots[turn_id] = _Slots(asyncio.Semaphore(self.max_per_turn))
        slots.users += 1
        try:
            async with slots.semaphore:
                yield
        finally:
            slots.users -= 1
            if not slots.users:
                del self._slots[turn_id]

    # -- after a crash --------------------------------------------------------------------------

    async def _recover(self, ctx: ToolContext, args: dict[str, Any]) -> str:
        """A delegate call a crash left without result: never run again. Finished before the crash: its answer
        stands; otherwise its run is recorded as interrupted and the parent is told."""
        name = str(args.get("agent") or "?")
        run = await self.store.for_call(ctx.session_id, ctx.call_id, ctx.turn_id)
        if run is not None and run.status == TurnStatus.FINISHED:
            return run.answer or NO_ANSWER
        if run is not None and run.status in (TurnStatus.RUNNING, TurnStatus.QUEUED):
            await self._end(run.turn_id, TurnStatus.FAILED, error=INTERRUPTED)
        where = f" ({run.session_id})" if run is not None else ""
        log.info("sub-agent %s%s was interrupted by a restart; not re-run", name, where)
        return (f"error: the sub-agent {name}{where} was interrupted (the bot restarted) and was not re-run; what "
                "it did is unknown; delegate again if it is still needed, or continue without it")


def _gist(instructions: str) -> str:
    """The first sentence of an agent's instructions: what it is for, in the tool's description."""
    first = instructions.strip().split("\n", 1)[0].split(". ", 1)[0].strip()
    return first if len(first) <= 160 else first[:159] + "…"
