"""Issue 34 (events in), attacked from outside: each test is a finding that failed before its fix
(tests/test_event_intake.py and tests/test_events.py hold what the feature promises; this file what an attacker
tried against it)."""

from __future__ import annotations

import asyncio
import base64
import gzip
import hashlib
import hmac
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from multidict import CIMultiDict
from sqlalchemy import event

from bot.settings import Settings
from core.dispatcher import Dispatcher
from core.events import EventBus
from core.store import Database
from core.store.webhook_events import WebhookEventStore
from core.webhooks.model import EventArrival, EventSource
from core.webhooks.processor import EventProcessor, ProcessorSettings
from core.webhooks.signatures import secret_problem
from core.webhooks.thread_key import MAX_KEY, render_thread_key
from tests.conftest import GatewayClient
from tests.event_requests import (
    MAX_BODY,
    PUSH,
    dumps,
    events_config,
    github,
    signed,
)
from tests.fakes.core import ShiftedClock
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import block_action
from tests.test_events import DEST, SECRET, _dest_posts, _toml, _workflow_run, deliver, settled

pytestmark = pytest.mark.usefixtures("clean_env")

MAX_EVENT_BODY = 1024 * 1024  # EVENT_MAX_BODY_BYTES by default


@pytest.fixture
def clock() -> ShiftedClock:
    return ShiftedClock.at_a_minute_start()


async def post(gw: GatewayClient, name: str, delivery: tuple[bytes, dict[str, str]]) -> tuple[int, str]:
    body, headers = delivery
    async with gw.http.post(f"{gw.base}/events/{name}", data=body, headers=headers) as resp:
        return resp.status, await resp.text()


async def test_an_outsiders_thread_key_cannot_name_another_events_own_conversation(
        make_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
        tmp_path: Path, monkeypatch: Any) -> None:
    """An event whose key renders empty has a conversation of its own; it was the key "#<its id>", so a payload
    whose field reads "#1" joined event 1's conversation: it read what that turn saw (tool results too) and its
    answer went into event 1's thread."""
    monkeypatch.setenv("CI_WEBHOOK_SECRET", SECRET)
    toml = _toml(tmp_path, thread='"{workflow_run.display_title}"')
    gateway: GatewayClient = await start_gateway(make_settings(bot_config=toml))
    fake_llm.then(Reply("run 1: private details"))
    assert await deliver(gateway.base, _workflow_run(1), "d-1") == 202  # no display_title: its own conversation
    [first] = await settled(gateway, 1)
    fake_llm.then(Reply("what did run 1 say?"))
    attacker = _workflow_run(2)
    attacker["workflow_run"]["display_title"] = f"#{first.id}"
    assert await deliver(gateway.base, attacker, "d-2") == 202
    first, second = await settled(gateway, 2)
    assert second.thread_key == f"#{first.id}"
    assert second.session_id != first.session_id
    assert "run 1: private details" not in str(fake_llm.requests[-1]["messages"])


async def test_a_captured_github_delivery_sent_again_under_a_new_delivery_id_is_a_duplicate(
        events: GatewayClient) -> None:
    """X-GitHub-Delivery is not signed: whoever saw one delivery (a repository admin reads every delivery's headers
    and body, the signature too, under the webhook's Recent Deliveries) could send it again with a fresh id, as
    often as the rate lets, each a new turn. The signature signs the body: the same body is the same delivery."""
    gw = events
    body, headers = github("push", PUSH, delivery="d-1")
    assert await post(gw, "gh", (body, headers)) == (202, "accepted")
    for forged in ("d-2", "D-1", "d-1 "):
        assert await post(gw, "gh", (body, headers | {"X-GitHub-Delivery": forged})) == (200, "already received")
    rows = sorted(await WebhookEventStore(gw.app.db).list(), key=lambda r: r.id or 0)
    assert [r.status in ("queued", "answered", "failed") for r in rows] == [True, False, False, False]
    assert {r.status for r in rows[1:]} == {"duplicate"}
    # Another body (another event) under the first id is still GitHub's redelivery of d-1: a duplicate too.
    other, _ = github("push", PUSH | {"after": "f" * 40}, delivery="d-1")
    assert await post(gw, "gh", (other, github("push", None, body=other, delivery="d-1")[1])) == \
        (200, "already received")


