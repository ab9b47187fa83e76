"""The dispatcher's races, driven in-process with a model whose every call the test answers."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from core.agents import Agent, AgentDirectory
from core.clock import SystemClock
from core.dispatcher import DispatchConfig, Dispatcher
from core.events import EventBus
from core.model import Inbound, MessageRef
from core.providers import Completion, CompletionRequest, ToolCall
from core.runner import AgentRunner
from core.store import ControlStore, ConversationStore, Database, InputStore
from core.tools import Risk, Tool, ToolRegistry


class HeldModel:
    name = "held"

    def __init__(self) -> None:
        self.calls: asyncio.Queue[tuple[CompletionRequest, asyncio.Future[Completion]]] = asyncio.Queue()
        self.ids = itertools.count()

    async def complete(self, request: CompletionRequest) -> Completion:
        future: asyncio.Future[Completion] = asyncio.get_running_loop().create_future()
        await self.calls.put((request, future))
        return await future

    async def next_call(self) -> tuple[CompletionRequest, asyncio.Future[Completion]]:
        return await asyncio.wait_for(self.calls.get(), 5)

    async def answer(self, text: str) -> CompletionRequest:
        request, future = await self.next_call()
        future.set_result(Completion(text))
        return request

    async def step(self) -> CompletionRequest:
        request, future = await self.next_call()
        future.set_result(Completion("", (ToolCall(f"t{next(self.ids)}", "noop", "{}"),)))
        return request


async def _noop(_ctx: object, _args: object) -> str:
    return "done"


@pytest.fixture
async def model() -> HeldModel:
    return HeldModel()


@pytest.fixture
async def dispatcher(tmp_path: Path, model: HeldModel, request: pytest.FixtureRequest) -> AsyncIterator[Dispatcher]:
    mode = getattr(request, "param", "steer")
    db = Database(f"sqlite:///{tmp_path / 'bot.db'}")
    await db.migrate()
    tools = ToolRegistry()
    tools.register(Tool("noop", "does nothing", {"type": "object"}, Risk.SAFE, _noop))  # type: ignore[arg-type]
    conversations = ConversationStore(db)
    d = Dispatcher(conversations, InputStore(db), ControlStore(db),
                   AgentRunner(conversations, model, tools, SystemClock()), AgentDirectory([Agent()]), EventBus(),
                   SystemClock(), DispatchConfig(queue_mode=mode, debounce_s=0.01))
    await d.start()
    yield d
    await d.stop(drain_s=0.5)
    await db.close()


def msg(text: str, key: str, session: str = "s:1") -> Inbound:
    return Inbound(session_id=session, channel="test", sender="U1", text=text, addressed=True,
                   ref=MessageRef("C", key), idempotency_key=key)


async def test_dispatch_returns_the_outcome(dispatcher: Dispatcher, model: HeldModel) -> None:
    task = asyncio.create_task(dispatcher.dispatch(msg("hi", "a")))
    await model.answer("hello")
    outcome = await task
    assert (outcome.status, outcome.text) == ("answered", "hello")


async def test_a_cancelled_input_that_never_started_leaves_no_trace(dispatcher: Dispatcher, model: HeldModel) -> None:
    first = asyncio.create_task(dispatcher.dispatch(msg("busy", "a")))
    _request, held = await model.next_call()
    signal = asyncio.Event()
    second = asyncio.create_task(dispatcher.dispatch(msg("never mind", "b"), cancel=signal))
    await asyncio.sleep(0.05)
    signal.set()
    assert (await second).status == "cancelled"
    held.set_result(Completion("done"))
    assert (await first).text == "done"
    history = await dispatcher.history("s:1")
    assert [e.content for e in history] == ["busy", "done"]


@pytest.mark.parametrize("dispatcher", ["collect"], indirect=True)
async def test_a_merged_turn_stops_only_when_every_input_is_cancelled(
    dispatcher: Dispatcher, model: HeldModel
) -> None:
    first = await dispatcher.accept(msg("busy", "a"))
    await model.step()  # the first turn is at a tool step; the next two wait and merge
    b = await dispatcher.accept(msg("one", "b"))
    c = await dispatcher.accept(msg("two", "c"))
    await model.answer("first done")
    request, held = await model.next_call()  # the merged turn
    assert request.messages[-1].content == "one\n\ntwo"
    assert b.input_id and c.input_id and first.input_id
    await dispatcher.cancel_input(b.input_id, by="U1")
    await asyncio.sleep(0.02)
    assert not held.cancelled()  # c still wants an answer
    await dispatcher.cancel_input(c.input_id, by="U1")
    await asyncio.sleep(0.02)
    assert held.cancelled()  # nobody is left: the turn stopped at its await
    assert (await dispatcher.outcome(b.input_id)).status == "cancelled"
    assert (await dispatcher.outcome(c.input_id)).status == "cancelled"
    assert (await dispatcher.outcome(first.input_id)).text == "first done"


async def test_stop_racing_the_answer_keeps_the_answer(dispatcher: Dispatcher, model: HeldModel) -> None:
    accepted = await dispatcher.accept(msg("quick", "a"))
    _request, held = await model.next_call()
    held.set_result(Completion("made it"))
    await dispatcher.cancel("s:1", by="U1")  # lands while the answer is being saved, or after
    assert accepted.input_id is not None
    outcome = await dispatcher.outcome(accepted.input_id)
    assert outcome.status in ("answered", "cancelled")
    history = [e.content for e in await dispatcher.history("s:1")]
    if outcome.status == "answered":
        assert history == ["quick", "made it"]  # one outcome, and the transcript agrees with it
    else:
        assert history[-1].startswith("(stopped by")


async def test_a_message_arriving_as_the_turn_finishes_is_answered_next(
    dispatcher: Dispatcher, model: HeldModel
) -> None:
    first = await dispatcher.accept(msg("first", "a"))
    _request, held = await model.next_call()
    held.set_result(Completion("one"))
    second = await dispatcher.accept(msg("second", "b"))  # races the first turn's end
    request = await model.answer("two")
    assert request.messages[-1].content == "second"
    assert first.input_id and second.input_id
    assert (await dispatcher.outcome(first.input_id)).text == "one"
    assert (await dispatcher.outcome(second.input_id)).text == "two"


async def test_a_repeat_naming_another_agent_is_refused(dispatcher: Dispatcher, model: HeldModel) -> None:
    task = asyncio.create_task(dispatcher.dispatch(msg("hi", "a")))
    await model.answer("hello")
    await task
    from core.errors import InvalidInput

    other = Inbound(session_id="s:1", channel="test", sender="U1", text="hi", addressed=True,
                    ref=MessageRef("C", "a"), idempotency_key="a", agent="ops")
    with pytest.raises(InvalidInput, match="belongs to agent 'default'"):
        await dispatcher.accept(other)


async def test_reserved_session_ids_cannot_be_named(dispatcher: Dispatcher) -> None:
    from core.errors import InvalidInput

    with pytest.raises(InvalidInput, match="reserved"):
        await dispatcher.accept(msg("hi", "a", session="schedule:1:1"))
