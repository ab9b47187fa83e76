"""BOT_RECORD_THREAD_CONTEXT: un-mentioned thread replies are context for the next answer, or nothing."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text

from tests.conftest import GatewayClient
from tests.fakes.llm import FakeLLM
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import mention, message


async def stored_texts(gateway: GatewayClient) -> list[str]:
    """Everything kept about the conversations: inputs and transcript messages."""
    async with gateway.app.db.engine.connect() as conn:
        rows = await conn.execute(text("SELECT text FROM inputs UNION ALL SELECT content FROM messages"))
        return [str(r[0]) for r in rows]


async def ask_after_a_reply(gateway: GatewayClient, fake_slack: FakeSlack) -> None:
    """A mention, an un-mentioned reply by someone else in its thread, then a second mention."""
    root = mention("start")
    await gateway.send_event(root)
    await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()
    await gateway.send_event(message("the error is E42", thread_ts=root["ts"], user="U2"))
    await gateway.idle()
    await gateway.send_event(mention("what was the error?", thread_ts=root["ts"]))
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()


async def test_off_thread_replies_are_neither_stored_nor_shown_to_the_model(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    gateway = await start_gateway(make_settings(bot_record_thread_context=False))
    await ask_after_a_reply(gateway, fake_slack)
    assert len(fake_llm.requests) == 2  # the reply started no turn either
    contents = [m.get("content") for m in fake_llm.requests[1]["messages"]]
    assert contents[1:] == ["start", "echo: start", "what was the error?"]
    assert not [t for t in await stored_texts(gateway) if "E42" in t]


async def test_on_by_default_thread_replies_reach_the_model(
    gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    assert gateway.app.settings.bot_record_thread_context is True
    await ask_after_a_reply(gateway, fake_slack)
    contents = [m.get("content") for m in fake_llm.requests[1]["messages"]]
    assert contents[1:] == ["start", "echo: start", "the error is E42\n\nwhat was the error?"]
    assert [t for t in await stored_texts(gateway) if "E42" in t]


async def test_off_a_mention_is_still_answered_once_whatever_arrives_first(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    """Nothing is stored for an ignored reply, so its key is not taken: when the same message then
    arrives as a mention, it is answered; its twin and redeliveries are still dropped."""
    gateway = await start_gateway(make_settings(bot_record_thread_context=False))
    root = mention("start")
    await gateway.send_event(root)
    await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()
    # The same message, first seen without the bot's mention (as a plain thread reply), then as the
    # app_mention Slack also sends, its redelivery, and its `message` twin that names the bot.
    later = mention("restart the worker", thread_ts=root["ts"])
    plain = message("restart the worker", ts=later["ts"], thread_ts=root["ts"])
    assert (await gateway.send_event(plain, event_id="EvPlain")).status == 200
    await gateway.idle()
    assert len(fake_llm.requests) == 1
    assert (await gateway.send_event(later, event_id="EvMention")).status == 200
    assert (await gateway.send_event(later, event_id="EvMention", retry_num=1)).status == 200
    twin = message(later["text"], ts=later["ts"], thread_ts=root["ts"])
    assert (await gateway.send_event(twin, event_id="EvTwin")).status == 200
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    assert len(fake_llm.requests) == 2
    assert [p.params["text"] for p in fake_slack.posts()] == ["echo: start", "echo: restart the worker"]
