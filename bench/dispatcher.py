"""Dispatcher figures (SPEC §15): overhead per turn with an instant model, and model calls saved by
steering and collecting.

    python -m bench.dispatcher --sessions 1000 --burst 5

1. Turns per second over N sessions (one message each, arriving together, instant provider), through
   the dispatcher (durable intake with group commit, batching, events) until the last turn's event,
   vs calling the agent runner directly on turns already taken, as a ratio.
2. Model calls for a busy turn plus a burst of M messages sent during it, per queue mode
   (followup = M+1; steer and collect should be 2 or fewer).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from bench.common import summary
from core.agents import Agent, AgentDirectory
from core.clock import SystemClock
from core.dispatcher import DispatchConfig, Dispatcher, build_dispatcher
from core.events import Event, EventBus, TurnFinished
from core.model import Inbound, MessageRef, QueueMode
from core.providers import Completion, CompletionRequest, ToolCall
from core.runner import AgentRunner
from core.store import ControlStore, ConversationStore, Database, InputStore
from core.tools import Risk, Tool, ToolRegistry


class InstantProvider:
    name = "instant"

    def __init__(self) -> None:
        self.calls = 0
        self.called = asyncio.Event()
        self.hold: asyncio.Event | None = None  # when set, the first call waits for it
        self.tool_step = True  # ...and then asks for a tool (else it answers at once)

    async def complete(self, request: CompletionRequest) -> Completion:
        self.calls += 1
        self.called.set()
        if self.hold is not None and self.calls == 1:
            await self.hold.wait()
            if self.tool_step:
                return Completion("", (ToolCall("t1", "noop", "{}"),))
        return Completion("ok")


async def _noop(_ctx: object, _args: object) -> str:
    return "done"


def _build(db: Database, provider: InstantProvider, mode: str, concurrency: int) -> Dispatcher:
    registry = ToolRegistry()
    registry.register(Tool("noop", "does nothing", {"type": "object"}, Risk.SAFE, _noop))  # type: ignore[arg-type]
    conversations = ConversationStore(db)
    return build_dispatcher(
        conversations, InputStore(db), ControlStore(db),
        AgentRunner(conversations, provider, registry, SystemClock()),
        AgentDirectory([Agent()]), EventBus(), SystemClock(),
        DispatchConfig(queue_mode=mode, debounce_s=0.05, max_concurrent_turns=concurrency),
    )


def _inbound(session: str, key: str, text: str = "hello") -> Inbound:
    return Inbound(session_id=session, channel="bench", sender="U1", text=text, addressed=True,
                   ref=MessageRef("C", key), idempotency_key=key)


async def overhead(sessions: int, home: Path) -> tuple[float, float]:
    db = Database(f"sqlite:///{home / 'dispatch.db'}")
    await db.migrate()
    dispatcher = _build(db, InstantProvider(), QueueMode.STEER, 8)
    finished, all_finished = 0, asyncio.Event()

    async def count(event: Event) -> None:
        nonlocal finished
        if isinstance(event, TurnFinished):
            finished += 1
            if finished == sessions:
                all_finished.set()

    dispatcher.bus.subscribe(count)
    await dispatcher.start()
    t0 = time.perf_counter()
    # The messages arrive together, as Slack's deliveries do (each accept is its own request); the end
    # is the last turn's event, not an outcome waiter per message (each would re-read every second).
    accepted = await asyncio.gather(*(dispatcher.accept(_inbound(f"bench:{i}", f"k{i}")) for i in range(sessions)))
    assert all(a.input_id is not None for a in accepted)
    await all_finished.wait()
    through_dispatcher = sessions / (time.perf_counter() - t0)
    await dispatcher.stop(1)

    # The baseline: the runner alone on turns already taken (no intake, no batching, no events).
    direct_db = Database(f"sqlite:///{home / 'direct.db'}")
    await direct_db.migrate()
    inputs, runner = InputStore(direct_db), _build(direct_db, InstantProvider(), QueueMode.STEER, 8).runner
    turns = []
    for i in range(sessions):
        await inputs.accept(_inbound(f"direct:{i}", f"k{i}"), kind="message", agent="default", refuse=None,
                            max_waiting=20, now=SystemClock().now())
        taken = await inputs.take_batch(f"direct:{i}", QueueMode.STEER, dispatcher.config.budget, SystemClock().now())
        assert taken is not None
        turns.append(taken.turn)
    slots = asyncio.Semaphore(8)

    async def run(turn: object) -> None:
        async with slots:
            await runner.run(turn, Agent())  # type: ignore[arg-type]

    t0 = time.perf_counter()
    await asyncio.gather(*(run(t) for t in turns))
    direct = sessions / (time.perf_counter() - t0)
    await db.close()
    await direct_db.close()
    return through_dispatcher, direct


async def burst(mode: str, messages: int, home: Path, *, tool_step: bool) -> int:
    db = Database(f"sqlite:///{home / f'burst-{mode}-{messages}-{tool_step}.db'}")
    await db.migrate()
    provider = InstantProvider()
    provider.hold = asyncio.Event()
    provider.tool_step = tool_step
    dispatcher = _build(db, provider, mode, 8)
    await dispatcher.start()
    first = await dispatcher.accept(_inbound("burst", "first", "busy work"))
    await provider.called.wait()
    more = [await dispatcher.accept(_inbound("burst", f"m{i}", f"message {i}")) for i in range(messages)]
    provider.hold.set()
    for item in [first, *more]:
        assert item.input_id is not None
        await dispatcher.outcome(item.input_id)
    await dispatcher.stop(1)
    await db.close()
    return provider.calls


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--burst", type=int, nargs="+", default=[3, 5, 10])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        ours, direct = await overhead(args.sessions, home)
        print(f"turns/s over {args.sessions} sessions, instant model:")
        print(f"  dispatcher {ours:8.1f}   runner alone {direct:8.1f}   ratio {ours / direct:.2f}x")
        summary(f"turns/s over {args.sessions} sessions (instant model)", ours, direct, "/s", ">= 0.5x")
        modes = (QueueMode.STEER, QueueMode.COLLECT, QueueMode.FOLLOWUP)
        for tool_step in (False, True):
            shape = "answers directly" if not tool_step else "makes one tool step (2 calls by itself)"
            print(f"model calls for a busy turn plus M messages sent during it; the busy turn {shape}:")
            print(f"  {'M':>4} {'steer':>6} {'collect':>8} {'followup':>9}")
            for m in args.burst:
                calls = [await burst(mode, m, home, tool_step=tool_step) for mode in modes]
                print(f"  {m:>4} {calls[0]:>6} {calls[1]:>8} {calls[2]:>9}")
                if not tool_step:
                    for mode, made in zip(("steer", "collect"), calls[:2], strict=True):
                        summary(f"model calls, busy turn + {m} messages, {mode}", made, calls[2], "calls",
                                "<= 2 (baseline: followup, M+1)")
        print("  (with a tool step, steer hands the messages to the running turn: no extra call; collect adds one"
              " merged turn; followup one turn per message)")


if __name__ == "__main__":
    asyncio.run(main())
