"""Durable delivery: an answer Slack does not take is retried (across restarts) and lands exactly once."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from slack_sdk.web.async_client import AsyncWebClient
from sqlmodel import col, select

from core.model import DeliveryStatus, SessionInfo, SessionStatus
from core.ports import DeliveryId
from core.store.schedules import ScheduleStore
from core.store.tables import DeliveryRow, TurnRow
from tests.bot_process import BotProcess, run_cli, send_event, slack_env
from tests.conftest import GatewayClient
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.slack_api import REFUSED_POST, Failure, FakeSlack
from tests.slack_requests import mention

FAST = {"delivery_retry_base_s": 0.05}  # retries 50 ms, 100 ms, 200 ms… apart: an outage of seconds is short
THREAD = "1700000000.000001"


def _answers(fake_slack: FakeSlack, text: str) -> list[Any]:
    return [c for c in fake_slack.posts() if c.params.get("text") == text]


async def _turn(gateway: GatewayClient, event: dict[str, Any]) -> int:
    """The (latest) turn of the thread ``event`` started, once it exists."""
    session = f"slack:T1:{event['channel']}:{event.get('thread_ts') or event['ts']}"
    async with asyncio.timeout(10):
        while True:
            async with gateway.app.db.read() as s:
                found = (await s.exec(select(TurnRow.id).where(TurnRow.session_id == session)
                                      .order_by(col(TurnRow.id).desc()))).first()
            if found is not None:
                return int(found)
            await asyncio.sleep(0.02)


async def _row(gateway: GatewayClient, turn_id: int) -> DeliveryRow:
    async with gateway.app.db.read() as s:
        row = await s.get(DeliveryRow, turn_id)
    assert row is not None
    return row


@pytest.fixture
async def retrying(make_settings: Any, start_gateway: Any) -> GatewayClient:
    client: GatewayClient = await start_gateway(make_settings(**FAST))
    return client


async def test_an_answer_finished_during_an_outage_lands_once(retrying: GatewayClient, fake_slack: FakeSlack) -> None:
    fake_slack.outage(seconds=1.5)  # Slack's Web API answers 503, as in an incident
    event = mention("are you there?")
    await retrying.send_event(event)
    await fake_slack.wait_for(REFUSED_POST, 2)  # refused, and refused again on a retry
    turn = await _turn(retrying, event)
    outcome = await asyncio.wait_for(retrying.app.deliveries.wait(turn), 15)
    answers = _answers(fake_slack, "echo: are you there?")
    assert len(answers) == 1
    assert answers[0].params["thread_ts"] == event["ts"]
    install = await retrying.app.deliveries.store.install_id(datetime.now(UTC))
    assert answers[0].params["metadata"] == {"event_type": "bot_delivery", "event_payload": {
        "delivery_id": turn, "install": install, "session": f"slack:T1:C1:{event['ts']}", "chunk": 0, "chunks": 1}}
    landed = [m for m in fake_slack.messages if m["text"] == "echo: are you there?"]
    assert outcome.error is None and outcome.ref == landed[0]["ts"]
    row = await _row(retrying, turn)
    assert row.status == DeliveryStatus.DELIVERED and row.attempts >= 3 and row.ref == outcome.ref


async def test_a_post_that_landed_but_whose_response_was_lost_is_not_posted_again(
    retrying: GatewayClient, fake_slack: FakeSlack
) -> None:
    fake_slack.outage(calls=1, lands=True)
    event = mention("did it land?")
    await retrying.send_event(event)
    outcome = await asyncio.wait_for(retrying.app.deliveries.wait(await _turn(retrying, event)), 15)
    assert len(_answers(fake_slack, "echo: did it land?")) == 1
    assert outcome.ref == fake_slack.messages[0]["ts"]
    looked = fake_slack.of("conversations.replies")
    assert looked and looked[0].params["ts"] == event["ts"]
    assert looked[0].params["include_all_metadata"] in ("1", "true")


async def test_a_thread_the_bot_cannot_read_still_gets_its_answer(retrying: GatewayClient,
                                                                   fake_slack: FakeSlack) -> None:
    fake_slack.outage(calls=1)
    fake_slack.fail_next("conversations.replies", Failure(error="missing_scope"))  # no way to look for it
    event = mention("can you read this thread?")
    await retrying.send_event(event)
    outcome = await asyncio.wait_for(retrying.app.deliveries.wait(await _turn(retrying, event)), 10)
    assert outcome.error is None and len(_answers(fake_slack, "echo: can you read this thread?")) == 1


@pytest.mark.parametrize("lands", [False, True])
async def test_a_long_answer_resumes_from_its_first_missing_chunk(
    retrying: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM, lands: bool
) -> None:
    paragraphs = [letter * 2500 for letter in "abc"]  # three messages under Slack's display limit
    fake_llm.then(Reply("\n\n".join(paragraphs)))
    fake_slack.outage(calls=1, after=1, lands=lands)  # the first chunk goes through, the second fails
    event = mention("write a lot")
    await retrying.send_event(event)
    turn = await _turn(retrying, event)
    outcome = await asyncio.wait_for(retrying.app.deliveries.wait(turn), 15)
    chunks = [c for c in fake_slack.posts() if c.params.get("metadata")]
    assert [c.params["text"] for c in chunks] == paragraphs  # each once, in order
    assert [c.params["metadata"]["event_payload"]["chunk"] for c in chunks] == [0, 1, 2]
    assert outcome.ref == fake_slack.messages[0]["ts"]


async def test_a_refusal_for_good_gives_up_at_once_and_the_thread_is_told_once(
    retrying: GatewayClient, fake_slack: FakeSlack
) -> None:
    fake_slack.fail_next("chat.postMessage", Failure(error="channel_not_found"))
    first = mention("answer me", ts=THREAD)
    await retrying.send_event(first)
    turn = await _turn(retrying, first)
    outcome = await asyncio.wait_for(retrying.app.deliveries.wait(turn), 10)
    assert outcome.ref is None and outcome.error is not None and "channel_not_found" in outcome.error
    row = await _row(retrying, turn)
    assert row.status == DeliveryStatus.GIVEN_UP and row.attempts == 1  # no retry: it could not help
    assert fake_slack.posts() == [] and fake_slack.of(REFUSED_POST) == []
    for text in ("next one", "and another"):  # Slack takes posts again: the first thread is told, once
        event = mention(text)
        await retrying.send_event(event)
        await asyncio.wait_for(retrying.app.deliveries.wait(await _turn(retrying, event)), 10)
        await retrying.idle()
    told = [c for c in fake_slack.posts() if c.params.get("thread_ts") == THREAD]
    assert len(told) == 1 and "could not be posted (channel_not_found)" in told[0].params["text"]


async def test_past_delivery_max_age_it_is_given_up_counted_and_told_once_slack_is_back(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path,
    database_url: str | None,
) -> None:
    # 1.5 s leaves room for three 50-200 ms retries even on a loaded 2-core CI machine
    gateway: GatewayClient = await start_gateway(make_settings(delivery_max_age_s=1.5, **FAST))
    fake_slack.outage(seconds=60)
    lost = mention("this one is lost", ts=THREAD)
    await gateway.send_event(lost)
    turn = await _turn(gateway, lost)
    outcome = await asyncio.wait_for(gateway.app.deliveries.wait(turn), 10)
    assert outcome.error is not None and "HTTP 503" in outcome.error
    assert (await _row(gateway, turn)).attempts >= 3
    refused = len(fake_slack.of(REFUSED_POST))
    async with aiohttp.ClientSession() as http, http.get(f"{gateway.base}/metrics") as resp:
        metrics = await resp.text()
    assert 'chatops_deliveries{status="given_up"} 1.0' in metrics
    assert 'chatops_deliveries{status="pending"} 0.0' in metrics
    env = slack_env(fake_slack, fake_llm, 3000) | {"BOT_HOME": str(tmp_path / "home")}
    if database_url:
        env["DATABASE_URL"] = database_url
    _code, out = await run_cli(tmp_path, env, "doctor")
    assert "! deliveries: 1 answer(s) in the last 7 days were never delivered" in out, out
    assert "fix: look for \"given up\" in the log" in out
    assert len(fake_slack.of(REFUSED_POST)) == refused  # given up: no more attempts

    fake_slack.outage()  # Slack is back
    for text in ("hello again", "still there?"):
        event = mention(text)
        await gateway.send_event(event)
        await asyncio.wait_for(gateway.app.deliveries.wait(await _turn(gateway, event)), 10)
        await gateway.idle()
    told = [c for c in fake_slack.posts() if c.params.get("thread_ts") == THREAD]
    assert len(told) == 1 and "was given up" in told[0].params["text"]
    assert _answers(fake_slack, "echo: this one is lost") == []


async def test_a_kill_during_the_outage_still_delivers_once(
    tmp_path: Path, unused_port: int, fake_slack: FakeSlack, fake_llm: FakeLLM, database_url: str | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if database_url:
        monkeypatch.setenv("BOT_PROCESS_DATABASE_URL", database_url)
    env = slack_env(fake_slack, fake_llm, unused_port) | {"DELIVERY_RETRY_BASE_S": "0.05"}
    fake_slack.outage(seconds=300)
    bot = await BotProcess(tmp_path, env).start()
    try:
        await send_event(bot, mention("survive the kill"), "EvKill1")
        await fake_slack.wait_for(REFUSED_POST, 2, timeout=20)
    finally:
        await bot.kill()
    fake_slack.outage()  # Slack is back. On PostgreSQL a claim the dead process held runs out after LEASE_TTL_S.
    bot = await BotProcess(tmp_path, env).start()
    try:
        await fake_slack.wait_for("chat.postMessage", 1, timeout=20)
        async with asyncio.timeout(20):  # until the restarted process has recorded it
            while 'chatops_deliveries{status="pending"} 0.0' not in (metrics := await _metrics(bot)):
                await asyncio.sleep(0.05)
        assert 'chatops_deliveries{status="given_up"} 0.0' in metrics
        assert len(_answers(fake_slack, "echo: survive the kill")) == 1
    finally:
        assert await bot.terminate() == 0


async def _metrics(bot: BotProcess) -> str:
    async with aiohttp.ClientSession() as http, http.get(f"{bot.base}/metrics") as resp:
        return await resp.text()


async def test_a_firing_records_where_its_answer_landed_after_an_outage(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    from tests.test_schedules import _create_active

    gateway: GatewayClient = await start_gateway(make_settings(schedule_min_interval_s=1, **FAST))
    fake_slack.outage(calls=1, after=4)  # card, answer, card, "is active" notice; then the first firing
    await _create_active(gateway, fake_slack, fake_llm, every=1)
    store = ScheduleStore(gateway.app.db)
    async with asyncio.timeout(20):
        while not (firings := await store.firings(1)) or firings[-1].status == "running":
            await asyncio.sleep(0.05)
    first = firings[-1]  # newest first
    turn = await store.firing_turn(first.session_id)
    posted = [m for m in fake_slack.messages if m["channel"] == "CACC"
              and (m.get("metadata") or {}).get("event_payload", {}).get("delivery_id") == turn]
    assert len(posted) == 1 and posted[0]["text"] == "echo: say hi" and not posted[0]["thread_ts"]
    assert len(fake_slack.of(REFUSED_POST)) == 1 and fake_slack.of(REFUSED_POST)[0].params["channel"] == "CACC"
    assert first.status == "posted" and first.ts == posted[0]["ts"]


async def test_only_the_bots_own_messages_prove_a_delivery(fake_slack: FakeSlack) -> None:
    """Metadata a person (or another app) wrote, or a text the model chose, never counts as delivered."""
    from channels.slack.port import SlackPort

    port = SlackPort(AsyncWebClient(token="xoxb-x", base_url=f"{fake_slack.url}/api/"))  # type: ignore[attr-defined]
    thread = SessionInfo(id=f"slack:T1:CGEN:{THREAD}", channel="slack", agent="default", status=SessionStatus.IDLE,
                         reply_ref={"channel": "CGEN", "thread_ts": THREAD})
    top = SessionInfo(id="schedule:1:1", channel="slack", agent="default", status=SessionStatus.IDLE,
                      reply_ref={"channel": "CGEN"})
    delivery = DeliveryId("install-1", 7, datetime.now(UTC) - timedelta(seconds=5))
    payload = {"delivery_id": 7, "install": "install-1", "chunk": 0, "chunks": 1}
    for user, bot_id, session in (("U1", None, thread), ("UAPP", "BOTHER", thread), ("U1", None, top)):
        forged = {"event_type": "bot_delivery", "event_payload": payload | {"session": session.id}}
        fake_slack.messages.append({"type": "message", "ts": f"{int(time.time())}.{len(fake_slack.messages):06d}",
                                    "text": "done", "user": user, "metadata": forged, "channel": "CGEN",
                                    "thread_ts": session.reply_ref.get("thread_ts")}
                                   | ({"bot_id": bot_id} if bot_id else {}))
        await port.send_message("CGEN", json.dumps(forged))  # the model's message_send: text, never metadata
    assert await port.find_delivered(thread, delivery) is None
    assert await port.find_delivered(top, delivery) is None
    receipt = await port.deliver(thread, "the real answer", delivery_id=delivery)
    assert await port.find_delivered(thread, delivery) == receipt
    for other in (replace(delivery, turn_id=8), replace(delivery, install="install-2")):
        assert await port.find_delivered(thread, other) is None


async def test_a_forged_delivery_id_in_the_thread_does_not_swallow_the_answer(
    retrying: GatewayClient, fake_slack: FakeSlack
) -> None:
    install = await retrying.app.deliveries.store.install_id(datetime.now(UTC))  # not a secret: posts carry it
    payload = {"install": install, "session": f"slack:T1:C1:{THREAD}", "chunk": 0, "chunks": 1}
    forged = [{"type": "message", "ts": f"{int(time.time())}.00000{n}", "text": "answered!", "user": "U2",
               "channel": "C1", "thread_ts": THREAD,
               "metadata": {"event_type": "bot_delivery", "event_payload": payload | {"delivery_id": n}}}
              for n in range(1, 6)]  # a person's messages naming the next turns' delivery ids
    fake_slack.messages.extend(forged)
    fake_slack.outage(calls=1)  # so the retry looks for an earlier success
    event = mention("hi", ts=THREAD)
    await retrying.send_event(event)
    outcome = await asyncio.wait_for(retrying.app.deliveries.wait(await _turn(retrying, event)), 10)
    assert len(_answers(fake_slack, "echo: hi")) == 1 and outcome.error is None
    assert outcome.ref not in {m["ts"] for m in forged}


async def test_the_outbox_holds_no_secret_and_logs_none(
    retrying: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "sk-test-key-abcdef"  # LLM_API_KEY in the test settings: masked wherever text leaves the bot
    fake_llm.then(Reply(f"the key is {secret}"))
    fake_slack.outage(calls=1)
    caplog.set_level(logging.INFO)
    event = mention("what is the key?")
    await retrying.send_event(event)
    turn = await _turn(retrying, event)
    await asyncio.wait_for(retrying.app.deliveries.wait(turn), 10)
    row = await _row(retrying, turn)
    async with retrying.app.db.read() as s:
        answer = (await s.get(TurnRow, turn)).answer  # type: ignore[union-attr]
    assert answer is not None and "the key is" in answer and secret not in answer
    assert secret not in json.dumps(row.model_dump(), default=str)
    assert secret not in json.dumps([c.params for c in fake_slack.calls], default=str)
    assert secret not in caplog.text


async def test_web_answers_are_delivered_at_once_and_a_channel_without_port_says_so(
    make_settings: Any, start_gateway: Any
) -> None:
    from core.errors import InvalidInput
    from core.model import Inbound, MessageRef
    from core.triggers import TriggerSpec

    gateway: GatewayClient = await start_gateway(make_settings(slack_bot_token=None, slack_signing_secret=None))
    dispatcher, deliveries = gateway.app.dispatcher, gateway.app.deliveries
    origin = SessionInfo(id="web:" + "b" * 32, channel="web", agent="default", status=SessionStatus.IDLE,
                         reply_ref={})
    with pytest.raises(InvalidInput, match="the web chat cannot be a schedule's destination"):
        await gateway.app.schedules.create(prompt="hi", trigger=TriggerSpec(every_seconds=3600), destination="#ops",
                                           agent="default", creator="web", origin=origin, channel="web")
    with pytest.raises(InvalidInput, match="no slack channel is configured"):
        await gateway.app.schedules.create(prompt="hi", trigger=TriggerSpec(every_seconds=3600), destination="#ops",
                                           agent="default", creator="web", origin=origin, channel="slack")
    for channel, session in (("web", "web:" + "a" * 32), ("slack", "slack:T1:C1:1.0")):
        accepted = await dispatcher.accept(Inbound(
            session_id=session, channel=channel, sender="U1", text="hello", addressed=True,
            reply_ref={"channel": "C1", "thread_ts": "1.0"}, ref=MessageRef(), idempotency_key=f"{channel}:1"))
        assert accepted.input_id is not None
        outcome = await asyncio.wait_for(dispatcher.outcome(accepted.input_id), 10)
        assert outcome.turn_id is not None
        delivered = await asyncio.wait_for(deliveries.wait(outcome.turn_id), 10)
        if channel == "web":
            assert delivered.ref == f"turn:{outcome.turn_id}" and delivered.error is None
        else:  # Slack is not configured here: no outbox row, and the wait says why at once
            assert delivered.ref is None and delivered.error == "no slack channel is configured"
            async with gateway.app.db.read() as s:
                assert await s.get(DeliveryRow, outcome.turn_id) is None


async def test_one_process_at_a_time_attempts_a_row(make_settings: Any, start_gateway: Any,
                                                    fake_slack: FakeSlack) -> None:
    """Replicas race for a due row with a conditional update: one claim wins, until it runs out."""

    gateway: GatewayClient = await start_gateway(make_settings(delivery_retry_base_s=60))
    fake_slack.outage(calls=1)
    event = mention("claim me")
    await gateway.send_event(event)
    await fake_slack.wait_for(REFUSED_POST, 1)
    turn = await _turn(gateway, event)
    async with asyncio.timeout(10):
        while (row := await _row(gateway, turn)).claimed_by is not None:  # the failed attempt let go
            await asyncio.sleep(0.02)
    store, later = gateway.app.deliveries.store, row.next_attempt_at + timedelta(seconds=1)
    claims = await asyncio.gather(*(store.claim(turn, f"replica-{n}", later, later + timedelta(seconds=120))
                                    for n in range(4)))
    winners = [c for c in claims if c is not None]
    assert len(winners) == 1 and winners[0].text == "echo: claim me"
    assert await store.claim(turn, "replica-9", later + timedelta(seconds=60), later) is None  # still claimed
    taken_over = await store.claim(turn, "replica-9", later + timedelta(seconds=121), later + timedelta(seconds=300))
    assert taken_over is not None and taken_over.row.claimed_by == "replica-9"  # its claimer died


async def test_stopping_during_an_outage_is_prompt(make_settings: Any, fake_slack: FakeSlack) -> None:
    """A stop that races a failed attempt's wake-up still stops the retry loop (it used to hang)."""
    from bot.app import build_application

    app = build_application(make_settings(**FAST))
    await app.start()
    try:
        fake_slack.outage(seconds=60)
        async with aiohttp.ClientSession() as http:
            await GatewayClient(app, http).send_event(mention("stop me"))
        await fake_slack.wait_for(REFUSED_POST, 1)
    finally:
        await asyncio.wait_for(app.stop(), 10)
    async with app.db.read() as s:  # still waiting for Slack, for the next start
        assert (await s.exec(select(DeliveryRow.status))).all() == [DeliveryStatus.PENDING]


