"""The dispatcher's races, driven in-process with a model whose every call the test answers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from core.clock import SystemClock
from core.dispatcher import Dispatcher
from core.errors import InvalidInput
from core.events import Event, TurnFinished
from core.model import Inbound, MessageRef
from core.providers import Completion
from core.store import Accepted, ConversationStore, InputStore
from tests.fakes.core import Core, HeldProvider, build_core, until


@pytest.fixture
async def model() -> HeldProvider:
    return HeldProvider()


@pytest.fixture
async def core(tmp_path: Path, model: HeldProvider, request: pytest.FixtureRequest) -> AsyncIterator[Core]:
    options: dict[str, Any] = {"queue_mode": "steer", **getattr(request, "param", {})}
    async with build_core(tmp_path / "bot.db", model, outcome_poll_s=0.05, **options) as started:
        yield started


@pytest.fixture
async def dispatcher(core: Core) -> Dispatcher:
    return core.dispatcher


def msg(text: str, key: str, session: str = "s:1") -> Inbound:
    return Inbound(session_id=session, channel="test", sender="U1", text=text, addressed=True,
                   ref=MessageRef("C", key), idempotency_key=key)


async def _history(core: Core, session: str = "s:1") -> list[str]:
    return [e.content for e in await core.conversations.history(session)]


async def test_an_accepted_input_ends_with_its_answer(dispatcher: Dispatcher, model: HeldProvider) -> None:
    accepted = await dispatcher.accept(msg("hi", "a"))
    await model.answer("hello")
    assert accepted.input_id is not None
    outcome = await dispatcher.outcome(accepted.input_id)
    assert (outcome.status, outcome.text) == ("answered", "hello")


async def test_a_stopped_input_that_never_started_leaves_no_trace(
    core: Core, dispatcher: Dispatcher, model: HeldProvider
) -> None:
    first = await dispatcher.accept(msg("busy", "a"))
    _request, held = await model.next_call()
    second = await dispatcher.accept(msg("never mind", "b"))  # waits behind the running turn
    report = await dispatcher.cancel("s:1", by="U1")
    assert (report.running, report.waiting) == (True, 1)
    assert first.input_id is not None and second.input_id is not None
    assert (await dispatcher.outcome(second.input_id)).status == "cancelled"
    assert (await dispatcher.outcome(first.input_id)).status == "cancelled"
    assert held.cancelled()  # the model call was abandoned at its await
    assert await _history(core) == ["busy", "(stopped by U1)"]  # "never mind" was never written


@pytest.mark.parametrize("core", [{"queue_mode": "collect"}], indirect=True)
async def test_stop_ends_a_merged_turn_and_every_input_in_it(
    core: Core, dispatcher: Dispatcher, model: HeldProvider
) -> None:
    first = await dispatcher.accept(msg("busy", "a"))
    await model.step()  # the first turn is at a tool step; the next two wait and merge
    b = await dispatcher.accept(msg("one", "b"))
    c = await dispatcher.accept(msg("two", "c"))
    await model.answer("first done")
    request, held = await model.next_call()  # the merged turn
    assert request.messages[-1].content == "one\n\ntwo"
    assert b.input_id and c.input_id and first.input_id
    report = await dispatcher.cancel("s:1", by="U1")
    assert (report.running, report.waiting) == (True, 0)
    assert (await dispatcher.outcome(b.input_id)).status == "cancelled"
    assert (await dispatcher.outcome(c.input_id)).status == "cancelled"
    assert held.cancelled()
    assert (await dispatcher.outcome(first.input_id)).text == "first done"


async def test_a_turns_end_carries_every_input_it_took_steered_ones_too(
    core: Core, dispatcher: Dispatcher, model: HeldProvider
) -> None:
    """A turn that took nothing at its tool steps ends with the inputs it started with (not read again at its
    end); one that took a message in at a step ends with that one too."""
    finished: list[TurnFinished] = []

    async def seen(event: Event) -> None:
        if isinstance(event, TurnFinished):
            finished.append(event)

    core.bus.subscribe(seen)
    first = await dispatcher.accept(msg("busy", "a"))
    _request, held = await model.next_call()
    second = await dispatcher.accept(msg("and this", "b"))  # waits: taken in at the next tool step
    held.set_result(model.tool_step())
    steered = await model.answer("both done")
    assert "and this" in str(steered.messages)
    third = await dispatcher.accept(msg("later", "c"))
    await model.answer("done too")
    await until(lambda: len(finished) == 2)
    assert [e.turn.input_ids for e in finished] == [(first.input_id, second.input_id), (third.input_id,)]
    assert [e.turn.inputs for e in finished] == [(MessageRef("C", "a"), MessageRef("C", "b")), (MessageRef("C", "c"),)]
    assert all(e.turn.session.status == "idle" for e in finished)  # the session as the end left it


class _PauseAfterAnswer(ConversationStore):
    """The real store; when a turn with an answer comes to be finished (the answer and the turn's end are
    written in one commit), it waits here until released."""

    finishing = asyncio.Event()
    release = asyncio.Event()

    async def finish_turn(self, turn_id: int, **kwargs: Any) -> Any:
        if kwargs.get("answer") is not None:
            type(self).finishing.set()
            await type(self).release.wait()
        return await super().finish_turn(turn_id, **kwargs)


async def test_a_stop_after_the_model_answered_keeps_the_answer(tmp_path: Path) -> None:
    model = HeldProvider()
    _PauseAfterAnswer.finishing, _PauseAfterAnswer.release = asyncio.Event(), asyncio.Event()
    async with build_core(tmp_path / "bot.db", model, conversations_class=_PauseAfterAnswer) as core:
        accepted = await core.dispatcher.accept(msg("quick", "a"))
        await model.answer("made it")
        await asyncio.wait_for(_PauseAfterAnswer.finishing.wait(), 5)  # answered, and the turn not finished yet
        report = await core.dispatcher.cancel("s:1", by="U1")
        assert report.running  # the stop did land on the running turn...
        _PauseAfterAnswer.release.set()
        assert accepted.input_id is not None
        outcome = await core.dispatcher.outcome(accepted.input_id)
        assert (outcome.status, outcome.text) == ("answered", "made it")  # ...and lost to the answer
        assert await _history(core) == ["quick", "made it"]  # one outcome, and the transcript agrees


async def _stop(dispatcher: Dispatcher, accepted: Accepted, held: asyncio.Future[Completion]) -> tuple[str, str]:
    """U1 stops the thread while its model call is held: the call is cancelled; the input's outcome."""
    await dispatcher.cancel("s:1", by="U1")
    assert accepted.input_id is not None
    outcome = await dispatcher.outcome(accepted.input_id)
    assert held.cancelled()
    return outcome.status, outcome.text


