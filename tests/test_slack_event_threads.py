"""A conversation that asks for ``open_thread`` (an event's): its first post, whatever it is, goes top-level in
the channel, and every later post of it goes in that post's thread, across turns, replicas and restarts."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import aiohttp
from slack_sdk.web.async_client import AsyncWebClient

from channels.slack.port import SlackPort
from channels.slack.threads import SessionThreads
from core.gateway import Gateway
from core.model import Inbound, SessionInfo, SessionStatus
from core.ports import DeliveryId
from tests.conftest import GatewayClient
from tests.fakes.llm import FakeLLM, HttpError, Reply
from tests.fakes.slack_api import Call, FakeSlack
from tests.slack_requests import block_action

OPENING = {"channel": "C9", "open_thread": True}


async def _event(gateway: GatewayClient, text: str, *, number: int, key: str = "k1",
                 sender: str = "event:test", session: str | None = None) -> None:
    """An input as the event processor makes one: core's own, in a conversation that has no thread yet."""
    await gateway.app.dispatcher.accept(Inbound(
        session_id=session or f"event:test:{key}", channel="slack", sender=sender, text=text, addressed=True,
        reply_ref=dict(OPENING), idempotency_key=f"event:{number}", place="slack:dest:C9"), internal=True)


def _in_c9(fake_slack: FakeSlack) -> list[Call]:
    return [c for c in fake_slack.posts() if c.params.get("channel") == "C9"]


def _ts(fake_slack: FakeSlack, text: str) -> str:
    return str(next(m["ts"] for m in fake_slack.messages if m["text"] == text))