@pytest.mark.parametrize(("source", "kind"), [("flood-gh", "github"), ("flood-sw", "standard")])
async def test_a_captured_delivery_sent_over_and_over_does_not_use_up_the_senders_rate(
        events: GatewayClient, clock: ShiftedClock, source: str, kind: str) -> None:
    """Duplicates counted in the source's rate: one captured delivery, sent again and again (a duplicate each
    time), used up the minute and the sender's real events were refused 429 (GitHub does not retry them: lost).
    A duplicate starts nothing: it does not count against new deliveries, and only so many are recorded."""
    gw = events  # flood-gh and flood-sw take 3 a minute
    captured = signed(kind, clock.now(), body=dumps({"type": "invoice.paid", "n": 0}))
    assert (await post(gw, source, captured))[0] == 202
    assert [(await post(gw, source, captured))[0] for _ in range(10)] == [200] * 10
    for n in (1, 2):
        assert (await post(gw, source, signed(kind, clock.now(), body=dumps({"type": "invoice.paid", "n": n}))))[0] \
            == 202
    assert (await post(gw, source, signed(kind, clock.now(), body=dumps({"type": "invoice.paid", "n": 3}))))[0] \
        == 429  # the rate still holds for new deliveries
    stored = await WebhookEventStore(gw.app.db).list(source=source)
    assert sum(r.status == "duplicate" for r in stored) == 3  # recorded up to the rate, then only answered
    assert len(stored) == 6


def test_a_huge_payload_field_does_not_hold_the_event_loop_while_its_thread_key_renders() -> None:
    """The key is rendered in the intake, on the event loop, before the rate is counted: each field was copied
    whole and filtered a character at a time, so a field of a megabyte (a commit message, a comment body) under
    a template naming it a few times held every request of the process for seconds per delivery."""
    payload = {"a": "x" * MAX_EVENT_BODY, "b": "\x00" * 1000 + "id-7"}
    started = time.perf_counter()
    key = render_thread_key("{a}" * 85, payload)
    assert time.perf_counter() - started < 1.0  # it took 10 s
    assert key == "x" * MAX_KEY
    assert render_thread_key("{b}/{a}", {"b": "id-7", "a": "short"}) == "id-7/short"  # what a key always was


def test_bot_doctor_fails_a_standard_webhooks_key_short_enough_to_guess() -> None:
    """A GitHub secret or a bearer token under 16 characters fails `bot doctor`; a `whsec_` key only had to
    open, so `whsec_AA==` (one byte: 256 keys to try, and refusals are not rate limited) passed."""
    assert secret_problem("standard", "whsec_AA==") is not None
    assert secret_problem("standard", "whsec_" + base64.b64encode(b"k" * 15).decode()) is not None
    assert secret_problem("standard", "whsec_" + base64.b64encode(b"k" * 24).decode()) is None


async def test_two_replicas_taking_one_github_body_under_two_ids_store_one_queued_row(store_db: Database) -> None:
    """The same captured body sent at once to two replicas under two fresh ids: one is the event, the other its
    duplicate (the unique index on the body settles the race, as the one on the delivery id does)."""
    other = Database(store_db.url)
    stores = (WebhookEventStore(store_db), WebhookEventStore(other))
    try:
        for n in range(5):
            got = await asyncio.gather(*(store.receive(_github_arrival(f"r-{n}-{i}", body=f'{{"n": {n}}}'))
                                         for i, store in enumerate(stores)))
            assert sorted(g.outcome for g in got) == ["duplicate", "queued"], got
        assert len(await stores[0].queued()) == 5
    finally:
        await other.close()


def _github_arrival(delivery_id: str, *, body: str) -> EventArrival:
    return EventArrival(source="gh", kind="github", event_type="push", delivery_id=delivery_id, payload=body,
                        thread_key=None, filtered=False, rate_per_minute=60, now=datetime.now(UTC),
                        body_digest=hashlib.sha256(body.encode()).hexdigest())