# -- security review: claims, long threads, notices, delivery ids, Retry-After --------------------


async def _settled(gateway: GatewayClient, turn: int, check: Any, timeout: float = 10) -> DeliveryRow:
    """The turn's outbox row, once ``check(row)`` holds."""
    async with asyncio.timeout(timeout):
        while True:
            async with gateway.app.db.read() as s:
                row = await s.get(DeliveryRow, turn)  # none until the turn has finished
            if row is not None and check(row):
                return row
            await asyncio.sleep(0.02)


async def test_a_first_attempt_that_comes_after_its_claim_was_taken_over_posts_nothing(
    retrying: GatewayClient, fake_slack: FakeSlack
) -> None:
    """The bus runs a thread's first attempts one after another, so one can start late: by then the retry loop
    (here, or on another replica) has taken the row over and posted it. The late one leaves the row alone."""
    from core.events import Event, TurnFinished

    finished: list[TurnFinished] = []

    async def record(event: Event) -> None:
        if isinstance(event, TurnFinished):
            finished.append(event)

    retrying.app.dispatcher.bus.subscribe(record)
    fake_slack.outage(calls=1)  # the first attempt fails: the loop retries and delivers
    event = mention("late first attempt")
    await retrying.send_event(event)
    turn = await _turn(retrying, event)
    assert (await asyncio.wait_for(retrying.app.deliveries.wait(turn), 10)).error is None
    await retrying.idle()
    assert len(_answers(fake_slack, "echo: late first attempt")) == 1
    retrying.app.dispatcher.bus.emit(finished[-1])  # the same first attempt, starting late
    await retrying.idle()
    assert len(_answers(fake_slack, "echo: late first attempt")) == 1


