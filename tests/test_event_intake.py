"""Events in over real HTTP (SPEC §17, issue 34): deliveries of each kind of source to the running app, and the
answer and stored row each gets — good, forged, stale, oversized, duplicate, filtered, flooded, unknown,
ping, malformed. Then two replicas on one database: the rate and the dedupe hold across them."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from core.store import Database
from core.store.tables import WebhookEventRow
from core.store.webhook_events import WebhookEventStore
from core.webhooks.intake import WebhookIntake
from core.webhooks.model import EventSource
from tests.conftest import GatewayClient
from tests.event_requests import (
    BEARER_TOKEN,
    GITHUB_SECRET,
    MAX_BODY,
    PUSH,
    alert,
    bearer,
    dumps,
    github,
    signed,
    standard,
)
from tests.fakes.core import ShiftedClock

pytestmark = pytest.mark.usefixtures("clean_env")


@pytest.fixture
def clock() -> ShiftedClock:
    return ShiftedClock.at_a_minute_start()


async def post(gw: GatewayClient, name: str, delivery: tuple[bytes, dict[str, str]]) -> tuple[int, str, Any]:
    body, headers = delivery
    async with gw.http.post(f"{gw.base}/events/{name}", data=body, headers=headers) as resp:
        return resp.status, await resp.text(), resp.headers


async def rows(gw: GatewayClient) -> list[WebhookEventRow]:
    """The stored events, oldest first, each with the status the intake gave it: the processor takes a queued one
    on to answered or failed meanwhile (here: failed, as no destination resolves), which is not the intake's."""
    found = list(reversed(await WebhookEventStore(gw.app.db).list(limit=1000)))
    for row in found:
        if row.status in ("answered", "failed"):
            row.status = "queued"
    return found


def refusals(gw: GatewayClient) -> dict[tuple[str, str], int]:
    assert gw.app.intake is not None
    return gw.app.intake.refusals.counts()


async def test_github_deliveries(events: GatewayClient) -> None:
    gw = events
    assert (await post(gw, "gh", github("push", PUSH, delivery="d-1")))[:2] == (202, "accepted")
    status, text, _ = await post(gw, "gh", github("pull_request", {**PUSH, "action": "opened"}, delivery="d-2"))
    assert (status, text) == (202, "accepted")
    # Forged: another secret, no signature, a signature of another body.
    assert (await post(gw, "gh", github("push", PUSH, secret="not-the-secret")))[0] == 401
    body, headers = github("push", PUSH)
    assert (await post(gw, "gh", (body, {k: v for k, v in headers.items() if k != "X-Hub-Signature-256"})))[0] == 401
    assert (await post(gw, "gh", (body + b" ", headers)))[0] == 401
    # Redelivered (GitHub's "Redeliver" keeps the delivery id): 2xx, nothing new.
    assert (await post(gw, "gh", github("push", PUSH, delivery="d-1")))[:2] == (200, "already received")
    # Left out by the source's events: 202, recorded, nothing started.
    assert (await post(gw, "gh", github("issues", {"action": "opened"}, delivery="d-3")))[:2] == (202, "filtered out")
    # GitHub's ping: 200, not stored.
    assert (await post(gw, "gh", github("ping", {"zen": "Keep it logically awesome.", "hook_id": 1})))[:2] == (
        200, "pong")
    # Malformed: signed, but not JSON, not an object, or without its headers.
    assert (await post(gw, "gh", github("push", None, body=b"{not json")))[0] == 400
    assert (await post(gw, "gh", github("push", [1, 2])))[0] == 400
    body, headers = github("push", PUSH)
    assert (await post(gw, "gh", (body, {k: v for k, v in headers.items() if k != "X-GitHub-Delivery"})))[0] == 400
    stored = [(r.event_type, r.delivery_id, r.status, r.thread_key) for r in await rows(gw)]
    assert stored == [("push", "d-1", "queued", "acme/api"), ("pull_request.opened", "d-2", "queued", "acme/api"),
                      ("push", "d-1", "duplicate", "acme/api"), ("issues.opened", "d-3", "filtered", None)]
    assert refusals(gw) == {("gh", "signature"): 3, ("gh", "malformed"): 3}