async def test_following_the_table_does_not_read_every_queued_payload_at_every_poll(store_db: Database) -> None:
    """A backlog of queued events (a thread whose turns take their time, a model down for an hour) was read
    whole, payloads of up to a megabyte each, at every poll (2 s): 60 events a minute of a megabyte made the
    process read gigabytes a minute and hold them. The poll needs their ids; each payload is read when its
    event is taken."""
    store = WebhookEventStore(store_db)
    backlog = 20
    for n in range(backlog):
        await store.receive(_github_arrival(f"b-{n}", body=f'{{"n": {n}, "pad": "{"x" * 1000}"}}'))
    never = asyncio.Event()

    async def resolve(destination: str) -> str:  # the platform is slow to answer: the events stay queued
        await never.wait()
        return "C1"

    source = EventSource(name="gh", kind="github", secret_env="X", destination="#ops")
    # Only the table is followed here: no turn is accepted (the destination never resolves).
    dispatcher = cast(Dispatcher, SimpleNamespace(bus=EventBus()))
    processor = EventProcessor(store, dispatcher, ShiftedClock(), {"gh": source}, resolve,
                               ProcessorSettings(channel="slack", poll_s=0.01))
    payload_reads: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "webhook_events.payload" in statement:
            payload_reads.append(statement)

    event.listen(store_db.engine.sync_engine, "before_cursor_execute", seen)
    try:
        await processor.start()
        await asyncio.sleep(0.3)  # some thirty polls
        await processor.stop()
    finally:
        event.remove(store_db.engine.sync_engine, "before_cursor_execute", seen)
    assert len(payload_reads) <= backlog  # each event's payload read once, when it is taken (it was every poll)


async def test_a_flood_above_the_take_pace_holds_neither_its_payloads_nor_unbounded_tasks(store_db: Database) -> None:
    """A source whose rate_per_minute lets it send faster than events are taken (25 a second): each stored event
    waited for its pace as a task holding its whole payload (a megabyte each), with no bound on their number. Behind
    a backlog the payload is left in the table (read when the event's turn comes), and at most 1,000 events are
    being taken at once; the table poll takes the rest later."""
    store = WebhookEventStore(store_db)
    never = asyncio.Event()

    async def resolve(destination: str) -> str:
        await never.wait()
        return "C1"

    source = EventSource(name="gh", kind="github", secret_env="X", destination="#ops", rate_per_minute=10_000)
    dispatcher = cast(Dispatcher, SimpleNamespace(bus=EventBus()))
    processor = EventProcessor(store, dispatcher, ShiftedClock(), {"gh": source}, resolve,
                               ProcessorSettings(channel="slack", poll_s=3600))
    taken: list[object] = []

    async def answer(event_id: int, arrival: object) -> None:  # what each take carries, then its pace
        taken.append(arrival)
        await never.wait()

    processor._answer = answer  # type: ignore[method-assign]
    await processor.start()
    try:
        arrival = _github_arrival("f-0", body='{"pad": "' + "x" * 1000 + '"}')
        processor._next_take = asyncio.get_running_loop().time() + 60  # a backlog is ahead
        for n in range(1500):
            processor.queued(n + 1, arrival)
        await asyncio.sleep(0)
        assert len(taken) == 1000 and not any(taken)  # bounded, and none holds its payload
    finally:
        await processor.stop()


TWO_SOURCES = """
[[event_sources]]
name = "ci"
kind = "github"
secret_env = "CI_WEBHOOK_SECRET"
destination = "#ops"
trust = "member"

[[event_sources]]
name = "pub"
kind = "github"
secret_env = "CI_WEBHOOK_SECRET"
destination = "#ops"
trust = "member"
"""