async def test_at_start_only_claims_of_an_earlier_run_are_released(retrying: GatewayClient,
                                                                   fake_slack: FakeSlack) -> None:
    """SQLite: claims a dead process left end at start, but not those this process has just made (a turn
    resumed at start finishes and its first attempt runs at once)."""

    deliveries, store = retrying.app.deliveries, retrying.app.deliveries.store
    fake_slack.outage(seconds=60)
    turns = []
    for text in ("ours", "the dead one's"):
        event = mention(text)
        await retrying.send_event(event)
        turns.append(await _turn(retrying, event))
    ours, theirs = turns
    for turn in turns:  # the first attempts failed and let go
        await _settled(retrying, turn, lambda row: row.claimed_by is None and row.attempts >= 1)
    await deliveries.stop()
    later = max([(await _row(retrying, t)).next_attempt_at for t in turns]) + timedelta(seconds=1)
    until = later + timedelta(seconds=120)
    assert await store.claim(ours, deliveries.holder, later, until) is not None
    assert await store.claim(theirs, "dead-process", later, until) is not None
    await deliveries.start(single_process=True)
    row = await _row(retrying, ours)
    assert (row.claimed_by, row.next_attempt_at) == (deliveries.holder, until)
    assert (await _row(retrying, theirs)).next_attempt_at < until