async def test_a_stop_keeps_an_answer_the_transcript_already_holds(
    core: Core, dispatcher: Dispatcher, model: HeldProvider
) -> None:
    """A turn whose runner stored its final answer itself (as before answers were stored with the turn's
    end), resumed and stopped: the stored answer is the outcome, and it is not stored twice."""
    accepted = await dispatcher.accept(msg("quick", "a"))
    _request, held = await model.next_call()
    turn_id = await core.conversations.running_turn("s:1")
    assert turn_id is not None
    await core.conversations.add_message("s:1", role="assistant", content="answered before", turn_id=turn_id,
                                         now=SystemClock().now())
    assert await _stop(dispatcher, accepted, held) == ("answered", "answered before")
    assert await _history(core) == ["quick", "answered before"]


async def test_a_stop_before_the_answer_wins(core: Core, dispatcher: Dispatcher, model: HeldProvider) -> None:
    accepted = await dispatcher.accept(msg("slow", "a"))
    _request, held = await model.next_call()
    assert await _stop(dispatcher, accepted, held) == ("cancelled", "stopped by U1")
    assert await _history(core) == ["slow", "(stopped by U1)"]


async def test_a_message_arriving_as_the_turn_finishes_is_answered_next(
    dispatcher: Dispatcher, model: HeldProvider
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


async def test_a_repeat_naming_another_agent_is_refused(dispatcher: Dispatcher, model: HeldProvider) -> None:
    accepted = await dispatcher.accept(msg("hi", "a"))
    await model.answer("hello")
    assert accepted.input_id is not None
    await dispatcher.outcome(accepted.input_id)
    other = Inbound(session_id="s:1", channel="test", sender="U1", text="hi", addressed=True,
                    ref=MessageRef("C", "a"), idempotency_key="a", agent="ops")
    with pytest.raises(InvalidInput, match="belongs to agent 'default'"):
        await dispatcher.accept(other)


async def test_reserved_session_ids_cannot_be_named(dispatcher: Dispatcher) -> None:
    with pytest.raises(InvalidInput, match="reserved"):
        await dispatcher.accept(msg("hi", "a", session="schedule:1:1"))


async def test_an_outcome_recorded_by_another_replica_wakes_the_waiter(dispatcher: Dispatcher) -> None:
    """Another process (a replica) takes and settles an input: this one's waiter sees it by re-reading."""
    other = InputStore(dispatcher.inputs.db)  # the other replica's store: it wakes nobody here
    accepted = await other.accept(msg("hello", "r1"), kind="message", agent="default", refuse=None, max_waiting=20,
                                  now=SystemClock().now())
    assert accepted.input_id is not None
    waiter = asyncio.create_task(dispatcher.outcome(accepted.input_id))
    await asyncio.sleep(0)  # the waiter has read the input: still waiting
    assert not waiter.done()
    assert await other.cancel_waiting("s:1", "stopped by U2 elsewhere") == [accepted.input_id]
    async with asyncio.timeout(5):
        outcome = await waiter
    assert (outcome.status, outcome.text) == ("cancelled", "stopped by U2 elsewhere")


async def test_with_leases_a_turn_holds_its_session_and_gives_it_back_when_nothing_waits(
    tmp_path: Path, model: HeldProvider, database_url: str | None
) -> None:
    """Several replicas (on PostgreSQL with TEST_DATABASE_URL): the lease is taken with the turn's start and
    given back with its end, unless a message another replica accepted meanwhile waits (that wakes no driver
    here): then it is kept, and that message is this driver's next turn."""
    async with build_core(database_url or tmp_path / "bot.db", model, leases=True, queue_mode="followup",
                          outcome_poll_s=0.05) as core:
        assert core.leases is not None
        name, dispatcher = "session:s:1", core.dispatcher
        first = await dispatcher.accept(msg("first", "a"))
        _request, held = await model.next_call()
        assert await core.leases.live_holders([name], SystemClock().now()) == {name}
        other = InputStore(core.db)  # the other replica's store
        second = await other.accept(msg("second", "b"), kind="message", agent="default", refuse=None,
                                    max_waiting=20, now=SystemClock().now())
        held.set_result(Completion("one"))
        request = await model.answer("two")
        assert request.messages[-1].content == "second"
        assert first.input_id and second.input_id
        assert (await dispatcher.outcome(second.input_id)).text == "two"
        async with asyncio.timeout(5):
            while dispatcher.turns.count:
                await asyncio.sleep(0.01)
        assert await core.leases.live_holders([name], SystemClock().now()) == set()
        # A third replica may take the session now, at once.
        assert await core.leases.acquire(name, "elsewhere", timedelta(seconds=30), SystemClock().now())


async def test_a_heartbeat_that_cannot_reach_the_database_gives_the_turn_up_before_its_lease_runs_out(
    tmp_path: Path
) -> None:
    """Renewing fails (the database restarting): retried, but once the lease may have run out the turn is
    stopped, since another replica may take the session from then on."""
    from core.leasing import SessionLeases
    from core.store import Database, LeaseStore

    class Unreachable(LeaseStore):
        async def renew(self, *_args: Any, **_kwargs: Any) -> bool:
            raise ConnectionError("the database is restarting")

    db = Database(f"sqlite:///{tmp_path}/x.db")
    try:
        leases = SessionLeases(Unreachable(db), SystemClock(), ttl_s=0.9)
        lost = asyncio.Event()
        started = asyncio.get_running_loop().time()
        heartbeat = asyncio.create_task(leases.heartbeat("s:1", lost.set))
        async with asyncio.timeout(2):
            await lost.wait()
        assert 0.6 <= asyncio.get_running_loop().time() - started < 0.9  # before the lease's 0.9 s ran out
        await heartbeat
    finally:
        await db.close()