async def test_an_always_allow_given_for_one_sources_call_does_not_cover_another_sources_events(
        make_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
        tmp_path: Path, monkeypatch: Any) -> None:
    """Every event turn (and every schedule's firing) posting to #ops lived at the place "slack:dest:C…", and
    grants are by place: "Always allow" given to a call of the trusted CI source let the same call run unasked
    in the events of a source whose payloads outsiders write (a public repository's PR bodies)."""
    monkeypatch.setenv("CI_WEBHOOK_SECRET", SECRET)
    toml = tmp_path / "bot.toml"
    toml.write_text(TWO_SOURCES)
    gateway: GatewayClient = await start_gateway(make_settings(bot_config=toml, bot_approvers="U0ONCALL"))
    call = ("shell_run", {"command": "echo rerun-tests"})
    fake_llm.then(Reply(tool_calls=[call]))
    assert await deliver(gateway.base, _workflow_run(1), "d-1") == 202  # to "ci"
    card = (await fake_slack.wait_for("chat.postMessage"))[0]
    request_id = card.params["blocks"][-1]["elements"][0]["value"]
    fake_llm.then(Reply("re-ran them"))
    await gateway.interact(block_action("approval:always", request_id, user="U0ONCALL", channel=DEST))
    await settled(gateway, 1)

    fake_llm.then(Reply(tool_calls=[call]), Reply("ran it for the outsider"))
    body = json.dumps(_workflow_run(2)).encode()
    headers = {"Content-Type": "application/json", "X-GitHub-Event": "workflow_run", "X-GitHub-Delivery": "p-1",
               "X-Hub-Signature-256": "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()}
    async with gateway.http.post(f"{gateway.base}/events/pub", data=body, headers=headers) as resp:
        assert resp.status == 202
    async with asyncio.timeout(10):
        while True:  # until the outsider's event asks, or its call has run
            texts = [json.dumps(p.params) for p in _dest_posts(fake_slack)[1:]]
            if any("echo rerun-tests" in t or "ran it for the outsider" in t for t in texts):
                break
            await asyncio.sleep(0.02)
    assert not any("ran it for the outsider" in t for t in texts)  # it ran unasked, under ci's grant
    assert any("echo rerun-tests" in t and "approval:approve" in t for t in texts)  # a card asks instead


async def test_an_event_id_is_never_given_twice_even_after_pruning_took_the_newest(store_db: Database) -> None:
    """SQLite gives the next row the largest id + 1: once the retention pruned every event (a quiet month), the
    next event got id 1 again. Its turn is deduplicated by ``event:<id>`` in its conversation, so an event whose
    conversation had taken event 1 (a key's, or "own-1") was taken for that old one: never answered, and marked
    answered all the same."""
    store = WebhookEventStore(store_db)
    first = await store.receive(_github_arrival("old", body='{"n": 1}'))
    assert first.event_id is not None
    await store.finish(first.event_id, status="answered", note=None, now=datetime.now(UTC))
    assert await store.prune(datetime.now(UTC) + timedelta(days=1)) == 1
    again = await store.receive(_github_arrival("new", body='{"n": 2}'))
    assert again.event_id is not None and again.event_id > first.event_id


async def test_a_second_content_encoding_header_does_not_slip_a_compressed_body_in(events: GatewayClient) -> None:
    """Only the first Content-Encoding was looked at, while aiohttp inflates by another: "identity" then "gzip"
    got a compressed body in (the cap still held, on the inflated bytes: memory stayed flat for a 400 MB bomb).
    Compressed bodies are refused, whichever header says so."""
    gw = events
    body, headers = github("push", PUSH)
    sent = CIMultiDict(headers)
    sent.add("Content-Encoding", "identity")
    sent.add("Content-Encoding", "gzip")
    async with gw.http.post(f"{gw.base}/events/gh", data=gzip.compress(body), headers=sent) as resp:
        assert (resp.status, await resp.text()) == (400, "compressed bodies are not accepted")
    assert await WebhookEventStore(gw.app.db).list() == []


async def test_a_body_that_never_finishes_arriving_does_not_hold_its_connection_and_memory(
        make_settings: Callable[..., Settings], start_gateway: Any, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The body is read (up to the cap) before its signature can be checked, and aiohttp sets no time limit on
    it: anyone could open connections, send all but the last byte of a megabyte each and stop, and each held a
    megabyte and a connection for as long as they liked (thousands of them: the process's memory). A body that
    has not arrived in time is answered 408 and its connection closed."""
    monkeypatch.setattr("bot.event_routes.BODY_READ_TIMEOUT_S", 0.3, raising=False)
    config = events_config(tmp_path, monkeypatch)
    gw: GatewayClient = await start_gateway(make_settings(bot_config=config, event_max_body_bytes=MAX_BODY))
    host, port = gw.base.split("//")[1].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST /events/gh HTTP/1.1\r\nHost: x\r\nContent-Length: 4000\r\nX-GitHub-Event: push\r\n"
                 b"X-GitHub-Delivery: slow\r\nX-Hub-Signature-256: sha256=00\r\n\r\n" + b"{" * 3999)
    await writer.drain()
    try:
        # What was read is let go; aiohttp then discards what still comes for its lingering time, and closes.
        assert (await asyncio.wait_for(reader.readline(), 3)).split(b" ")[1] == b"408"
    finally:
        writer.close()
