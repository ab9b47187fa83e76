"""A signed mention into the real bolt app gets the model's answer in the thread, exactly once."""

from __future__ import annotations

from tests.conftest import GatewayClient
from tests.fakes.llm import FakeLLM
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import mention, message


async def test_mention_is_answered_in_the_thread(gateway: GatewayClient, fake_slack: FakeSlack,
                                                 fake_llm: FakeLLM) -> None:
    event = mention("why is the deploy failing?")
    resp = await gateway.send_event(event)
    assert resp.status == 200
    posts = await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()
    assert posts[0].params["channel"] == "C1"
    assert posts[0].params["thread_ts"] == event["ts"]
    assert posts[0].params["text"] == "echo: why is the deploy failing?"
    assert fake_llm.requests[0]["model"] == "fake-model"
    assert fake_llm.requests[0]["messages"][0]["role"] == "system"
    added = fake_slack.of("reactions.add")
    assert added[0].params["name"] == "eyes" and added[0].params["timestamp"] == event["ts"]
    assert len(fake_slack.of("reactions.remove")) == 1


async def test_redelivery_and_message_twin_produce_one_answer(gateway: GatewayClient, fake_slack: FakeSlack,
                                                              fake_llm: FakeLLM) -> None:
    event = mention("hello")
    assert (await gateway.send_event(event, event_id="EvSame")).status == 200
    assert (await gateway.send_event(event, event_id="EvSame", retry_num=1)).status == 200
    twin = message(event["text"], ts=event["ts"])
    assert (await gateway.send_event(twin, event_id="EvTwin")).status == 200
    await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()
    assert len(fake_slack.posts()) == 1
    assert len(fake_llm.requests) == 1