@pytest.mark.parametrize("recent", [False, True])
async def test_a_long_thread_is_read_from_when_the_answer_was_written(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, recent: bool
) -> None:
    """Anyone in a channel can grow a thread past the 10 pages a retry reads: only replies since the answer was
    written are read; if even those are too many, whether it landed is unknown and it is not posted again."""

    gateway: GatewayClient = await start_gateway(make_settings(delivery_max_age_s=1.5, **FAST))
    fake_slack.page_limit = 200
    fake_slack.messages.append({"type": "message", "ts": THREAD, "text": "incident", "user": "U1",
                                "channel": "C1", "thread_ts": None})
    at = int(time.time()) - 20 if recent else 1700000001  # replies 20 s before the question, or long before
    fake_slack.messages.extend({"type": "message", "ts": f"{at}.{n:06d}", "text": f"line {n}", "user": "U2",
                                "channel": "C1", "thread_ts": THREAD} for n in range(2100))
    fake_slack.outage(calls=1, lands=True)  # the answer lands, its response is lost
    event = mention("status?", thread_ts=THREAD)
    await gateway.send_event(event)
    outcome = await asyncio.wait_for(gateway.app.deliveries.wait(await _turn(gateway, event)), 15)
    assert len(_answers(fake_slack, "echo: status?")) == 1
    looked = fake_slack.of("conversations.replies")
    assert looked and all(float(c.params["oldest"]) > 1700000001 for c in looked)
    if recent:  # more than 10 pages of replies since: never known, never posted again; given up in the end
        assert outcome.ref is None and outcome.error is not None and "too many messages" in outcome.error
    else:
        assert outcome.error is None and outcome.ref == fake_slack.messages[-1]["ts"]


