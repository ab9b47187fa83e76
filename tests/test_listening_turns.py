"""Core's side of listening (SPEC §17): an unaddressed message in a listening place starts a turn whose answer is
optional; a question someone asked is never folded into such a turn; a paused bot keeps them as context, telling
nobody. Driven in-process, with a model whose every call the test answers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from core.events import Event, Notice, TurnFinished
from core.listening import NO_REPLY
from core.model import Inbound, MessageRef
from core.providers import Completion, CompletionRequest
from core.store import AcceptOutcome
from tests.fakes.core import Core, HeldProvider, build_core, until


@pytest.fixture
async def model() -> HeldProvider:
    return HeldProvider()


@pytest.fixture
async def core(tmp_path: Path, model: HeldProvider) -> AsyncIterator[Core]:
    async with build_core(tmp_path / "bot.db", model, queue_mode="steer") as started:
        yield started


def heard(text: str, key: str, *, addressed: bool = False) -> Inbound:
    return Inbound(session_id="slack:T1:C1:1.0", channel="test", sender="U1", text=text, addressed=addressed,
                   ref=MessageRef("C1", key), idempotency_key=key, place="slack:T1:C1", listen_per_minute=6)


def tools_of(request: CompletionRequest) -> list[str]:
    return [tool["function"]["name"] for tool in request.tools]


async def test_a_question_asked_while_a_listening_turn_works_gets_a_turn_of_its_own(
        core: Core, model: HeldProvider) -> None:
    events: list[Event] = []

    async def seen(event: Event) -> None:
        events.append(event)

    core.bus.subscribe(seen)
    await core.dispatcher.accept(heard("the queue is growing", "a"))
    first, step = await model.next_call()
    assert NO_REPLY in tools_of(first) and "Nobody addressed you" in first.instructions
    await core.dispatcher.accept(heard("can you look at it?", "b", addressed=True))  # someone asks meanwhile...
    step.set_result(model.tool_step())  # ...and the listening turn reaches a tool step, where messages are steered in
    request, future = await model.next_call()
    assert "can you look at it?" not in str(request.messages)  # not steered into a turn that may stay silent
    future.set_result(Completion(""))  # the listening turn ends silently
    owed = await model.answer("It is the batch job.")
    assert NO_REPLY not in tools_of(owed) and "can you look at it?" in str(owed.messages)
    await until(lambda: sum(isinstance(e, TurnFinished) for e in events) == 2)
    silent, answered = [e for e in events if isinstance(e, TurnFinished)]
    assert silent.silent and silent.turn.answer_optional
    assert not answered.silent and answered.text == "It is the batch job." and not answered.turn.answer_optional


async def test_a_paused_bot_keeps_listening_messages_as_context_and_tells_nobody(core: Core) -> None:
    events: list[Event] = []

    async def seen(event: Event) -> None:
        events.append(event)

    core.bus.subscribe(seen)
    await core.control.set_intake_paused(True, datetime.now(UTC))
    accepted = await core.dispatcher.accept(heard("deploy started", "a"))
    assert accepted.outcome is AcceptOutcome.IGNORED  # a new conversation's context: nowhere to keep it
    refused = await core.dispatcher.accept(heard("what is up?", "b", addressed=True))
    assert refused.outcome is AcceptOutcome.REFUSED  # an addressed one is told, as ever
    await core.bus.drain(5)
    assert [e.text for e in events if isinstance(e, Notice)] == [refused.note]
