"""Feedback buttons under answers and the Stop controls (issue 15), through the real bolt app and the fake
Slack: a click is recorded once per person and turn, counted in /metrics, thanked privately, and refused when
it names an answer from elsewhere; a Stop (button, Slack's own stop, the message shortcut, ``/bot stop``)
stops exactly one thread's turn, for someone who may, and never the turn that came after."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from channels.slack.blocks import FEEDBACK_ACTION, STOP_ACTION, STOP_SHORTCUT
from core.store.feedback import FeedbackStore
from tests.bot_process import run_cli
from tests.conftest import GatewayClient
from tests.fakes.llm import FakeLLM, Gate, Reply
from tests.fakes.slack_api import Failure, FakeSlack
from tests.slack_requests import (
    TEAM_ID,
    block_action,
    command_body,
    mention,
    message_shortcut,
    next_ts,
    signed_headers,
)


def _answer(fake_slack: FakeSlack, thread_ts: str) -> dict[str, Any]:
    [message] = [m for m in fake_slack.messages if m["thread_ts"] == thread_ts and m.get("metadata")]
    return message


def _feedback_values(message: dict[str, Any]) -> tuple[str, str]:
    [block] = [b for b in message.get("blocks") or message.get("footer_blocks") or []
               if b["type"] == "context_actions"]
    [buttons] = block["elements"]
    assert buttons["type"] == "feedback_buttons" and buttons["action_id"] == FEEDBACK_ACTION
    return buttons["positive_button"]["value"], buttons["negative_button"]["value"]


async def _metric(gateway: GatewayClient, name: str) -> float:
    async with gateway.http.get(f"{gateway.base}/metrics") as resp:
        text = await resp.text()
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name)]
    return sum(values)


async def _answered(gateway: GatewayClient, fake_slack: FakeSlack, text: str, **where: Any) -> str:
    event = mention(text, **where)
    await gateway.send_event(event)
    await gateway.idle()
    return str(event["ts"])


# -- feedback ---------------------------------------------------------------------------------------


async def test_an_answer_carries_feedback_buttons_and_a_click_is_recorded_once_per_person(
        gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    fake_llm.then(Reply("- one\n- two\n\n| a | b |\n|---|---|\n| 1 | 2 |"))
    thread = await _answered(gateway, fake_slack, "list them")
    answer = _answer(fake_slack, thread)
    assert answer["blocks"][0] == {"type": "markdown", "text": "- one\n- two\n\n| a | b |\n|---|---|\n| 1 | 2 |"}
    good, bad = _feedback_values(answer)

    await gateway.interact(block_action(FEEDBACK_ACTION, good, user="U2", message_ts=answer["ts"], thread_ts=thread))
    await gateway.interact(block_action(FEEDBACK_ACTION, good, user="U2", message_ts=answer["ts"], thread_ts=thread))
    await gateway.interact(block_action(FEEDBACK_ACTION, bad, user="U3", message_ts=answer["ts"], thread_ts=thread))
    await gateway.interact(block_action(FEEDBACK_ACTION, good, user="U3", message_ts=answer["ts"], thread_ts=thread))
    await fake_slack.wait_for("chat.postEphemeral", 4)

    entries = await FeedbackStore(gateway.app.db).recent()
    assert sorted((e.user, e.positive) for e in entries) == [("U2", True), ("U3", True)]  # U3 changed their mind
    turn_id = int(good.split(":")[1])
    assert {e.turn_id for e in entries} == {turn_id} and all(e.session_id.endswith(thread) for e in entries)
    assert "Thanks for the feedback" in fake_slack.ephemerals("U2")[0]
    assert fake_slack.of("chat.postEphemeral")[0].params["thread_ts"] == thread  # said in the thread
    assert await _metric(gateway, 'chatops_feedback{verdict="positive"} ') == 2
    assert await _metric(gateway, 'chatops_feedback{verdict="negative"} ') == 0
    assert await _metric(gateway, 'chatops_feedback_clicks_total{verdict="positive"}') == 3


async def test_bot_feedback_list_shows_the_verdicts_from_the_database(
        gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM, database_url: str | None,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_llm.then(Reply("first answer"), Reply("second answer"))
    threads = [await _answered(gateway, fake_slack, "one"), await _answered(gateway, fake_slack, "two")]
    values = [_feedback_values(_answer(fake_slack, thread)) for thread in threads]
    await gateway.interact(block_action(FEEDBACK_ACTION, values[0][0], user="U2", thread_ts=threads[0]))
    await gateway.interact(block_action(FEEDBACK_ACTION, values[1][1], user="U3", thread_ts=threads[1]))
    await fake_slack.wait_for("chat.postEphemeral", 2)
    if database_url:
        monkeypatch.setenv("BOT_PROCESS_DATABASE_URL", database_url)
    code, out = await run_cli(tmp_path, {"BOT_HOME": str(tmp_path / "home")}, "feedback", "list")
    assert code == 0, out
    lines = out.strip().splitlines()
    assert lines[0] == "feedback: 1 positive, 1 negative"
    assert "negative\tturn 2\tby U3" in lines[1] and threads[1] in lines[1]  # the newest first
    assert "positive\tturn 1\tby U2" in lines[2]


async def test_feedback_naming_an_answer_from_elsewhere_or_not_an_answer_is_refused(
        gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    fake_llm.then(Reply("the answer"))
    thread = await _answered(gateway, fake_slack, "hello")
    good, _ = _feedback_values(_answer(fake_slack, thread))
    turn_id = int(good.split(":")[1])
    # The same turn id clicked in another channel, a turn that does not exist, a value that is not ours.
    for value, channel in ((good, "C2"), (f"positive:{turn_id + 100}", "C1"), ("positive:1e3", "C1"),
                           ("great", "C1"), (f"positive:{'9' * 40}", "C1")):
        response = await gateway.interact(block_action(FEEDBACK_ACTION, value, user="U2", channel=channel))
        assert response.status == 200
    await fake_slack.wait_for("chat.postEphemeral", 5)
    assert await FeedbackStore(gateway.app.db).recent() == []
    assert all("nothing was recorded" in text for text in fake_slack.ephemerals("U2"))


async def test_feedback_on_a_turn_still_running_is_refused(
        gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    event, gate = await _held_turn(gateway, fake_llm, "take your time", "slow")
    turn_id = await gateway.app.dispatcher.conversations.running_turn(f"slack:{TEAM_ID}:C1:{event['ts']}")
    await gateway.interact(block_action(FEEDBACK_ACTION, f"positive:{turn_id}", user="U2", thread_ts=event["ts"]))
    await fake_slack.wait_for("chat.postEphemeral")
    gate.opened.set()
    await gateway.idle()
    assert await FeedbackStore(gateway.app.db).recent() == []


async def test_model_text_cannot_mention_anyone_but_code_stays_as_written(
        gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    fake_llm.then(Reply("Tell <!channel> and <@U2>: run `cat <<EOF > a<b` then see <https://evil.example|docs>"))
    thread = await _answered(gateway, fake_slack, "how?")
    answer = _answer(fake_slack, thread)
    block = answer["blocks"][0]["text"]
    assert "<!channel>" not in block and "<@U2>" not in block and "<https:" not in block
    assert "<\u200b!channel>" in block and "`cat <<EOF > a<b`" in block
    assert "<!channel>" not in answer["text"]  # the notification's text: escaped


async def test_an_answer_whose_blocks_slack_refuses_is_posted_as_text(
        gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    fake_slack.fail_next("chat.postMessage", Failure(error="invalid_blocks"))
    fake_llm.then(Reply("plain all the same"))
    thread = await _answered(gateway, fake_slack, "hello")
    answer = _answer(fake_slack, thread)
    assert answer["text"] == "plain all the same" and "blocks" not in answer


async def test_only_the_last_part_of_a_long_answer_carries_the_buttons(
        gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    fake_llm.then(Reply("\n\n".join(f"Paragraph {n}: " + "words " * 150 for n in range(12))))
    thread = await _answered(gateway, fake_slack, "write a lot")
    parts = [m for m in fake_slack.messages if m["thread_ts"] == thread and m.get("metadata")]
    assert len(parts) > 1
    kinds = [[b["type"] for b in m["blocks"]] for m in parts]
    assert kinds[:-1] == [["markdown"]] * (len(parts) - 1) and kinds[-1] == ["markdown", "context_actions"]


async def test_a_streamed_answer_ends_with_the_buttons_under_it(
        make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    gateway: GatewayClient = await start_gateway(make_settings(slack_streaming=True, slack_stream_delay_s=0))
    text = "Here is what I found in the logs of the last hour, step by step. " * 4
    reply = Reply(text=text, pieces=[text[:80], text[80:]], hold_after=1)
    fake_llm.then(reply)
    event = mention("stream it")
    await gateway.send_event(event)
    await fake_slack.wait_for("chat.startStream")
    reply.resume.set()
    [stop] = await fake_slack.wait_for("chat.stopStream")
    await gateway.idle()
    blocks = stop.params["blocks"]
    blocks = json.loads(blocks) if isinstance(blocks, str) else blocks
    assert [b["type"] for b in blocks] == ["context_actions"]
    assert fake_slack.shown(_answer(fake_slack, event["ts"])["ts"]) == text


# -- stop -------------------------------------------------------------------------------------------


async def _held_turn(gateway: GatewayClient, fake_llm: FakeLLM, text: str, answer: str) -> tuple[dict[str, Any], Gate]:
    """A mention whose turn is asking the model, held there until the test opens the gate."""
    gate = Gate(Reply(answer))
    fake_llm.then(gate)
    event = mention(text)
    await gateway.send_event(event)
    await asyncio.wait_for(gate.reached.wait(), 5)
    return event, gate


async def _working(gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM,
                   user: str = "U1") -> tuple[dict[str, Any], Reply, str]:
    """A turn whose answer shows as a live message (Slack refused streaming) while the model still writes."""
    fake_slack.fail_next("chat.startStream", _refused())
    text = "Working through the steps one at a time, checking each before the next. " * 3
    reply = Reply(text=text + "Done.", pieces=[text, "Done."], hold_after=1)
    fake_llm.then(reply)
    event = mention("do the long thing", user=user)
    await gateway.send_event(event)
    await asyncio.wait_for(reply.held.wait(), 5)
    await fake_slack.wait_for("chat.postMessage")
    return event, reply, f"slack:{TEAM_ID}:C1:{event['ts']}"


def _refused() -> Failure:
    return Failure(error="not_allowed", status=200)


def _stop_value(fake_slack: FakeSlack, thread: str) -> tuple[str, str]:
    [live] = [m for m in fake_slack.messages if m["thread_ts"] == thread]
    [actions] = [b for b in live["blocks"] if b["type"] == "actions"]
    [button] = actions["elements"]
    assert button["action_id"] == STOP_ACTION and button["text"]["text"] == "Stop"
    return str(live["ts"]), str(button["value"])


async def test_the_stop_button_on_a_working_answer_stops_that_turn(
        make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    gateway: GatewayClient = await start_gateway(make_settings(slack_streaming=True, slack_stream_delay_s=0))
    event, reply, session = await _working(gateway, fake_slack, fake_llm)
    ts, value = _stop_value(fake_slack, event["ts"])
    await gateway.interact(block_action(STOP_ACTION, value, user="U1", message_ts=ts, thread_ts=event["ts"]))
    reply.resume.set()
    await gateway.idle()
    assert await gateway.app.dispatcher.conversations.running_turn(session) is None
    texts = [str(c.params.get("text")) for c in fake_slack.posts()]
    assert any("Stopped the running turn" in t for t in texts), texts
    assert "Done." not in fake_slack.shown(ts) and "(stopped)" in fake_slack.shown(ts)
    assert not any(m.get("metadata") for m in fake_slack.messages)  # no answer was delivered


async def test_a_stop_from_someone_who_may_not_is_refused_privately(
        make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    gateway: GatewayClient = await start_gateway(make_settings(slack_streaming=True, slack_stream_delay_s=0))
    event, reply, session = await _working(gateway, fake_slack, fake_llm)
    ts, value = _stop_value(fake_slack, event["ts"])
    await gateway.interact(block_action(STOP_ACTION, value, user="U9", message_ts=ts, thread_ts=event["ts"]))
    await fake_slack.wait_for("chat.postEphemeral")
    assert "can't stop this" in fake_slack.ephemerals("U9")[0]
    assert await gateway.app.dispatcher.conversations.running_turn(session) is not None
    reply.resume.set()
    await gateway.idle()
    assert _answer(fake_slack, event["ts"])  # the turn went on and was answered


async def test_a_late_click_on_an_old_stop_button_does_not_stop_the_next_turn(
        make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    gateway: GatewayClient = await start_gateway(make_settings(slack_streaming=True, slack_stream_delay_s=0))
    event, reply, session = await _working(gateway, fake_slack, fake_llm)
    ts, old_value = _stop_value(fake_slack, event["ts"])
    reply.resume.set()
    await gateway.idle()
    gate = Gate(Reply("second answer"))
    fake_llm.then(gate)
    await gateway.send_event(mention("and another thing", thread_ts=event["ts"]))
    await asyncio.wait_for(gate.reached.wait(), 5)
    await gateway.interact(block_action(STOP_ACTION, old_value, user="U1", message_ts=ts, thread_ts=event["ts"]))
    await fake_slack.wait_for("chat.postEphemeral")
    assert "already ended" in fake_slack.ephemerals("U1")[0]
    assert await gateway.app.dispatcher.conversations.running_turn(session) is not None
    gate.opened.set()
    await gateway.idle()


async def test_slacks_own_stop_button_stops_the_threads_turn(
        gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    event, gate = await _held_turn(gateway, fake_llm, "a long job", "never shown")
    session = f"slack:{TEAM_ID}:C1:{event['ts']}"
    stopped = {"type": "agent_session_stopped", "channel": "C1", "thread_ts": event["ts"], "user": "U1",
               "streaming_message_ts": [], "event_ts": next_ts()}
    response = await gateway.send_event(stopped)
    assert response.status == 200
    gate.opened.set()
    await gateway.idle()
    assert await gateway.app.dispatcher.conversations.running_turn(session) is None
    assert not any(m.get("metadata") for m in fake_slack.messages)
    assert any("Stopped the running turn" in str(c.params.get("text")) for c in fake_slack.posts())


async def test_a_late_redelivered_stop_event_does_not_stop_a_turn_that_started_after_the_click(
        gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    event, gate = await _held_turn(gateway, fake_llm, "a long job", "answered all the same")
    clicked = f"{time.time() - 120:.6f}"  # Slack's retry of a click two minutes old
    stopped = {"type": "agent_session_stopped", "channel": "C1", "thread_ts": event["ts"], "user": "U1",
               "streaming_message_ts": [], "event_ts": clicked}
    assert (await gateway.send_event(stopped)).status == 200
    await fake_slack.wait_for("chat.postEphemeral")
    assert await gateway.app.dispatcher.conversations.running_turn(f"slack:{TEAM_ID}:C1:{event['ts']}")
    gate.opened.set()
    await gateway.idle()
    assert _answer(fake_slack, event["ts"])


async def test_the_message_shortcut_stops_the_thread_it_is_used_in(
        gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    held = [await _held_turn(gateway, fake_llm, "work", answer) for answer in ("first", "second")]
    events, gates = [event for event, _ in held], [gate for _, gate in held]
    # Used on a reply inside the second thread: that thread stops, the first goes on.
    await gateway.interact(message_shortcut(STOP_SHORTCUT, message_ts=next_ts(), thread_ts=events[1]["ts"]))
    conversations = gateway.app.dispatcher.conversations
    await _until_stopped(gateway, f"slack:{TEAM_ID}:C1:{events[1]['ts']}")
    assert await conversations.running_turn(f"slack:{TEAM_ID}:C1:{events[0]['ts']}") is not None
    for gate in gates:
        gate.opened.set()
    await gateway.idle()
    assert _answer(fake_slack, events[0]["ts"])


async def test_bot_stop_stops_the_one_busy_thread_and_never_guesses_among_several(
        gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    held = [await _held_turn(gateway, fake_llm, "work", answer) for answer in ("first", "second")]
    events, gates = [event for event, _ in held], [gate for _, gate in held]
    reply = await _command(gateway, "stop")
    assert "won't guess" in reply
    conversations = gateway.app.dispatcher.conversations
    assert all([await conversations.running_turn(f"slack:{TEAM_ID}:C1:{e['ts']}") for e in events])
    await gateway.app.gateway.stop_thread(f"slack:{TEAM_ID}:C1:{events[0]['ts']}", by="U1")
    await _until_stopped(gateway, f"slack:{TEAM_ID}:C1:{events[0]['ts']}")
    reply = await _command(gateway, "stop")
    assert "Stopped the running turn" in reply and "the one busy thread" in reply
    for gate in gates:
        gate.opened.set()
    await gateway.idle()
    assert await _command(gateway, "stop") == "Nothing to stop in this channel."


async def _until_stopped(gateway: GatewayClient, session: str) -> None:
    """A stop cancels the turn's task; its end is written a moment later."""
    async with asyncio.timeout(5):
        while await gateway.app.dispatcher.conversations.running_turn(session) is not None:
            await asyncio.sleep(0.01)