async def test_telling_threads_about_lost_answers_stalls_no_retry_and_a_failed_notice_is_sent_later(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack
) -> None:
    """Notices run on their own, each cut off in time (the client would wait out a rate limit's Retry-After);
    a row counts as told only once its notice was taken."""
    gateway: GatewayClient = await start_gateway(make_settings(lease_ttl_s=1, approval_poll_s=0.1, **FAST))
    deliveries = gateway.app.deliveries
    fake_slack.fail_next("chat.postMessage", Failure(error="channel_not_found", channel="CDEAD"))
    lost = mention("lost", channel="CDEAD")
    await gateway.send_event(lost)
    lost_turn = await _turn(gateway, lost)
    assert (await asyncio.wait_for(deliveries.wait(lost_turn), 10)).error is not None  # given up, not yet told
    # The notice is rate limited: Slack's client would sleep 30 s before trying again.
    fake_slack.fail_next("chat.postMessage", Failure(status=429, error="ratelimited", retry_after=30, channel="CDEAD"))
    for channel in ("C1", "C2"):  # each first attempt fails: the retry loop delivers (and the first one tells)
        fake_slack.fail_next("chat.postMessage", Failure(status=503, error="service_unavailable", channel=channel))
        event = mention(f"in {channel}", channel=channel)
        await gateway.send_event(event)
        assert (await asyncio.wait_for(deliveries.wait(await _turn(gateway, event)), 3)).error is None
    # The rate-limited notice was cut off and not counted as told; it is tried again after its backoff
    # (no other answer needs to be posted for that), and counts as told once Slack took it.
    await _settled(gateway, lost_turn, lambda row: row.notice_tries >= 1 and row.claimed_by is None)
    await _settled(gateway, lost_turn, lambda row: row.told)
    told = [m for m in fake_slack.messages if m["channel"] == "CDEAD"]
    assert len(told) == 1 and "was given up" in told[0]["text"]