async def test_the_first_answer_opens_the_thread_and_the_next_turn_answers_in_it(
    gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    await _event(gateway, "CI failed on main", number=1)
    await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()
    first = _in_c9(fake_slack)[0]
    assert first.params["text"] == "echo: CI failed on main" and first.params.get("thread_ts") is None
    opened = _ts(fake_slack, "echo: CI failed on main")
    session = await gateway.app.gateway.session("event:test:k1")
    assert session is not None and session.reply_ref == {"channel": "C9", "thread_ts": opened}

    await _event(gateway, "CI failed again", number=2)
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    second = _in_c9(fake_slack)[1]
    assert second.params["text"] == "echo: CI failed again" and second.params["thread_ts"] == opened
    # Another key is another conversation: its own top-level post, its own thread.
    await _event(gateway, "deploy finished", number=3, key="k2")
    await fake_slack.wait_for("chat.postMessage", 3)
    await gateway.idle()
    assert _in_c9(fake_slack)[2].params.get("thread_ts") is None
    assert len(fake_slack.posts()) == 3


async def test_a_long_first_answer_opens_the_thread_with_its_first_chunk(
    gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    long = "\n\n".join(f"Paragraph {n}: " + "word " * 150 for n in range(12))  # about 9,000 characters
    fake_llm.then(Reply(long))
    await _event(gateway, "explain everything", number=1)
    await fake_slack.wait_for("chat.postMessage", 3)
    await gateway.idle()
    posts = _in_c9(fake_slack)
    assert len(posts) >= 3 and posts[0].params.get("thread_ts") is None
    head = str(next(m["ts"] for m in fake_slack.messages if m["channel"] == "C9"))
    assert all(p.params["thread_ts"] == head for p in posts[1:])
    assert [p.params["metadata"]["event_payload"]["chunk"] for p in posts] == list(range(len(posts)))


async def test_a_card_as_the_first_post_opens_the_thread_and_the_answer_follows_it(
    gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    # A plain internal session: whether a gated call is asked or refused in an event's conversation is the
    # source's trust (core.webhooks); where its posts go is only the reference's.
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo from-the-card"})]))
    await _event(gateway, "restart the worker", number=1, sender="U2", session="internal:card:1")
    card = (await fake_slack.wait_for("chat.postMessage"))[0]
    assert card.params["channel"] == "C9" and card.params.get("thread_ts") is None
    request_id = card.params["blocks"][-1]["elements"][0]["value"]
    opened = str(fake_slack.messages[0]["ts"])

    fake_llm.then(Reply("Restarted."))
    await gateway.interact(block_action("approval:approve", request_id, user="U2"))
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    answer = fake_slack.posts()[1]
    assert answer.params["text"] == "Restarted." and answer.params["thread_ts"] == opened
    assert fake_slack.of("chat.update")[0].params["ts"] == opened  # the card itself, updated in place
    session = await gateway.app.gateway.session("internal:card:1")
    assert session is not None and session.reply_ref == {"channel": "C9", "thread_ts": opened}


async def test_a_failure_as_the_first_post_opens_the_thread(
    gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    fake_llm.then(HttpError(401, "Incorrect API key provided"))
    await _event(gateway, "alert fired", number=1)
    failed = (await fake_slack.wait_for("chat.postMessage"))[0]
    await gateway.idle()
    assert failed.params["text"].startswith(":warning:") and failed.params.get("thread_ts") is None
    await _event(gateway, "alert fired again", number=2)
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    assert fake_slack.posts()[1].params["thread_ts"] == str(fake_slack.messages[0]["ts"])


async def test_streaming_waits_for_the_thread(make_settings: Any, start_gateway: Any, fake_slack: FakeSlack,
                                              fake_llm: FakeLLM) -> None:
    """With SLACK_STREAMING, the first answer (no thread yet) is posted whole, top-level; the next one shows as it
    is written in the thread it opened: as a message that grows (a Slack stream needs a person to go to, and an
    event's sender is none)."""
    gateway: GatewayClient = await start_gateway(make_settings(slack_streaming=True, slack_stream_delay_s=0))
    first = Reply("First answer, written in pieces.", pieces=["First answer, ", "written in pieces."], hold_after=1)
    fake_llm.then(first)
    await _event(gateway, "build broke", number=1)
    await asyncio.wait_for(first.held.wait(), 5)  # written in part: a stream would start now, had it a thread
    await gateway.app.dispatcher.bus.drain(5)
    await asyncio.sleep(0.05)
    assert fake_slack.of("chat.startStream") == []
    first.resume.set()
    await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()
    assert fake_slack.of("chat.startStream") == [] and fake_slack.posts()[0].params.get("thread_ts") is None
    opened = str(fake_slack.messages[0]["ts"])

    second = Reply("Second answer, written in pieces.", pieces=["Second answer, ", "written in pieces."],
                   hold_after=1)
    fake_llm.then(second)
    await _event(gateway, "build broke again", number=2)
    await fake_slack.wait_for("chat.postMessage", 2)  # shown while the model still writes
    second.resume.set()
    await fake_slack.wait_for("chat.update")
    await gateway.idle()
    assert fake_slack.of("chat.startStream") == []  # never with a recipient that is nobody on Slack
    growing = fake_slack.posts()[1]
    assert growing.params["thread_ts"] == opened and "Second answer" in growing.params["text"]
    assert fake_slack.of("chat.update")[-1].params["ts"] == fake_slack.messages[1]["ts"]
    assert [m["thread_ts"] for m in fake_slack.messages] == [None, opened]


async def test_the_thread_outlives_a_restart(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    from bot.app import build_application

    settings = make_settings()
    app = build_application(settings)
    await app.start()
    try:
        async with aiohttp.ClientSession() as http:
            first = GatewayClient(app, http)
            await _event(first, "disk almost full", number=1)
            await fake_slack.wait_for("chat.postMessage")
            await first.idle()
    finally:
        await asyncio.wait_for(app.stop(), 10)
    opened = _ts(fake_slack, "echo: disk almost full")

    gateway: GatewayClient = await start_gateway(settings)  # a new process on the same database
    await _event(gateway, "disk full", number=2)
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    assert fake_slack.posts()[1].params["thread_ts"] == opened


async def test_two_openers_race_and_one_wins(gateway: GatewayClient) -> None:
    """The compare-and-set behind Gateway.thread_opened: of two posts that both went top-level (two replicas),
    the first recorded wins, and the other learns where the thread is."""
    core: Gateway = gateway.app.gateway
    await gateway.app.dispatcher.conversations.ensure_session(
        SessionInfo(id="event:test:race", channel="slack", agent="default", status=SessionStatus.IDLE,
                    reply_ref=dict(OPENING)), gateway.app.dispatcher.clock.now())
    won = await core.thread_opened("event:test:race", {"channel": "C9", "thread_ts": "1.1"}, was=dict(OPENING))
    lost = await core.thread_opened("event:test:race", {"channel": "C9", "thread_ts": "2.2"}, was=dict(OPENING))
    assert won == lost == {"channel": "C9", "thread_ts": "1.1"}
    session = await core.session("event:test:race")
    assert session is not None and session.reply_ref == won


async def test_an_answer_and_a_notice_racing_in_one_process_open_one_thread(
    gateway: GatewayClient, fake_slack: FakeSlack
) -> None:
    info = SessionInfo(id="event:test:both", channel="slack", agent="default", status=SessionStatus.IDLE,
                       reply_ref=dict(OPENING))
    await gateway.app.dispatcher.conversations.ensure_session(info, gateway.app.dispatcher.clock.now())
    fake_slack.post_delay_s = 0.05  # both are on their way at once
    port = SlackPort(AsyncWebClient(token="xoxb-x", base_url=f"{fake_slack.url}/api/"),
                     threads=SessionThreads(gateway.app.gateway))
    delivery = DeliveryId("install-1", 901, datetime.now(UTC))
    await asyncio.gather(port.deliver(info, "the answer", delivery_id=delivery),
                         port.post_notice(info, "a notice"), port.post_notice(info, "another notice"))
    posts = _in_c9(fake_slack)
    top = [p for p in posts if p.params.get("thread_ts") is None]
    assert len(posts) == 3 and len(top) == 1
    opened = next(m["ts"] for m in fake_slack.messages if not m["thread_ts"])
    assert all(p.params["thread_ts"] == opened for p in posts if p is not top[0])


class _FailsToRecordOnce:
    """The database fails once, right after the first chunk was posted (as a crash there would leave it)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.failed = False

    async def session(self, session_id: str) -> SessionInfo | None:
        return await self.gateway.session(session_id)

    async def thread_opened(self, session_id: str, reply_ref: dict[str, Any], *, was: dict[str, Any]
                            ) -> dict[str, Any]:
        if not self.failed:
            self.failed = True
            raise ConnectionError("database gone")
        return await self.gateway.thread_opened(session_id, reply_ref, was=was)


async def test_a_retry_records_the_thread_its_first_chunk_opened(gateway: GatewayClient, fake_slack: FakeSlack
                                                                 ) -> None:
    info = SessionInfo(id="event:test:retry", channel="slack", agent="default", status=SessionStatus.IDLE,
                       reply_ref=dict(OPENING))
    await gateway.app.dispatcher.conversations.ensure_session(info, gateway.app.dispatcher.clock.now())
    client = AsyncWebClient(token="xoxb-x", base_url=f"{fake_slack.url}/api/")
    text = "\n\n".join("word " * 500 for _ in range(2))  # two chunks
    delivery = DeliveryId("install-1", 902, datetime.now(UTC))
    flaky = SlackPort(client, threads=SessionThreads(_FailsToRecordOnce(gateway.app.gateway)))  # type: ignore[arg-type]
    try:
        await flaky.deliver(info, text, delivery_id=delivery)
    except ConnectionError:
        pass
    else:
        raise AssertionError("the attempt should have failed")
    assert len(fake_slack.posts()) == 1 and fake_slack.posts()[0].params.get("thread_ts") is None
    stored = await gateway.app.gateway.session(info.id)
    assert stored is not None and stored.reply_ref == OPENING  # not on record: the "crash"

    retry = SlackPort(client, threads=SessionThreads(gateway.app.gateway))  # the next attempt, maybe after a start
    assert await retry.find_delivered(info, delivery) is None  # one chunk of two landed
    opened = str(fake_slack.messages[0]["ts"])
    stored = await gateway.app.gateway.session(info.id)
    assert stored is not None and stored.reply_ref == {"channel": "C9", "thread_ts": opened}
    receipt = await retry.deliver(info, text, delivery_id=delivery, resume=True)
    assert receipt.ref == opened
    posts = fake_slack.posts()
    assert len(posts) == 2 and posts[1].params["thread_ts"] == opened
    assert posts[1].params["metadata"]["event_payload"]["chunk"] == 1
