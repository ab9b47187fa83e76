"""In-process fakes for tests that drive core directly: held and flaky models, the noop tool, a clock
that can jump ahead, a deadline poll, and ``build_core()`` — core wired as the application wires it."""

from __future__ import annotations

import asyncio
import inspect
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any

from core.agents import Agent, AgentDirectory
from core.clock import Clock, SystemClock
from core.dispatcher import DispatchConfig, Dispatcher, build_dispatcher
from core.errors import ProviderError
from core.events import EventBus
from core.providers import Completion, CompletionRequest, Provider, ToolCall
from core.runner import AgentRunner
from core.store import ControlStore, ConversationStore, Database, InputStore, LeaseStore
from core.tools import Risk, Tool, ToolContext, ToolRegistry

# -- models -----------------------------------------------------------------------------------------


@dataclass
class HeldCall:
    request: CompletionRequest
    future: asyncio.Future[Completion]


class HeldProvider:
    """Each model call waits until the test answers it: with a final text, or with a step (one call
    of the noop tool). Calls are answered oldest first (``next_call``) or by index (``resolve``)."""

    name = "held"

    def __init__(self) -> None:
        self.pending: list[HeldCall] = []
        self._arrived = asyncio.Event()
        self._ids = itertools.count()

    async def complete(self, request: CompletionRequest) -> Completion:
        future: asyncio.Future[Completion] = asyncio.get_running_loop().create_future()
        self.pending.append(HeldCall(request, future))
        self._arrived.set()
        return await future

    async def next_call(self, timeout: float = 5.0) -> tuple[CompletionRequest, asyncio.Future[Completion]]:
        """The oldest call not yet taken, waiting for one to arrive."""
        async with asyncio.timeout(timeout):
            while not self.pending:
                self._arrived.clear()
                await self._arrived.wait()
        call = self.pending.pop(0)
        return call.request, call.future

    async def answer(self, text: str) -> CompletionRequest:
        request, future = await self.next_call()
        future.set_result(Completion(text))
        return request

    async def step(self) -> CompletionRequest:
        request, future = await self.next_call()
        future.set_result(self.tool_step())
        return request

    def resolve(self, index: int, *, step: bool) -> None:
        """Answer the call at ``index`` of ``pending`` (a cancelled one is only dropped)."""
        call = self.pending.pop(index)
        if not call.future.done():
            call.future.set_result(self.tool_step() if step else Completion("ok"))

    def tool_step(self) -> Completion:
        return Completion("", (ToolCall(f"t{next(self._ids)}", NOOP.name, "{}"),))


class FlakyProvider:
    """Raises the given errors, one per call, then answers."""

    name = "flaky"

    def __init__(self, errors: list[ProviderError], answer: str = "answer") -> None:
        self.errors = errors
        self.answer = answer
        self.calls = 0

    async def complete(self, request: CompletionRequest) -> Completion:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return Completion(content=self.answer)


# -- tools, time ------------------------------------------------------------------------------------


async def _noop(_ctx: ToolContext, _args: dict[str, Any]) -> str:
    return "done"


NOOP = Tool("noop", "does nothing", {"type": "object"}, Risk.SAFE, _noop)


def noop_tools() -> ToolRegistry:
    registry = ToolRegistry()
    registry.register(NOOP)
    return registry


class ShiftedClock:
    """Real time plus an offset the test moves forward: a timeout arrives without waiting for it,
    and everything that waits on real time (debounce, polls) still runs."""

    def __init__(self) -> None:
        self.offset = timedelta()

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset

    def jump_to(self, when: datetime) -> None:
        """From now on it is ``when`` (and time goes on from there)."""
        self.offset += when - self.now()

    @classmethod
    def at_a_minute_start(cls) -> ShiftedClock:
        """One second into the next minute: a test's per-minute rate windows are all one minute's."""
        shifted = cls()
        shifted.jump_to(shifted.now().replace(second=1, microsecond=0) + timedelta(minutes=1))
        return shifted


async def until(condition: Callable[[], object], timeout: float = 10.0, what: str = "") -> None:
    """Poll ``condition`` (a function, or a coroutine function) until it holds; fail saying ``what``
    once ``timeout`` seconds have passed."""
    try:
        async with asyncio.timeout(timeout):
            while True:
                held = condition()
                if inspect.isawaitable(held):
                    held = await held
                if held:
                    return
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"not within {timeout} s: {what or condition}") from None


# -- core, wired ------------------------------------------------------------------------------------


@dataclass
class Core:
    """Core's pieces, wired as bot/app.py wires them, without channels or an HTTP server."""

    db: Database
    conversations: ConversationStore
    inputs: InputStore
    control: ControlStore
    bus: EventBus
    clock: Clock
    tools: ToolRegistry
    agents: AgentDirectory
    runner: AgentRunner
    dispatcher: Dispatcher
    leases: LeaseStore | None = None
    _started: bool = field(default=False, repr=False)

    async def start(self) -> Core:
        await self.db.migrate()
        await self.dispatcher.start()
        self._started = True
        return self

    async def stop(self, drain_s: float = 0.5) -> None:
        if self._started:
            await self.dispatcher.stop(drain_s=drain_s)
        await self.db.close()

    async def __aenter__(self) -> Core:
        return await self.start()

    async def __aexit__(self, *_exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        await self.stop()


def build_core(
    database: str | Path, provider: Provider, *, clock: Clock | None = None, tools: ToolRegistry | None = None,
    agents: list[Agent] | None = None, leases: bool = False,
    conversations_class: type[ConversationStore] = ConversationStore, **config: Any,
) -> Core:
    """Core on ``database`` (a SQLAlchemy URL, or a SQLite file path) answered by ``provider``, with
    the noop tool and one default agent unless given. ``config``: DispatchConfig fields (debounce
    defaults to 10 ms). ``conversations_class``: a ConversationStore subclass that lets a test act at
    an exact point (e.g. right after the answer is saved). Nothing runs until ``await core.start()``."""
    db = Database(database if isinstance(database, str) else f"sqlite:///{database}")
    clock = clock or SystemClock()
    tools = tools or noop_tools()
    directory = AgentDirectory(agents or [Agent()])
    conversations = conversations_class(db)
    inputs, control = InputStore(db), ControlStore(db)
    bus = EventBus()
    runner = AgentRunner(conversations, provider, tools, clock)
    lease_store = LeaseStore(db) if leases else None
    dispatcher = build_dispatcher(conversations, inputs, control, runner, directory, bus, clock,
                                  DispatchConfig(**{"debounce_s": 0.01, **config}), leases=lease_store)
    return Core(db, conversations, inputs, control, bus, clock, tools, directory, runner, dispatcher, lease_store)