async def test_only_this_databases_answer_to_this_thread_proves_a_delivery(
    retrying: GatewayClient, fake_slack: FakeSlack
) -> None:
    """Turn ids repeat across databases (a restored backup, a new DATABASE_URL, two deployments of one Slack app):
    the bot's own older posts with the same turn id are not this answer."""

    install = await retrying.app.deliveries.store.install_id(datetime.now(UTC))
    session = f"slack:T1:C1:{THREAD}"
    fake_slack.messages.append({"type": "message", "ts": THREAD, "text": "old question", "user": "U1",
                                "channel": "C1", "thread_ts": None})
    earlier = int(time.time()) - 3600
    for n, extra in enumerate([{}, {"install": install, "session": "slack:T1:C1:1.0"},  # another database; thread
                               {"install": install, "session": session}]):  # before the answer was written
        fake_slack.messages.append({
            "type": "message", "ts": f"{earlier}.{n:06d}", "text": "an older answer", "user": "UBOT", "bot_id": "BBOT",
            "channel": "C1", "thread_ts": THREAD,
            "metadata": {"event_type": "bot_delivery",
                         "event_payload": {"delivery_id": 1, "chunk": 0, "chunks": 1} | extra}})
    fake_slack.outage(calls=1)  # so the retry looks for an earlier post
    event = mention("what changed today?", thread_ts=THREAD)
    await retrying.send_event(event)
    turn = await _turn(retrying, event)
    assert turn == 1
    outcome = await asyncio.wait_for(retrying.app.deliveries.wait(turn), 10)
    answers = _answers(fake_slack, "echo: what changed today?")
    assert len(answers) == 1 and outcome.ref == fake_slack.messages[-1]["ts"]
    assert answers[0].params["metadata"]["event_payload"] == {"delivery_id": turn, "install": install,
                                                              "session": session, "chunk": 0, "chunks": 1}


