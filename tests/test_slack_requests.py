"""Request verification and bad input at /slack/events: 401 or 4xx, never a 500, nothing reaches the model."""

from __future__ import annotations

import json
import time

import pytest

from tests.conftest import GatewayClient
from tests.fakes.llm import FakeLLM
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import command_body, dumps, event_body, mention, signed_headers


async def test_unsigned_request_is_refused(gateway: GatewayClient, fake_llm: FakeLLM) -> None:
    body = dumps(event_body(mention("hi")))
    resp = await gateway.post_raw(body, {"Content-Type": "application/json"})
    assert resp.status == 401
    await gateway.idle()
    assert fake_llm.requests == []


async def test_wrongly_signed_request_is_refused(gateway: GatewayClient, fake_llm: FakeLLM) -> None:
    body = dumps(event_body(mention("hi")))
    resp = await gateway.post_raw(body, signed_headers(body, secret="not-the-secret"))
    assert resp.status == 401
    assert fake_llm.requests == []


async def test_stale_request_is_refused(gateway: GatewayClient, fake_llm: FakeLLM) -> None:
    body = dumps(event_body(mention("hi")))
    resp = await gateway.post_raw(body, signed_headers(body, timestamp=int(time.time()) - 6 * 60))
    assert resp.status == 401
    await gateway.idle()
    assert fake_llm.requests == []


async def test_unsigned_garbage_is_refused_as_unsigned(gateway: GatewayClient) -> None:
    resp = await gateway.post_raw("{not json", {"Content-Type": "application/json"})
    assert resp.status == 401


@pytest.mark.parametrize(
    "body",
    [
        "{not json",
        "[1, 2, 3]",
        json.dumps({"type": "event_callback", "team_id": "T1", "event_id": "Ev1", "event": "not an object"}),
        json.dumps({"type": "event_callback", "team_id": "T1", "event_id": "Ev2",
                    "event": {"type": "app_mention", "text": "<@UBOT> hi", "ts": "1.1"}}),  # no channel, user
        json.dumps({"type": "event_callback", "team_id": "T1", "event_id": "Ev3",
                    "event": {"type": "app_mention", "user": "U1", "channel": "C1", "ts": "1.2", "text": 42}}),
        json.dumps({"type": "event_callback", "team_id": "T1", "event_id": "Ev4",
                    "event": {"type": "app_mention", "user": ["U1"], "channel": "C1", "ts": "1.3", "text": "x"}}),
        json.dumps({"type": "event_callback", "team_id": "T1"}),
        json.dumps({"type": "something_else"}),
    ],
)
async def test_malformed_signed_payloads_get_a_4xx(
    gateway: GatewayClient, fake_llm: FakeLLM, fake_slack: FakeSlack, body: str
) -> None:
    resp = await gateway.post_raw(body, signed_headers(body))
    assert 400 <= resp.status < 500, resp.status
    await gateway.idle()
    assert fake_llm.requests == []
    assert fake_slack.posts() == []


async def test_url_verification_challenge_is_answered(gateway: GatewayClient) -> None:
    body = json.dumps({"token": "legacy", "challenge": "abc123", "type": "url_verification"})
    async with gateway.http.post(f"{gateway.base}/slack/events", data=body, headers=signed_headers(body)) as resp:
        assert resp.status == 200
        assert (await resp.json())["challenge"] == "abc123"


@pytest.mark.parametrize(("text", "expected"), [("help", "Mention me"), ("status", "I'm up"), ("bogus", "don't know")])
async def test_slash_command(gateway: GatewayClient, text: str, expected: str) -> None:
    body = command_body(text)
    headers = signed_headers(body, content_type="application/x-www-form-urlencoded")
    async with gateway.http.post(f"{gateway.base}/slack/events", data=body, headers=headers) as resp:
        assert resp.status == 200
        assert expected in await resp.text()  # ack(text=...) answers in plain text: an ephemeral reply


async def test_health_and_readiness(gateway: GatewayClient) -> None:
    for path, expected in (("/healthz", "ok"), ("/readyz", "ready")):
        async with gateway.http.get(f"{gateway.base}{path}") as resp:
            assert resp.status == 200
            assert (await resp.json())["status"] == expected