async def test_standard_webhooks_deliveries(events: GatewayClient, clock: ShiftedClock) -> None:
    gw = events
    paid = {"type": "invoice.paid", "data": {"id": "in_1"}}
    assert (await post(gw, "sw", standard(paid, clock.now(), msg_id="msg_1")))[:2] == (202, "accepted")
    # Forged: another key. Stale: signed well, but 6 minutes ago (or ahead): a replay of an old capture.
    assert (await post(gw, "sw", standard(paid, clock.now(), key=b"another key")))[0] == 401
    assert (await post(gw, "sw", standard(paid, clock.now() - timedelta(minutes=6))))[0] == 401
    assert (await post(gw, "sw", standard(paid, clock.now() + timedelta(minutes=6))))[0] == 401
    assert (await post(gw, "sw", standard(paid, clock.now() - timedelta(minutes=4))))[0] == 202  # within 5 minutes
    assert (await post(gw, "sw", standard(paid, clock.now(), msg_id="msg_1")))[:2] == (200, "already received")
    assert (await post(gw, "sw", standard({"type": "customer.created"}, clock.now())))[:2] == (202, "filtered out")
    assert (await post(gw, "sw", standard({"data": {}}, clock.now())))[0] == 400  # no type
    body, headers = standard(paid, clock.now())
    assert (await post(gw, "sw", (body, {k: v for k, v in headers.items() if k != "webhook-id"})))[0] == 401
    assert [(r.event_type, r.status) for r in await rows(gw)] == [
        ("invoice.paid", "queued"), ("invoice.paid", "queued"), ("invoice.paid", "duplicate"),
        ("customer.created", "filtered")]
    assert refusals(gw) == {("sw", "signature"): 1, ("sw", "stale"): 2, ("sw", "malformed"): 1,
                            ("sw", "unsigned"): 1}


async def test_bearer_deliveries(events: GatewayClient) -> None:
    gw = events
    assert (await post(gw, "am", bearer(alert())))[:2] == (202, "accepted")
    assert (await post(gw, "am", bearer(alert())))[:2] == (202, "accepted")  # no delivery id: never a duplicate
    assert (await post(gw, "am", bearer(alert("resolved"))))[:2] == (202, "filtered out")
    assert (await post(gw, "am", bearer(alert(), token=BEARER_TOKEN + "x")))[0] == 401
    assert (await post(gw, "am", (dumps(alert()), {"Authorization": f"Basic {BEARER_TOKEN}"})))[0] == 401
    assert (await post(gw, "am", bearer(None, body=b'"just a string"')))[0] == 400
    body, headers = bearer(None, body=gzip.compress(dumps(alert())))
    assert (await post(gw, "am", (body, {**headers, "Content-Encoding": "gzip"})))[:2] == (
        400, "compressed bodies are not accepted")  # inflated, a small body could be any size
    stored = [(r.event_type, r.delivery_id, r.status, r.thread_key) for r in await rows(gw)]
    group = '{}:{alertname="DiskFull"}'
    assert stored == [("firing", None, "queued", group), ("firing", None, "queued", group),
                      ("resolved", None, "filtered", None)]


@pytest.mark.parametrize(("source", "kind"), [("flood-gh", "github"), ("flood-sw", "standard"), ("flood", "bearer")])
async def test_a_flood_is_answered_429_and_nothing_of_it_is_stored(events: GatewayClient, clock: ShiftedClock,
                                                                   source: str, kind: str) -> None:
    gw = events
    # Each a different event (a GitHub body seen before is a duplicate, whatever its delivery id).
    answers = [await post(gw, source, signed(kind, clock.now(), body=dumps({"type": "invoice.paid", "status": "firing",
                                                                            "n": n}))) for n in range(5)]
    assert [status for status, _, _ in answers] == [202, 202, 202, 429, 429]
    retry_after = int(answers[3][2]["Retry-After"])
    assert 1 <= retry_after <= 60
    assert len(await rows(gw)) == 3
    assert refusals(gw) == {(source, "rate"): 2}


async def test_unknown_sources_and_sources_without_a_secret(events: GatewayClient) -> None:
    gw = events
    assert (await post(gw, "nope", bearer(alert())))[0] == 404
    assert (await post(gw, "GH", bearer(alert())))[0] == 404
    # The secret_env is not set: nothing gets in, however it is signed.
    assert (await post(gw, "nosecret", github("push", PUSH, secret="")))[0] == 401
    assert (await post(gw, "nosecret", github("push", PUSH)))[0] == 401
    async with gw.http.get(f"{gw.base}/events/gh") as resp:
        assert resp.status == 405
    assert await rows(gw) == []