@pytest.mark.parametrize("retry_after", ["1e12", "inf", "nan", "-5", "86400", "Wed, 21 Oct 2015 07:28:00 GMT"])
async def test_retry_after_is_bounded_and_only_a_number_counts(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, retry_after: str
) -> None:
    """Whatever Retry-After says, the failure is recorded and the next try is at most 5 minutes away."""

    gateway: GatewayClient = await start_gateway(make_settings(delivery_retry_base_s=0.05))
    fake_slack.fail_next("chat.postMessage", Failure(status=503, error="service_unavailable", retry_after=retry_after))
    event = mention("hello")
    await gateway.send_event(event)
    turn = await _turn(gateway, event)
    row = await _settled(gateway, turn, lambda row: row.last_error is not None or row.status != "pending", 5)
    assert row.last_error == "service_unavailable"
    if retry_after in ("1e12", "86400"):  # capped at the longest backoff
        assert timedelta(seconds=290) < row.next_attempt_at - row.created_at <= timedelta(seconds=301)
    else:  # not a number of seconds: ignored, the backoff alone counts
        assert (await asyncio.wait_for(gateway.app.deliveries.wait(turn), 5)).error is None


async def test_backoff_stays_bounded_after_many_attempts(make_settings: Any, start_gateway: Any,
                                                         fake_slack: FakeSlack) -> None:
    """After ~1,000 attempts (DELIVERY_MAX_AGE_S of days, Slack unreachable) the backoff still computes."""

    from sqlalchemy import update

    gateway: GatewayClient = await start_gateway(make_settings(delivery_retry_base_s=60, delivery_max_age_s=7 * 86400,
                                                               approval_poll_s=0.1))
    fake_slack.outage(seconds=60)
    event = mention("hello")
    await gateway.send_event(event)
    turn = await _turn(gateway, event)
    await _settled(gateway, turn, lambda row: row.claimed_by is None and row.last_error is not None)
    async with gateway.app.db.write() as s:  # as after 3.5 days of retries 5 minutes apart
        await s.exec(update(DeliveryRow).where(col(DeliveryRow.turn_id) == turn)  # type: ignore[call-overload]
                     .values(attempts=1024, next_attempt_at=datetime.now(UTC)))
    row = await _settled(gateway, turn, lambda row: row.attempts == 1025 and row.claimed_by is None)
    assert row.status == "pending" and row.last_error == "HTTP 503"
    assert row.next_attempt_at - datetime.now(UTC) <= timedelta(seconds=301)


