"""An outside read of issue 40's merges (and issue 39's second lever): where the merged branches meet. A turn's last
model call is counted in the commit that ends it (core.runner ``uncounted``): once, whatever way the turn ends; on
SQLite and on PostgreSQL (TEST_DATABASE_URL)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import select

from core.listening import NO_REPLY
from core.model import TurnStatus
from core.store.tables import SessionRow, TurnRow
from core.store.usage import UsageStore
from tests.conftest import GatewayClient
from tests.fakes.core import ShiftedClock
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import mention, message

NOW = datetime(2026, 12, 15, 10, 0, tzinfo=UTC)
TODAY = "2026-12-15"


@pytest.fixture
def clock() -> ShiftedClock:
    shifted = ShiftedClock()
    shifted.jump_to(NOW)
    return shifted


async def _start(make_settings: Any, start_gateway: Any, tmp_path: Path, clock: ShiftedClock, toml: str = "",
                 **settings: Any) -> GatewayClient:
    config = tmp_path / "bot.toml"
    config.write_text(toml, encoding="utf-8")
    gateway: GatewayClient = await start_gateway(make_settings(bot_config=config, **settings), clock=clock)
    return gateway


async def _calls(gateway: GatewayClient) -> dict[tuple[str, str], int]:
    return {(line.agent, line.person): line.calls for line in await UsageStore(gateway.app.db).lines(since=TODAY)}


async def _turns(gateway: GatewayClient) -> list[TurnRow]:
    async with gateway.app.db.read() as s:
        return list((await s.exec(select(TurnRow).order_by(TurnRow.id))).all())  # type: ignore[arg-type]


async def _until_ended(gateway: GatewayClient) -> None:
    async with asyncio.timeout(10):
        while not (rows := await _turns(gateway)) or rows[-1].status == TurnStatus.RUNNING:
            await asyncio.sleep(0.02)
    await gateway.idle()


async def test_a_listening_turn_that_stays_silent_counts_its_call_once(
    make_settings: Any, start_gateway: Any, tmp_path: Path, clock: ShiftedClock, fake_slack: FakeSlack,
    fake_llm: FakeLLM,
) -> None:
    gateway = await _start(make_settings, start_gateway, tmp_path, clock, '[slack]\nlisten_channels = ["#ops"]\n')
    fake_llm.then(Reply(tool_calls=[(NO_REPLY, {})]))
    await gateway.send_event(message("api latency is up again", channel="COPS"))
    await _until_ended(gateway)
    fake_llm.then(Reply(""))  # silent by an empty answer: the turn's end carries its count
    await gateway.send_event(message("and again", channel="COPS"))
    await _until_ended(gateway)
    assert len(fake_llm.requests) == 2 and fake_slack.of("chat.postMessage") == []
    assert await _calls(gateway) == {("default", "U1"): 2}


async def test_with_a_thread_budget_the_last_call_counts_once_in_usage_and_in_the_budget(
    make_settings: Any, start_gateway: Any, tmp_path: Path, clock: ShiftedClock, fake_slack: FakeSlack,
    fake_llm: FakeLLM,
) -> None:
    """A thread budget's count is not folded into the end's one statement (PostgreSQL): a write of its transaction."""
    gateway = await _start(make_settings, start_gateway, tmp_path, clock, thread_token_budget=100_000)
    fake_llm.then(Reply("first"))
    await gateway.send_event(mention("hello"))
    await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()
    assert await _calls(gateway) == {("default", "U1"): 1}
    [line] = await UsageStore(gateway.app.db).lines(since=TODAY)
    async with gateway.app.db.read() as s:
        [session] = (await s.exec(select(SessionRow))).all()
    assert session.tokens_used == line.input_tokens + line.output_tokens > 0


async def test_a_turn_whose_end_could_not_be_stored_still_counts_its_last_call(
    make_settings: Any, start_gateway: Any, tmp_path: Path, clock: ShiftedClock, fake_slack: FakeSlack,
    fake_llm: FakeLLM,
) -> None:
    """The count rides in the end's commit; when that commit fails, the call was still made: counted on its own."""
    gateway = await _start(make_settings, start_gateway, tmp_path, clock)
    turns = gateway.app.dispatcher.turns
    finish_turn = turns.conversations.finish_turn
    failed: list[int] = []

    async def failing_once(turn_id: int, **how: Any) -> Any:
        if not failed:
            failed.append(turn_id)
            raise RuntimeError("the database went away for a moment")
        return await finish_turn(turn_id, **how)

    turns.conversations.finish_turn = failing_once  # type: ignore[method-assign]
    fake_llm.then(Reply("an answer whose end is never stored"))
    await gateway.send_event(mention("hello"))
    async with asyncio.timeout(10):
        while not failed or turns._drivers:
            await asyncio.sleep(0.02)
    assert len(fake_llm.requests) == 1
    assert await _calls(gateway) == {("default", "U1"): 1}


async def test_a_sub_agent_whose_end_could_not_be_stored_still_counts_its_last_call(
    make_settings: Any, start_gateway: Any, tmp_path: Path, clock: ShiftedClock, fake_slack: FakeSlack,
    fake_llm: FakeLLM,
) -> None:
    gateway = await _start(make_settings, start_gateway, tmp_path, clock,
                           '[[agents]]\nname = "default"\n\n[[agents]]\nname = "researcher"\n')
    store = gateway.app.dispatcher.runner.store
    assert store is not None
    finish_turn = store.finish_turn
    failed: list[int] = []

    async def failing_for_the_sub_agent(turn_id: int, **how: Any) -> Any:
        if not failed and turn_id != 1:  # turn 1: the mention's own
            failed.append(turn_id)
            raise RuntimeError("the database went away for a moment")
        return await finish_turn(turn_id, **how)

    store.finish_turn = failing_for_the_sub_agent  # type: ignore[method-assign]
    fake_llm.then(Reply(tool_calls=[("delegate", {"agent": "researcher", "task": "look it up"})]),
                  Reply("found it"), Reply("done"))
    await gateway.send_event(mention("find out"))
    await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()
    assert failed and len(fake_llm.requests) == 3
    assert await _calls(gateway) == {("researcher", "U1"): 1, ("default", "U1"): 2}


def test_a_weekday_range_that_starts_at_7_is_sunday_as_cron_reads_it() -> None:
    """7 is Sunday at either end of a range: ``7-7`` is Sundays only (not every day), ``7-1`` runs backwards."""
    from zoneinfo import ZoneInfo

    from core.triggers import cron_triggers

    [sundays] = cron_triggers("0 9 * * 7-7", ZoneInfo("UTC"))
    assert "day_of_week='sun'" in str(sundays)
    with pytest.raises(ValueError, match="backwards"):
        cron_triggers("0 9 * * 7-1", ZoneInfo("UTC"))


def test_a_weekday_step_from_one_day_runs_to_the_end_of_the_week_as_cron_reads_it() -> None:
    """``1/2`` is every second day from Monday (cronie: 1-7/2), as ``1/2`` in the day-of-month field is from the
    1st (APScheduler): never Monday alone, which ignored the step."""
    from zoneinfo import ZoneInfo

    from core.triggers import cron_triggers

    [every_other] = cron_triggers("0 9 * * 1/2", ZoneInfo("UTC"))
    assert "day_of_week='mon,wed,fri,sun'" in str(every_other)
    [from_sunday] = cron_triggers("0 9 * * 0/3", ZoneInfo("UTC"))
    assert "day_of_week='sun,wed,sat'" in str(from_sunday)