async def _command(gateway: GatewayClient, text: str) -> str:
    form = "application/x-www-form-urlencoded"
    body = command_body(text)
    async with gateway.http.post(f"{gateway.base}/slack/events", data=body,
                                 headers=signed_headers(body, content_type=form)) as resp:
        return await resp.text()  # bolt acks a command with its reply as the body


async def test_a_long_turn_offers_whoever_asked_a_stop_button(
        make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    gateway: GatewayClient = await start_gateway(make_settings(slack_stop_offer_s=0.1))
    fake_llm.then(Reply("quick"))
    await _answered(gateway, fake_slack, "a quick one")
    await asyncio.sleep(0.2)
    assert fake_slack.of("chat.postEphemeral") == []  # answered sooner: nothing offered
    event, gate = await _held_turn(gateway, fake_llm, "a long one", "never shown")
    [offer] = await fake_slack.wait_for("chat.postEphemeral")
    assert (offer.params["user"], offer.params["thread_ts"]) == ("U1", event["ts"])  # privately, in the thread
    blocks = offer.params["blocks"]
    blocks = json.loads(blocks) if isinstance(blocks, str) else blocks
    [button] = blocks[-1]["elements"]
    assert (button["action_id"], button["text"]["text"]) == (STOP_ACTION, "Stop")
    await gateway.interact(block_action(STOP_ACTION, button["value"], user="U1", thread_ts=event["ts"]))
    await _until_stopped(gateway, f"slack:{TEAM_ID}:C1:{event['ts']}")
    gate.opened.set()
    await gateway.idle()
    assert not any(m.get("metadata") and m["thread_ts"] == event["ts"] for m in fake_slack.messages)
