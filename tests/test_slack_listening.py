"""Listening channels (SPEC §17, ``[slack] listen_channels``): a message nobody addressed to the bot still starts a
turn there, whose answer is optional; the model stays silent with an empty answer or ``no_reply``; each channel
starts at most ``listen_rate_per_minute`` such turns a minute; bots never start one; a mention there is answered once.
Against the fake Slack, with the real app over HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from sqlmodel import select

from bot.settings import Settings
from channels.slack.toml import SlackSection, listening_of
from core.listening import NO_REPLY
from core.model import TurnStatus
from core.store.tables import DeliveryRow, InputRow, TurnRow
from tests.conftest import GatewayClient
from tests.fakes.core import ShiftedClock
from tests.fakes.llm import FakeLLM, Gate, HttpError, Reply
from tests.fakes.slack_api import BOT_USER_ID, FakeSlack
from tests.slack_requests import mention, message

LISTENED = "COPS"  # #ops in the fake workspace, named by #name in bot.toml
BY_ID = "CLISTEN"  # named by its id


@pytest.fixture
def clock() -> ShiftedClock:
    return ShiftedClock.at_a_minute_start()


@pytest.fixture
def start_listening(make_settings: Callable[..., Settings], start_gateway: Any, tmp_path: Path,
                    clock: ShiftedClock) -> Callable[..., Any]:
    async def start(**overrides: Any) -> GatewayClient:
        config = tmp_path / "bot.toml"
        config.write_text(f'[slack]\nlisten_channels = ["#ops", "{BY_ID}"]\n', encoding="utf-8")  # the default rate
        gateway: GatewayClient = await start_gateway(make_settings(bot_config=config, **overrides), clock=clock)
        return gateway

    return start


@pytest.fixture
async def listening(start_listening: Callable[..., Any]) -> GatewayClient:
    gateway: GatewayClient = await start_listening()
    return gateway


def offered(request: dict[str, Any]) -> list[str]:
    return [tool["function"]["name"] for tool in request.get("tools") or []]


async def turns(gw: GatewayClient) -> list[TurnRow]:
    async with gw.app.db.read() as s:
        return list((await s.exec(select(TurnRow).order_by(TurnRow.id))).all())  # type: ignore[arg-type]


async def deliveries(gw: GatewayClient) -> list[DeliveryRow]:
    async with gw.app.db.read() as s:
        return list((await s.exec(select(DeliveryRow))).all())


async def test_a_message_nobody_addressed_in_a_listening_channel_is_answered(
        listening: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    fake_llm.then(Reply("The deploy of 14:02 filled the disk; `df -h` on api-3 shows it."))
    event = message("api latency is up again", channel=LISTENED)
    assert (await listening.send_event(event)).status == 200
    posts = await fake_slack.wait_for("chat.postMessage")
    await listening.idle()
    assert posts[0].params["channel"] == LISTENED and posts[0].params["thread_ts"] == event["ts"]
    assert posts[0].params["text"].startswith("The deploy of 14:02")
    request = fake_llm.requests[0]
    assert NO_REPLY in offered(request)  # it may stay silent, and is told so
    assert "Nobody addressed you" in request["messages"][0]["content"]
    # In a thread too, and in a channel named by its id.
    await listening.send_event(message("and the error rate?", channel=LISTENED, thread_ts=event["ts"], user="U2"))
    by_id = message("queue is backing up", channel=BY_ID)
    await listening.send_event(by_id)
    await fake_slack.wait_for("chat.postMessage", 3)
    await listening.idle()
    # The two answers in whichever order their turns ended: each in the thread of the message it answers.
    assert {(p.params["channel"], p.params["thread_ts"]) for p in fake_slack.posts()[1:]} == {
        (LISTENED, event["ts"]), (BY_ID, by_id["ts"])}
    # Elsewhere an unaddressed message is still not the bot's business.
    await listening.send_event(message("lunch?", channel="C1"))
    await listening.idle()
    assert len(fake_llm.requests) == 3
    assert len(fake_slack.of("conversations.list")) == 1  # #ops was looked up once, and kept


@pytest.mark.parametrize("silence", [Reply(""), Reply("Nothing to add.", tool_calls=[(NO_REPLY, {})])],
                         ids=["empty answer", "no_reply"])
async def test_the_model_stays_silent_and_nothing_is_posted_or_left_behind(
        listening: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM, silence: Reply) -> None:
    fake_llm.then(silence)
    await listening.send_event(message("brb, coffee", channel=LISTENED))
    await listening.idle()
    assert len(fake_llm.requests) == 1  # no_reply ends the turn: the model is not asked again
    assert fake_slack.posts() == [] and fake_slack.of("chat.postEphemeral") == []
    # The progress sign it showed is taken down again.
    assert len(fake_slack.of("reactions.add")) == len(fake_slack.of("reactions.remove")) == 1
    (turn,) = await turns(listening)
    assert turn.status == TurnStatus.FINISHED and turn.answer is None and turn.error is None
    assert await deliveries(listening) == []  # no outbox row: nothing can be posted for it later, not after a crash
    # The conversation goes on: a later mention in its thread is answered, with what was said as context.
    root = fake_slack.of("reactions.add")[0].params["timestamp"]
    await listening.send_event(mention("anything new?", channel=LISTENED, thread_ts=root))
    posts = await fake_slack.wait_for("chat.postMessage")
    assert posts[0].params["text"] == "echo: brb, coffee\n\nanything new?"


async def test_past_the_rate_a_channel_s_messages_are_context_only(
        listening: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM, clock: ShiftedClock) -> None:
    for n in range(7):
        await listening.send_event(message(f"alert {n}", channel=LISTENED))
    await fake_slack.wait_for("chat.postMessage", 6)
    await listening.idle()
    assert sorted(p.params["text"] for p in fake_slack.posts()) == [f"echo: alert {n}" for n in range(6)]
    assert len(fake_llm.requests) == 6
    # Counted per channel: another listening channel has its own minute.
    await listening.send_event(message("other channel", channel=BY_ID))
    await fake_slack.wait_for("chat.postMessage", 7)
    # The next minute has room again.
    clock.jump_to(clock.now() + timedelta(minutes=1))
    await listening.send_event(message("alert 7", channel=LISTENED))
    await fake_slack.wait_for("chat.postMessage", 8)
    await listening.idle()
    assert fake_slack.posts()[-1].params["text"] == "echo: alert 7"
    assert len(fake_llm.requests) == 8


async def test_a_busy_thread_keeps_a_message_past_the_rate_as_context(
        listening: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    root = message("disk alert on api-3", channel=LISTENED)
    await listening.send_event(root)
    await fake_slack.wait_for("chat.postMessage")
    for n in range(5):  # the rest of the minute's room
        await listening.send_event(message(f"noise {n}", channel=LISTENED))
    await fake_slack.wait_for("chat.postMessage", 6)
    await listening.idle()
    await listening.send_event(message("it is the log volume", channel=LISTENED, thread_ts=root["ts"], user="U2"))
    await listening.idle()
    assert len(fake_llm.requests) == 6  # no turn for it...
    async with listening.app.db.read() as s:
        kept = (await s.exec(select(InputRow).where(InputRow.text == "it is the log volume"))).one()
    assert kept.kind == "context" and not kept.answer_optional  # ...but kept for the thread's next turn


async def test_bots_and_the_bot_itself_never_start_a_listening_turn(
        listening: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    for event in (
        message("deploy finished", channel=LISTENED, bot_id="B2"),
        message("PagerDuty: incident #42", channel=LISTENED, subtype="bot_message", bot_id="B3"),
        message("from an app's profile", channel=LISTENED, bot_profile={"id": "B4"}),
        message("my own answer", channel=LISTENED, user=BOT_USER_ID),
        message("edited", channel=LISTENED, subtype="message_changed"),
    ):
        assert (await listening.send_event(event)).status == 200
    await listening.idle()
    assert fake_llm.requests == [] and fake_slack.posts() == []


@pytest.mark.parametrize("mention_first", [True, False], ids=["mention first", "message first"])
async def test_a_mention_in_a_listening_channel_is_answered_once_and_owed(
        listening: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM, mention_first: bool) -> None:
    event = mention("is prod healthy?", channel=LISTENED)
    twin = message(event["text"], channel=LISTENED, ts=event["ts"])  # Slack sends both for one message
    for each in (event, twin) if mention_first else (twin, event):
        await listening.send_event(each)
    await fake_slack.wait_for("chat.postMessage")
    await listening.idle()
    assert len(fake_slack.posts()) == 1 and len(fake_llm.requests) == 1
    assert NO_REPLY not in offered(fake_llm.requests[0])  # someone asked: an answer is owed


async def test_an_empty_answer_to_a_mention_there_is_still_said(
        listening: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    fake_llm.then(Reply(""))
    await listening.send_event(mention("anything?", channel=LISTENED))
    posts = await fake_slack.wait_for("chat.postMessage")
    assert posts[0].params["text"] == "(the model returned an empty answer)"


async def test_a_listening_turn_that_fails_says_nothing_in_the_channel(
        listening: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    fake_llm.then(HttpError(400, "bad request"))
    await listening.send_event(message("cpu at 95%", channel=LISTENED))
    await listening.idle()
    (turn,) = await turns(listening)
    assert turn.status == TurnStatus.FAILED  # logged, and on record...
    assert fake_slack.posts() == []  # ...but nobody asked: no warning in the channel
    assert len(fake_slack.of("reactions.add")) == len(fake_slack.of("reactions.remove"))


async def test_a_long_listening_turn_offers_nobody_a_stop_button(
        start_listening: Callable[..., Any], fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    gateway: GatewayClient = await start_listening(slack_stop_offer_s=0.1)
    gate = Gate(Reply(""))
    fake_llm.then(gate)
    await gateway.send_event(message("rolling restart of api", channel=LISTENED))
    await asyncio.wait_for(gate.reached.wait(), 5)
    await asyncio.sleep(0.3)
    gate.opened.set()
    await gateway.idle()
    assert fake_slack.of("chat.postEphemeral") == [] and fake_slack.posts() == []  # they asked nothing


def test_bot_toml_names_listening_channels_by_name_or_id_and_bounds_the_rate() -> None:
    section = SlackSection.model_validate({"listen_channels": ["#ops-alerts", "C0123ABCD", "#ops-alerts"]})
    assert listening_of(section) == (("#ops-alerts", "C0123ABCD"), 6)
    assert listening_of(None) == ((), 6)
    for wrong in ({"listen_channels": ["ops-alerts"]}, {"listen_channels": ["#Ops"]}, {"listen_channels": ["U123"]},
                  {"listen_channels": ["#two words"]}, {"listen_rate_per_minute": 0},
                  {"listen_rate_per_minute": "6"}):
        with pytest.raises(ValidationError):
            SlackSection.model_validate(wrong)
