"""Socket Mode: with SLACK_APP_TOKEN the bot opens a WebSocket, acks envelopes and answers in threads."""

from __future__ import annotations

from typing import Any

import aiohttp

from tests.fakes.llm import FakeLLM
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import event_body, mention


async def test_socket_mode_mention_is_acked_and_answered(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    settings = make_settings(slack_signing_secret=None, slack_app_token="xapp-1-test-app-token")
    gateway = await start_gateway(settings)
    assert fake_slack.socket_connected.is_set()
    opened = fake_slack.of("apps.connections.open")
    assert len(opened) == 1

    event = mention("over the socket")
    envelope = await fake_slack.push_socket_event(event_body(event, event_id="EvSock"))
    await fake_slack.wait_for_ack(envelope)
    posts = await fake_slack.wait_for("chat.postMessage")
    assert posts[0].params["text"] == "echo: over the socket"
    assert posts[0].params["thread_ts"] == event["ts"]

    # The same event again (Slack's retry after a lost ack) is acked and not answered twice.
    again = await fake_slack.push_socket_event(event_body(event, event_id="EvSock"))
    await fake_slack.wait_for_ack(again)
    await gateway.idle()
    assert len(fake_slack.posts()) == 1 and len(fake_llm.requests) == 1

    # No HTTP events route in Socket Mode, but health checks are served.
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gateway.base}/slack/events", data="{}") as resp:
            assert resp.status in (404, 405)
        async with http.get(f"{gateway.base}/healthz") as resp:
            assert resp.status == 200