@pytest.mark.parametrize(("source", "kind"), [("gh", "github"), ("sw", "standard"), ("am", "bearer")])
async def test_a_body_over_the_cap_is_413(events: GatewayClient, clock: ShiftedClock, source: str, kind: str) -> None:
    gw = events
    fits = dumps({"type": "invoice.paid", "status": "firing", "pad": "x" * (MAX_BODY - 80)})
    fits += b" " * (MAX_BODY - len(fits))
    assert len(fits) == MAX_BODY and (await post(gw, source, signed(kind, clock.now(), body=fits)))[0] == 202
    assert (await post(gw, source, signed(kind, clock.now(), body=fits + b" ")))[0] == 413  # signed, all the same
    assert refusals(gw) == {(source, "too_large"): 1}
    assert len(await rows(gw)) == 1


async def test_an_oversized_chunked_body_is_read_no_further_than_the_cap(events: GatewayClient) -> None:
    """Ten MiB offered without a length: the answer comes once the cap is passed, before more is sent (the
    body waits for it)."""
    gw = events
    answered = asyncio.Event()
    sent = 0

    async def body() -> AsyncIterator[bytes]:
        nonlocal sent
        while sent < 10 * 1024 * 1024:
            if sent > MAX_BODY + 1:  # the server has all it may read: it must answer without another byte
                await asyncio.wait_for(answered.wait(), 5)
                return
            yield b" " * 1024
            sent += 1024

    async with gw.http.post(f"{gw.base}/events/am", data=body(),
                            headers={"Authorization": f"Bearer {BEARER_TOKEN}"}) as resp:
        answered.set()
        assert resp.status == 413
        assert "Content-Length" not in resp.request_info.headers
    assert sent <= MAX_BODY + 1 + 1024
    assert await rows(gw) == []


async def test_a_declared_length_over_the_cap_is_refused_before_reading(events: GatewayClient) -> None:
    gw = events
    answered = asyncio.Event()
    sent = 0

    async def body() -> AsyncIterator[bytes]:
        nonlocal sent
        yield b" " * 1024
        sent += 1024
        await asyncio.wait_for(answered.wait(), 5)

    headers = {"Authorization": f"Bearer {BEARER_TOKEN}", "Content-Length": str(10 * 1024 * 1024)}
    async with gw.http.post(f"{gw.base}/events/am", data=body(), headers=headers) as resp:
        answered.set()
        assert resp.status == 413
    assert sent == 1024
    assert refusals(gw) == {("am", "too_large"): 1}


# -- two replicas on one database (no HTTP: two intakes, each with its own database handle) -------------------


SOURCES = [EventSource(name="gh", kind="github", secret_env="X", destination="#ops", rate_per_minute=5),
           EventSource(name="am", kind="bearer", secret_env="Y", destination="#ops", rate_per_minute=4)]


@pytest.fixture
async def replicas(store_db: Database, clock: ShiftedClock) -> AsyncIterator[tuple[WebhookIntake, WebhookIntake,
                                                                                   list[int]]]:
    queued: list[int] = []
    other = Database(store_db.url)
    secrets = {"gh": GITHUB_SECRET, "am": BEARER_TOKEN}

    def woken(event_id: int, _arrival: object) -> None:
        queued.append(event_id)

    yield (WebhookIntake(SOURCES, secrets, WebhookEventStore(store_db), clock, woken),
           WebhookIntake(SOURCES, secrets, WebhookEventStore(other), clock, woken), queued)
    await other.close()


async def test_a_delivery_racing_through_two_replicas_is_stored_once(
        replicas: tuple[WebhookIntake, WebhookIntake, list[int]]) -> None:
    one, two, queued = replicas
    body, headers = github("push", PUSH, delivery="race")
    answers = await asyncio.gather(one.deliver("gh", headers, body), two.deliver("gh", headers, body))
    assert sorted((a.status, a.text) for a in answers) == [(200, "already received"), (202, "accepted")]
    store = WebhookEventStore(one.store.db)  # type: ignore[attr-defined]
    assert [(r.status, r.delivery_id) for r in await store.list(limit=10)] == [("duplicate", "race"),
                                                                                ("queued", "race")]
    assert queued == [r.id for r in await store.queued()]  # on_queued: once, after the commit, with its id


async def test_the_rate_holds_across_two_replicas(replicas: tuple[WebhookIntake, WebhookIntake, list[int]]) -> None:
    one, two, queued = replicas
    body, headers = bearer(alert())
    answers = await asyncio.gather(*(intake.deliver("am", headers, body) for _ in range(5) for intake in (one, two)))
    assert sorted(a.status for a in answers) == [202] * 4 + [429] * 6
    assert all(a.retry_after_s for a in answers if a.status == 429)
    assert len(queued) == 4
    assert one.refusals.counts()[("am", "rate")] + two.refusals.counts()[("am", "rate")] == 6
