"""Events in, fuzzed (issue 34): random headers and bodies, signed and not, sent to every kind of source over real
HTTP never get a 5xx, and leave the app taking good deliveries; the checks under them never raise on any input."""

from __future__ import annotations

import base64
import json
import random
import string
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.settings import Settings
from core.webhooks.signatures import SignatureRefused, verify_bearer, verify_github, verify_standard
from core.webhooks.thread_key import render_thread_key, template_problem
from tests.conftest import GatewayClient
from tests.event_requests import BEARER_TOKEN, MAX_BODY, PUSH, alert, bearer, events_config, github, standard

pytestmark = pytest.mark.usefixtures("clean_env")

FUZZ_TOML = """
[[event_sources]]
name = "gh"
kind = "github"
secret_env = "TEST_GH_SECRET"
destination = "#ops"
events = ["push", "pull_request.*"]
thread = "{repository.full_name}/{a.0.b}"
rate_per_minute = 10000

[[event_sources]]
name = "sw"
kind = "standard"
secret_env = "TEST_SW_KEY"
destination = "#ops"
thread = "{data.id}"
rate_per_minute = 10000

[[event_sources]]
name = "am"
kind = "bearer"
secret_env = "TEST_AM_TOKEN"
destination = "#ops"
thread = "{groupKey}"
rate_per_minute = 10000
"""
ALLOWED = {200, 202, 400, 401, 404, 405, 413, 429, 431}
HEADER_TEXT = string.ascii_letters + string.digits + string.punctuation + " \t" + "éü€"


def weird_value(rng: random.Random, depth: int = 0) -> Any:
    choice = rng.randrange(12 if depth < 3 else 8)
    return [
        lambda: None, lambda: rng.choice([True, False]), lambda: rng.randint(-2**70, 2**70), lambda: rng.random(),
        lambda: "".join(rng.choice(HEADER_TEXT) for _ in range(rng.randrange(40))),
        lambda: "\u0000\ud800\udfff\n\r\u2028" * rng.randrange(3), lambda: "x" * rng.randrange(600),
        lambda: float("inf") if rng.random() < 0.5 else -0.0,
        lambda: [weird_value(rng, depth + 1) for _ in range(rng.randrange(4))],
        lambda: {rng.choice(["type", "status", "action", "data", "id", "groupKey", "repository", "a", "0", ""]):
                 weird_value(rng, depth + 1) for _ in range(rng.randrange(5))},
        lambda: {"full_name": weird_value(rng, depth + 1), "id": weird_value(rng, depth + 1)},
        lambda: [{"b": weird_value(rng, depth + 1)}],
    ][choice]()


def weird_body(rng: random.Random) -> bytes:
    kind = rng.randrange(10)
    if kind == 0:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(200)))
    if kind == 1:
        return b"[" * rng.randrange(500, 4000)  # deep nesting
    if kind == 2:
        return json.dumps({"type": weird_value(rng), "status": weird_value(rng)}).encode("utf-16")
    if kind == 3:
        return b"\xef\xbb\xbf" + json.dumps(alert()).encode()  # a BOM
    if kind == 4:
        return json.dumps(weird_value(rng), allow_nan=True).encode()[:rng.randrange(1, 3000)]  # cut short
    if kind == 5:
        return b'{"type": 1' + b"0" * 5000 + b"}"  # an int too long to convert, over the cap too
    if kind == 6:
        return b'{"status": "firing", "n": 1' + b"0" * 4400 + b"}"  # likewise, just under the cap
    payload = {key: weird_value(rng) for key in rng.sample(["type", "status", "action", "data", "groupKey",
                                                            "repository", "a", "alerts"], rng.randrange(1, 6))}
    return json.dumps(payload, allow_nan=True).encode()[:MAX_BODY + rng.choice([0, 0, 0, 1, 100])]


def weird_header(rng: random.Random) -> str:
    length = rng.choice([0, 1, 10, 64, 300, 5000])
    return "".join(rng.choice(HEADER_TEXT) for _ in range(length)).strip()