def test_holder_names_fit_their_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pod's hostname may be 63 characters: the holder name (leases.holder, deliveries.claimed_by) stays
    within 64, readable and unique per process start."""
    import socket

    from core.leasing import holder_name

    pod = "chatops-gateway-production-eu-west-1-6f7d9c8b5-x2x4k-abcdefghijk"
    monkeypatch.setattr(socket, "gethostname", lambda: pod)
    names = {holder_name() for _ in range(20)}
    assert len(names) == 20 and all(len(n) <= 64 and n.startswith("chatops-gateway") for n in names)
    monkeypatch.setattr(socket, "gethostname", lambda: "vm")
    assert holder_name().startswith("vm:")


async def test_a_post_cut_off_mid_flight_is_looked_for_after_it_could_land(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack
) -> None:
    """An attempt cut off at its claim's end may still land on Slack's side: the next attempt looks for it
    only after that, so the answer is posted once, not again by a retry that looked too early."""
    fake_slack.post_delay_s = 2.0  # the attempt (claim 1 s) gives up at 0.8 s; the post lands at 2 s
    gateway: GatewayClient = await start_gateway(make_settings(lease_ttl_s=1, **FAST))
    event = mention("slow slack")
    await gateway.send_event(event)
    turn = await _turn(gateway, event)
    outcome = await asyncio.wait_for(gateway.app.deliveries.wait(turn), 20)
    fake_slack.post_delay_s = 0.0
    assert outcome.error is None
    await asyncio.sleep(2.2)  # any stray second post would be in by now (each takes 2 s from its start)
    assert [m["text"] for m in fake_slack.messages if m.get("text") == "echo: slow slack"] == ["echo: slow slack"]
