"""Durable delivery: an answer Slack does not take is retried (across restarts) and lands exactly once."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from slack_sdk.web.async_client import AsyncWebClient
from sqlmodel import col, select

from core.model import DeliveryStatus, SessionInfo, SessionStatus
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
    assert answers[0].params["metadata"] == {"event_type": "bot_delivery",
                                             "event_payload": {"delivery_id": turn, "chunk": 0, "chunks": 1}}
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
    gateway: GatewayClient = await start_gateway(make_settings(delivery_max_age_s=0.5, **FAST))
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
    assert "bot_deliveries_given_up 1.0" in metrics and "bot_deliveries_pending 0.0" in metrics
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
            while "bot_deliveries_pending 0.0" not in (metrics := await _metrics(bot)):
                await asyncio.sleep(0.05)
        assert "bot_deliveries_given_up 0.0" in metrics
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
    forged = {"event_type": "bot_delivery", "event_payload": {"delivery_id": 7, "chunk": 0, "chunks": 1}}
    for user, bot_id, thread_ts in (("U1", None, THREAD), ("UAPP", "BOTHER", THREAD), ("U1", None, None)):
        fake_slack.messages.append({"type": "message", "ts": f"1700000001.{len(fake_slack.messages):06d}",
                                    "text": "done", "user": user, "metadata": forged, "channel": "CGEN",
                                    "thread_ts": thread_ts} | ({"bot_id": bot_id} if bot_id else {}))
    await port.send_message("CGEN", json.dumps(forged))  # the model's message_send: text, never metadata
    assert await port.find_delivered(thread, 7) is None
    assert await port.find_delivered(top, 7) is None
    receipt = await port.deliver(thread, "the real answer", delivery_id=7)
    assert await port.find_delivered(thread, 7) == receipt
    assert await port.find_delivered(thread, 8) is None


async def test_a_forged_delivery_id_in_the_thread_does_not_swallow_the_answer(
    retrying: GatewayClient, fake_slack: FakeSlack
) -> None:
    forged = [{"type": "message", "ts": f"1700000001.00000{n}", "text": "answered!", "user": "U2", "channel": "C1",
               "thread_ts": THREAD, "metadata": {"event_type": "bot_delivery",
                                                 "event_payload": {"delivery_id": n, "chunk": 0, "chunks": 1}}}
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
    from datetime import timedelta

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
