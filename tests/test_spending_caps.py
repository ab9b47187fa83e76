"""Spending caps (SPEC §17, issue 40.7): each model call counted per UTC day, agent and person; a cap reached parks an
interactive turn on an admins-only Continue card (this turn only), and ends a firing's or an event's turn before the
model call; `bot usage` and /metrics report spending."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from bot.errors import SettingsError
from core.providers import Completion
from core.spending import MAX_CALL_TOKENS, CapsConfig, Price, SpendingCaps
from core.store import Database
from core.store.usage import Spent, UsageKey, UsageStore
from core.tools import ToolContext
from tests.bot_process import run_cli
from tests.conftest import GatewayClient
from tests.fakes.core import ShiftedClock
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import TEAM_ID, block_action, mention
from tests.test_events import _dest_posts, deliver, settled

NOW = datetime(2026, 12, 15, 10, 0, tzinfo=UTC)
TODAY = "2026-12-15"


@pytest.fixture
def clock() -> ShiftedClock:
    shifted = ShiftedClock()
    shifted.jump_to(NOW)
    return shifted


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bot.toml"
    path.write_text(text, encoding="utf-8")
    return path


async def _start(make_settings: Any, start_gateway: Any, tmp_path: Path, clock: ShiftedClock, toml: str,
                 **settings: Any) -> GatewayClient:
    gateway: GatewayClient = await start_gateway(make_settings(bot_config=_toml(tmp_path, toml), bot_admins="UADMIN",
                                                               **settings), clock=clock)
    return gateway


async def _seed(gateway: GatewayClient, day: str, tokens: int, *, agent: str = "default", person: str = "U1",
                micros: int | None = None) -> None:
    await UsageStore(gateway.app.db).add(UsageKey(day, agent, person), Spent(tokens, 0, micros))


def _card(post: Any) -> tuple[str, list[str], str]:
    """(the card's text, its buttons' labels, the Continue button's value)."""
    buttons = post.params["blocks"][-1]["elements"]
    return json.dumps(post.params["blocks"]), [b["text"]["text"] for b in buttons], buttons[0]["value"]


def _status(user: str, thread_ts: str) -> str:
    return urlencode({"command": "/bot", "text": "status", "user_id": user, "channel_id": "C1", "team_id": TEAM_ID,
                      "thread_ts": thread_ts, "response_url": "http://127.0.0.1:9/r", "trigger_id": "t", "token": "x"})


async def test_an_agents_daily_cap_parks_the_turn_for_an_admins_continue_of_this_turn_only(
    make_settings: Any, start_gateway: Any, tmp_path: Path, clock: ShiftedClock, fake_slack: FakeSlack,
    fake_llm: FakeLLM,
) -> None:
    gateway = await _start(make_settings, start_gateway, tmp_path, clock,
                           '[[agents]]\nname = "default"\ndaily_tokens = 1000\n')
    fake_llm.then(Reply(tool_calls=[("time_now", {})]))
    root = mention("look at this " + "x" * 6_000)  # the first call uses ~1,500 tokens: the second one parks
    await gateway.send_event(root)
    [card] = await fake_slack.wait_for("chat.postMessage")
    text, labels, request_id = _card(card)
    assert labels == ["Continue", "Stop"] and "daily token cap" in text and "Only admins" in text
    assert len(fake_llm.requests) == 1
    # The asker is no admin: the cap is not theirs to lift.
    await gateway.interact(block_action("approval:approve", request_id, user="U1", thread_ts=root["ts"]))
    [told] = await fake_slack.wait_for("chat.postEphemeral")
    assert "can't approve" in told.params["text"] and len(fake_llm.requests) == 1
    fake_llm.then(Reply("done past the cap"))
    await gateway.interact(block_action("approval:approve", request_id, user="UADMIN", thread_ts=root["ts"]))
    posts = await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    assert posts[1].params["text"] == "done past the cap" and len(fake_llm.requests) == 2
    assert "Continued by <@UADMIN>" in json.dumps(fake_slack.of("chat.update")[-1].params["blocks"])
    # Counted: /bot status shows the agent's day against its cap, /metrics the tokens by agent.
    reply = await (await gateway.interact(_status("U1", root["ts"]))).text()
    assert "Spending: agent default today" in reply and "of 1,000" in reply
    figures = await gateway.metrics()
    assert figures['chatops_spend_tokens_total{agent="default",direction="input"}'] >= 1_500
    # The Continue was this turn's: the next turn stops at the cap again, before its first call.
    await gateway.send_event(mention("and now?"))
    posts = await fake_slack.wait_for("chat.postMessage", 3)
    assert "daily token cap" in json.dumps(posts[2].params["blocks"]) and len(fake_llm.requests) == 2


async def test_a_cost_cap_counts_by_the_price_table_and_needs_every_model_priced(
    make_settings: Any, start_gateway: Any, tmp_path: Path, clock: ShiftedClock, fake_slack: FakeSlack,
    fake_llm: FakeLLM,
) -> None:
    with pytest.raises(SettingsError, match=r"no \[\[prices\]\] table: fake-model"):
        await _start(make_settings, start_gateway, tmp_path, clock, '[[agents]]\nname = "default"\ndaily_cost = 1\n')
    gateway = await _start(make_settings, start_gateway, tmp_path, clock,
                           '[[agents]]\nname = "default"\ndaily_cost = 1.5\n\n[[prices]]\nmodel = "fake-model"\n'
                           'input_per_million = 1000\noutput_per_million = 2000\n')
    fake_llm.then(Reply("under the cap"))
    await gateway.send_event(mention("hello"))
    await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()
    counted = await UsageStore(gateway.app.db).lines(since=TODAY)
    [line] = counted
    assert line.cost_micros == line.input_tokens * 1000 + line.output_tokens * 2000 and line.unpriced_calls == 0
    await _seed(gateway, TODAY, 0, micros=1_500_000)  # another turn's spending today reaches 1.5
    await gateway.send_event(mention("again"))
    posts = await fake_slack.wait_for("chat.postMessage", 2)
    text, labels, _ = _card(posts[1])
    assert "daily cost cap" in text and "of 1.5000" in text and labels == ["Continue", "Stop"]
    assert len(fake_llm.requests) == 1  # parked before its first call


async def test_a_monthly_cap_counts_this_month_and_a_new_day_allows_again(
    make_settings: Any, start_gateway: Any, tmp_path: Path, clock: ShiftedClock, fake_slack: FakeSlack,
    fake_llm: FakeLLM,
) -> None:
    gateway = await _start(make_settings, start_gateway, tmp_path, clock,
                           '[[agents]]\nname = "default"\ndaily_tokens = 1000\nmonthly_tokens = 5000\n')
    await _seed(gateway, "2026-12-14", 1_500)  # yesterday's day was over its daily cap: today's is not
    await _seed(gateway, "2026-11-30", 50_000)  # last month's does not count
    fake_llm.then(Reply("a new day"))
    await gateway.send_event(mention("hello"))
    [answer] = await fake_slack.wait_for("chat.postMessage")
    assert answer.params["text"] == "a new day"
    await gateway.idle()
    await _seed(gateway, "2026-12-01", 4_000)  # with yesterday's 1,500: this month is past 5,000
    await gateway.send_event(mention("again"))
    posts = await fake_slack.wait_for("chat.postMessage", 2)
    assert "monthly token cap" in json.dumps(posts[1].params["blocks"]) and len(fake_llm.requests) == 1
    # The next day's first of the month: both caps start again (the pending card is this turn's, still parked).
    clock.jump_to(datetime(2027, 1, 1, 0, 0, 1, tzinfo=UTC))
    fake_llm.then(Reply("a new month"))
    await gateway.send_event(mention("new month", channel="C2"))
    posts = await fake_slack.wait_for("chat.postMessage", 3)
    assert posts[2].params["text"] == "a new month"


async def test_a_persons_daily_cap_counts_across_agents_and_stops_only_them(
    make_settings: Any, start_gateway: Any, tmp_path: Path, clock: ShiftedClock, fake_slack: FakeSlack,
    fake_llm: FakeLLM,
) -> None:
    gateway = await _start(make_settings, start_gateway, tmp_path, clock,
                           '[limits]\nperson_daily_tokens = 1000\n')
    await _seed(gateway, TODAY, 1_200, agent="ops", person="U1")  # spent through another agent
    await gateway.send_event(mention("hello", user="U1"))
    [card] = await fake_slack.wait_for("chat.postMessage")
    text, labels, _ = _card(card)
    assert "U1's daily token cap" in text and "1,200 of 1,000 tokens" in text and labels == ["Continue", "Stop"]
    fake_llm.then(Reply("for U2"))
    await gateway.send_event(mention("hello", user="U2", channel="C2"))
    posts = await fake_slack.wait_for("chat.postMessage", 2)
    assert posts[1].params["text"] == "for U2" and len(fake_llm.requests) == 1


async def test_a_cap_reached_in_a_firing_ends_it_before_the_model_call_and_records_the_failure(
    make_settings: Any, start_gateway: Any, tmp_path: Path, clock: ShiftedClock, fake_slack: FakeSlack,
    fake_llm: FakeLLM,
) -> None:
    from core.model import ScheduleStatus
    from core.store.schedules import ScheduleStore
    from core.store.tables import ScheduleRow
    from core.triggers import TriggerSpec

    gateway = await _start(make_settings, start_gateway, tmp_path, clock,
                           '[[agents]]\nname = "default"\ndaily_tokens = 1000\n')
    await _seed(gateway, TODAY, 1_000, person="U1")  # the creator's firings count under the creator
    schedule = await ScheduleStore(gateway.app.db).add(ScheduleRow(
        prompt="report", trigger=TriggerSpec(every_seconds=86_400).to_json(), destination="#acc-dest",
        destination_id="CACC", channel="slack", agent="default", creator="U1", status=ScheduleStatus.ACTIVE,
        created_at=clock.now()))
    assert schedule.id is not None
    await gateway.app.schedule_jobs.fire(schedule.id)
    await gateway.idle()
    assert fake_llm.requests == []
    [told] = [p for p in fake_slack.of("chat.postMessage") if p.params.get("channel") == "CACC"]
    assert "daily token cap" in told.params["text"] and "nobody can be asked" in told.params["text"]
    [stored] = await gateway.app.schedules.list()
    assert stored.failures == 1 and "daily token cap" in (stored.last_outcome or "")
    await gateway.app.schedules.change(schedule.id, "cancel", by="U1", channel="slack")


async def test_a_cap_reached_in_an_event_turn_ends_it_before_the_model_call(
    make_settings: Any, start_gateway: Any, tmp_path: Path, clock: ShiftedClock, fake_slack: FakeSlack,
    fake_llm: FakeLLM, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.test_events import SECRET, _workflow_run

    monkeypatch.setenv("CI_WEBHOOK_SECRET", SECRET)
    gateway = await _start(make_settings, start_gateway, tmp_path, clock,
                           '[[agents]]\nname = "default"\ndaily_tokens = 1000\n\n[[event_sources]]\nname = "ci"\n'
                           'kind = "github"\nsecret_env = "CI_WEBHOOK_SECRET"\ndestination = "#ops"\n')
    await _seed(gateway, TODAY, 1_000, person="nobody")  # an event's turn is nobody's: the agent's cap still holds
    assert await deliver(gateway.base, _workflow_run(7), "d-7") == 202
    [event] = await settled(gateway, 1)
    assert event.status == "failed" and fake_llm.requests == []
    [told] = _dest_posts(fake_slack)
    assert "daily token cap" in told.params["text"] and "nobody can be asked" in told.params["text"]


async def test_an_endpoints_usage_figures_are_clamped(tmp_path: Path) -> None:
    """A hostile or broken endpoint cannot hide spending (negative) nor use up every cap at once (huge)."""
    db = Database(f"sqlite:///{tmp_path}/x.db")
    await db.migrate()
    try:
        clock = ShiftedClock()
        clock.jump_to(NOW)
        caps = SpendingCaps(UsageStore(db), clock, None, CapsConfig(prices={"m": Price(1.0, 1.0)}))
        ctx = ToolContext(session_id="s:1", turn_id=1, agent="default", sender="U1")
        spent = await caps.record(ctx, "default", "m", Completion("hi", input_tokens=5, output_tokens=10**15),
                                  estimated_input=10, estimated_output=1, thread=None)
        assert (spent.input_tokens, spent.output_tokens) == (5, MAX_CALL_TOKENS)
        # A negative (or zero) request is not believed: our estimates count instead (test_issue40_attacks_b).
        assert caps.spent("m", Completion("hi", input_tokens=-50_000, output_tokens=3), estimated_input=10,
                          estimated_output=1) == Spent(10, 1, 11)
        # No split said: the total, less our estimate of the answer; nothing said: our estimates.
        assert caps.spent("m", Completion("", usage=100), estimated_input=7, estimated_output=30) == Spent(70, 30, 100)
        assert caps.spent("x", Completion(""), estimated_input=7, estimated_output=3) == Spent(7, 3, None)
        [line] = await UsageStore(db).lines(since=TODAY)
        assert (line.person, line.input_tokens, line.output_tokens, line.cost_micros) == (
            "U1", 5, MAX_CALL_TOKENS, MAX_CALL_TOKENS + 5)
    finally:
        await db.close()


async def test_bot_usage_prints_spending_by_day_agent_and_person(make_settings: Any, tmp_path: Path) -> None:
    from bot.home import secure_home

    settings = make_settings()
    secure_home(settings)  # as the CLI would (else it says it made the database file private)
    db = Database(settings.resolved_database_url)
    await db.migrate()
    today = date.today()
    store = UsageStore(db)
    try:
        await store.add(UsageKey(today.isoformat(), "ops", "U1"), Spent(1_000, 200, 3_400))
        await store.add(UsageKey(today.isoformat(), "ops", "U1"), Spent(500, 100, None))
        await store.add(UsageKey(today.isoformat(), "default", "nobody"), Spent(10, 1, 0))
        await store.add(UsageKey((today - timedelta(days=3)).isoformat(), "ops", "U2"), Spent(7, 7, 14))
    finally:
        await db.close()
    env = {"BOT_HOME": str(settings.bot_home), **({"DATABASE_URL": settings.database_url}
                                                  if settings.database_url else {})}
    code, out = await run_cli(tmp_path, env, "usage", "--days", "2", "--agent", "ops")
    assert code == 0, out
    header = "day\tagent\tperson\tcalls\tinput tokens\toutput tokens\tcost"
    lines = out.strip().splitlines()
    lines = lines[lines.index(header):]  # (after the first run's note on the key it generated)
    assert lines[1] == f"{today.isoformat()}\tops\tU1\t2\t1500\t300\t0.0034 (+1 unpriced call)"
    assert lines[2] == "total\t\t\t2\t1500\t300\t0.0034 (+1 unpriced call)" and len(lines) == 3
    code, out = await run_cli(tmp_path, env, "usage", "--days", "7", "--person", "U2")
    assert code == 0 and "\tops\tU2\t1\t7\t7\t0.0000" in out


async def test_a_sub_agent_counts_under_its_own_agent_and_ends_at_its_cap_without_asking(
    make_settings: Any, start_gateway: Any, tmp_path: Path, clock: ShiftedClock, fake_slack: FakeSlack,
    fake_llm: FakeLLM,
) -> None:
    from core.tools import SUBAGENT_CANNOT_ASK

    gateway = await _start(make_settings, start_gateway, tmp_path, clock,
                           '[[agents]]\nname = "default"\n\n[[agents]]\nname = "researcher"\ndaily_tokens = 100\n')
    await _seed(gateway, TODAY, 100, agent="researcher", person="U1")
    fake_llm.then(Reply(tool_calls=[("delegate", {"agent": "researcher", "task": "look it up"})]),
                  Reply("did it myself"))
    await gateway.send_event(mention("find out"))
    [answer] = await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()
    assert answer.params["text"] == "did it myself" and len(fake_llm.requests) == 2  # the sub-agent called nothing
    result = str(fake_llm.requests[1]["messages"][-1]["content"])
    assert "researcher's daily token cap" in result and SUBAGENT_CANNOT_ASK in result
    assert fake_slack.of("chat.postEphemeral") == []
    counted = {(line.agent, line.person): line.calls for line in await UsageStore(gateway.app.db).lines(since=TODAY)}
    assert counted == {("researcher", "U1"): 1, ("default", "U1"): 2}  # (the seeded row is one "call")


def test_doctor_names_a_cost_cap_whose_model_has_no_price(make_settings: Any, tmp_path: Path) -> None:
    from bot.doctor import _config_file

    settings = make_settings(bot_config=_toml(tmp_path, '[limits]\nperson_daily_cost = 2\n'))
    [caps] = [check for check in _config_file(settings) if check.name == "spending caps"]
    assert not caps.ok and "fake-model" in caps.detail


async def test_a_turn_nobody_addressed_ends_silent_at_a_cap(
    make_settings: Any, start_gateway: Any, tmp_path: Path, clock: ShiftedClock, fake_slack: FakeSlack,
    fake_llm: FakeLLM,
) -> None:
    """A listening channel at a cap is not told of it per message; whoever addresses the bot there gets the card."""
    from sqlmodel import select

    from core.model import TurnStatus
    from core.store.tables import TurnRow
    from tests.slack_requests import message

    gateway = await _start(make_settings, start_gateway, tmp_path, clock,
                           '[[agents]]\nname = "default"\ndaily_tokens = 1000\n\n[slack]\nlisten_channels = ["#ops"]\n')
    await _seed(gateway, TODAY, 1_000)
    await gateway.send_event(message("api latency is up again", channel="COPS"))
    async with asyncio.timeout(10):
        while True:
            async with gateway.app.db.read() as s:
                turns = (await s.exec(select(TurnRow))).all()
            if turns and turns[0].status == TurnStatus.FINISHED:
                break
            await asyncio.sleep(0.02)
    await gateway.idle()
    assert fake_llm.requests == [] and fake_slack.of("chat.postMessage") == []


async def test_a_call_is_priced_by_the_model_that_answered_it(
    make_settings: Any, start_gateway: Any, tmp_path: Path, clock: ShiftedClock, fake_slack: FakeSlack,
    fake_llm: FakeLLM,
) -> None:
    """After the primary failed for good, the fallback answers: its price, not the primary's."""
    from tests.conftest import running_llm
    from tests.fakes.llm import HttpError

    async with running_llm() as fallback:
        gateway = await _start(
            make_settings, start_gateway, tmp_path, clock,
            '[[prices]]\nmodel = "fake-model"\ninput_per_million = 0\noutput_per_million = 0\n\n'
            '[[prices]]\nmodel = "fallback-model"\ninput_per_million = 1000\noutput_per_million = 1000\n',
            llm_fallback_base_url=f"{fallback.url}/v1", llm_fallback_api_key="sk-fallback-key-7d1e2f",  # type: ignore[attr-defined]
            llm_fallback_model="fallback-model", llm_max_attempts=1)
        fake_llm.then(HttpError(500, "upstream exploded"))
        fallback.then(Reply("from the fallback"))
        await gateway.send_event(mention("hello"))
        await fake_slack.wait_for("chat.postMessage")
        await gateway.idle()
    [line] = await UsageStore(gateway.app.db).lines(since=TODAY)
    assert line.calls == 1 and line.cost_micros == (line.input_tokens + line.output_tokens) * 1000 > 0


async def test_a_persons_cap_is_never_shared_by_every_events_turn(tmp_path: Path) -> None:
    """Events' turns are nobody's: ``person_daily_tokens`` does not pool them (their agent's caps bound them)."""
    from core.errors import BudgetExhausted
    from core.spending import PersonCaps

    db = Database(f"sqlite:///{tmp_path}/x.db")
    await db.migrate()
    try:
        clock = ShiftedClock()
        clock.jump_to(NOW)
        caps = SpendingCaps(UsageStore(db), clock, None, CapsConfig(person=PersonCaps(daily_tokens=10)))
        await UsageStore(db).add(UsageKey(TODAY, "default", "nobody"), Spent(50, 0, None))
        await UsageStore(db).add(UsageKey(TODAY, "default", "U1"), Spent(50, 0, None))
        await caps.before_call(ToolContext(session_id="event:ci:k", turn_id=1, agent="default", sender="event:ci"),
                               "default")
        with pytest.raises(BudgetExhausted, match="U1's daily token cap"):
            await caps.before_call(ToolContext(session_id="s:1", turn_id=2, agent="default", sender="U1"), "default")
    finally:
        await db.close()