def delivery(rng: random.Random, now: datetime) -> tuple[str, bytes, dict[str, str]]:
    source = rng.choice(["gh", "sw", "am", "none", "gh", "sw", "am"])
    body = weird_body(rng) if rng.random() < 0.8 else json.dumps(PUSH).encode()
    headers: dict[str, str]
    if source == "gh":
        event = rng.choice(["push", "pull_request", "ping", "issues", weird_header(rng)])
        body, headers = github(event or "push", None, body=body, delivery=rng.choice([weird_header(rng), None]) or None)
    elif source == "sw":
        when = now + timedelta(seconds=rng.choice([0, -299, 299, -301, 301, 10**6]))
        body, headers = standard(None, when, body=body, msg_id=rng.choice([weird_header(rng), None]) or None)
    else:
        body, headers = bearer(None, body=body)
    for name in rng.sample(["X-GitHub-Event", "X-GitHub-Delivery", "X-Hub-Signature-256", "webhook-id",
                            "webhook-timestamp", "webhook-signature", "Authorization", "Content-Type",
                            "Content-Encoding"], rng.randrange(3)):
        if rng.random() < 0.3:
            headers.pop(name, None)
        else:
            headers[name] = weird_header(rng)
    if rng.random() < 0.05:
        headers["Content-Length"] = str(rng.choice([0, 10, MAX_BODY + 1, 2**40]))
    return source, body, headers


@pytest.fixture
async def fuzzed(make_settings: Callable[..., Settings], start_gateway: Any, tmp_path: Path,
                 monkeypatch: pytest.MonkeyPatch) -> GatewayClient:
    config = events_config(tmp_path, monkeypatch)
    config.write_text(FUZZ_TOML, encoding="utf-8")
    gateway: GatewayClient = await start_gateway(make_settings(bot_config=config, event_max_body_bytes=MAX_BODY))
    return gateway


async def test_random_deliveries_never_get_a_5xx(fuzzed: GatewayClient) -> None:
    gw = fuzzed
    # A connection per delivery: a Content-Length that lies about the body spoils the connection it came on, not
    # the next delivery's.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
        await fuzz(gw, http)


async def fuzz(gw: GatewayClient, http: aiohttp.ClientSession) -> None:
    rng = random.Random(34)
    seen: dict[int, int] = {}
    for _ in range(400):
        source, body, headers = delivery(rng, datetime.now(UTC))
        try:
            async with http.post(f"{gw.base}/events/{source}", data=body, headers=headers) as resp:
                await resp.read()
                status = resp.status
        except (ValueError, UnicodeEncodeError):
            continue  # a header the client itself will not send

        assert status in ALLOWED, (status, source, body[:200], headers)
        seen[status] = seen.get(status, 0) + 1
    assert {202, 400, 401, 404} <= set(seen), seen  # the fuzz reached past the signature checks
    # Still taking deliveries, and everything stored is readable.
    body, headers = bearer(alert())
    async with http.post(f"{gw.base}/events/am", data=body, headers=headers) as resp:
        assert resp.status == 202
    assert gw.app.intake is not None
    from core.store.webhook_events import WebhookEventStore

    stored = await WebhookEventStore(gw.app.db).list(limit=1000)
    assert stored and all(row.thread_key is None or (0 < len(row.thread_key) <= 255 and row.thread_key.isprintable())
                          for row in stored)


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner,
                                                                                 max_size=4), max_leaves=8)


@settings(max_examples=120, deadline=None)
@given(template=st.text(max_size=40) | st.sampled_from(["{a}", "{a.0.b}", "{a.b}-{c}"]), payload=JSON)
def test_thread_keys_never_raise(template: str, payload: Any) -> None:
    key = render_thread_key(template, payload)
    assert key is None or (0 < len(key) <= 255 and key.isprintable() and key == key.strip())
    template_problem(template)


@settings(max_examples=150, deadline=None)
@given(msg_id=st.text(max_size=20) | st.none(), stamp=st.text(max_size=20) | st.none(),
       signature=st.text(max_size=60) | st.none(), body=st.binary(max_size=50), token=st.text(max_size=20))
def test_signature_checks_never_raise_but_their_refusal(msg_id: str | None, stamp: str | None,
                                                        signature: str | None, body: bytes, token: str) -> None:
    try:
        verify_standard(base64.b64decode("c2VjcmV0"), msg_id, stamp, signature, body, datetime.now(UTC))
    except SignatureRefused:
        pass
    assert verify_github(b"secret", body, signature) in (True, False)
    assert verify_bearer(BEARER_TOKEN, token) is False or token.strip().lower().startswith("bearer")
