"""Messages sent while the agent is busy in a Slack thread: steered, collected or followed up (SPEC §5)."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.conftest import GatewayClient
from tests.fakes.llm import FakeLLM, Gate, Reply
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import command_body, mention, message, signed_headers


async def _busy_thread(gateway: GatewayClient, fake_llm: FakeLLM, first: Reply) -> tuple[dict[str, Any], Gate]:
    gate = Gate(first)
    fake_llm.then(gate)
    root = mention("deploy the thing")
    await gateway.send_event(root)
    await asyncio.wait_for(gate.reached.wait(), 5)
    return root, gate


async def _three_more(gateway: GatewayClient, root: dict[str, Any]) -> list[dict[str, Any]]:
    sent = []
    for text in ("also check the logs", "and tell me the time", "thanks"):
        event = mention(text, thread_ts=root["ts"])
        assert (await gateway.send_event(event)).status == 200
        sent.append(event)
    return sent


def _user_messages(request: dict[str, Any]) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "user"]


async def test_steer_hands_messages_to_the_running_turn_at_its_tool_step(
    gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    root, gate = await _busy_thread(gateway, fake_llm, Reply(tool_calls=[("time_now", {})]))
    sent = await _three_more(gateway, root)
    hourglasses = await fake_slack.wait_for("reactions.add", 4)  # :eyes: on the first, a sign on each of three
    assert [c.params["name"] for c in hourglasses[1:]] == ["hourglass_flowing_sand"] * 3
    fake_llm.then(Reply("all done"))
    gate.opened.set()
    posts = await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()
    assert len(fake_llm.requests) == 2  # one turn, steered: no extra model call per message
    assert _user_messages(fake_llm.requests[1])[-1] == "also check the logs\n\nand tell me the time\n\nthanks"
    # The steered message comes after the tool result, before the model is asked again.
    assert [m["role"] for m in fake_llm.requests[1]["messages"]][-3:] == ["assistant", "tool", "user"]
    assert [p.params["text"] for p in fake_slack.posts()] == ["all done"] and posts[0].params["thread_ts"] == root["ts"]
    removed = {(c.params["timestamp"], c.params["name"]) for c in fake_slack.of("reactions.remove")}
    for event in sent:  # the sign changed when the message was taken in, and cleared at the end
        assert (event["ts"], "hourglass_flowing_sand") in removed and (event["ts"], "eyes") in removed


async def test_steer_falls_back_to_one_merged_turn_when_no_tool_step_comes(
    gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    root, gate = await _busy_thread(gateway, fake_llm, Reply("first answer"))
    await _three_more(gateway, root)
    gate.opened.set()
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    assert len(fake_llm.requests) == 2
    assert _user_messages(fake_llm.requests[1])[-1] == "also check the logs\n\nand tell me the time\n\nthanks"
    assert [p.params["text"] for p in fake_slack.posts()] == [
        "first answer", "echo: also check the logs\n\nand tell me the time\n\nthanks"]


async def test_collect_runs_one_merged_turn_after_the_current_one(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    gateway = await start_gateway(make_settings(queue_mode="collect"))
    root, gate = await _busy_thread(gateway, fake_llm, Reply(tool_calls=[("time_now", {})]))
    await _three_more(gateway, root)
    fake_llm.then(Reply("first answer"))
    gate.opened.set()
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    assert len(fake_llm.requests) == 3  # the running turn's two calls, then one merged turn
    assert _user_messages(fake_llm.requests[1])[-1] == "deploy the thing"  # not steered in collect mode
    assert _user_messages(fake_llm.requests[2])[-1] == "also check the logs\n\nand tell me the time\n\nthanks"
    assert len(fake_slack.posts()) == 2


async def test_followup_answers_each_message_in_order(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    gateway = await start_gateway(make_settings(queue_mode="followup"))
    root, gate = await _busy_thread(gateway, fake_llm, Reply("first answer"))
    await _three_more(gateway, root)
    gate.opened.set()
    await fake_slack.wait_for("chat.postMessage", 4)
    await gateway.idle()
    assert [p.params["text"] for p in fake_slack.posts()] == [
        "first answer", "echo: also check the logs", "echo: and tell me the time", "echo: thanks"]
    assert len(fake_llm.requests) == 4


async def test_queue_mode_set_in_the_thread_and_for_the_channel(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    gateway = await start_gateway(make_settings(bot_admins="U1"))  # a channel's mode, with nothing busy: admins
    root = mention("queue followup")
    await gateway.send_event(root)
    notice = await fake_slack.wait_for("chat.postMessage")
    assert "now followup" in notice[0].params["text"] and notice[0].params["thread_ts"] == root["ts"]
    assert fake_llm.requests == []  # a command, not a question for the model
    assert await gateway.app.dispatcher.queue_mode(f"slack:T1:C1:{root['ts']}") == "followup"

    body = command_body("queue collect", channel="C9")
    headers = signed_headers(body, content_type="application/x-www-form-urlencoded")
    async with gateway.http.post(f"{gateway.base}/slack/events", data=body, headers=headers) as resp:
        assert "now collect" in await resp.text()
    other = mention("hello", channel="C9")
    await gateway.send_event(other)
    await fake_slack.wait_for("chat.postMessage", 2)
    assert await gateway.app.dispatcher.queue_mode(f"slack:T1:C9:{other['ts']}") == "collect"
    assert await gateway.app.dispatcher.queue_mode(f"slack:T1:C1:{root['ts']}") == "followup"


async def test_stop_in_the_thread_cancels_the_turn_and_what_waits(
    gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    root, gate = await _busy_thread(gateway, fake_llm, Reply("too late"))
    await gateway.send_event(mention("one more thing", thread_ts=root["ts"]))
    await gateway.send_event(mention("stop", thread_ts=root["ts"]))
    posts = await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()
    gate.opened.set()
    assert "Stopped the running turn and 1 waiting message (asked by U1)." in posts[0].params["text"]
    await asyncio.sleep(0.1)
    await gateway.idle()
    assert len(fake_slack.posts()) == 1 and len(fake_llm.requests) == 1  # nothing answered after the stop
    # The waiting message never started, so the transcript does not have it.
    history = await gateway.app.gateway.history(f"slack:T1:C1:{root['ts']}")
    assert [e.content for e in history] == ["deploy the thing", "(stopped by U1)"]


async def test_slash_stop_stops_the_latest_busy_thread_in_the_channel(
    gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    _root, gate = await _busy_thread(gateway, fake_llm, Reply("too late"))
    body = command_body("stop")
    headers = signed_headers(body, content_type="application/x-www-form-urlencoded")
    async with gateway.http.post(f"{gateway.base}/slack/events", data=body, headers=headers) as resp:
        assert "Stopped the running turn" in await resp.text()
    gate.opened.set()
    await gateway.idle()
    assert fake_slack.posts()[0].params["text"].startswith(":information_source: Stopped the running turn")
    async with gateway.http.post(f"{gateway.base}/slack/events", data=body, headers=headers) as resp:
        assert "Nothing to stop" in await resp.text()


async def test_busy_thread_refuses_past_the_waiting_cap(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    gateway = await start_gateway(make_settings(queue_max_waiting=2, queue_mode="followup"))
    root, gate = await _busy_thread(gateway, fake_llm, Reply("first"))
    await _three_more(gateway, root)
    posts = await fake_slack.wait_for("chat.postMessage")
    assert "I'm busy" in posts[0].params["text"]
    gate.opened.set()
    await fake_slack.wait_for("chat.postMessage", 4)
    await gateway.idle()
    assert [p.params["text"] for p in fake_slack.posts()][1:] == [
        "first", "echo: also check the logs", "echo: and tell me the time"]


async def test_paused_intake_replies_and_finishes_accepted_work(
    gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    root, gate = await _busy_thread(gateway, fake_llm, Reply("finished anyway"))
    await gateway.app.dispatcher.control.set_intake_paused(True, gateway.app.dispatcher.clock.now())
    await gateway.send_event(mention("new request", thread_ts=root["ts"]))
    posts = await fake_slack.wait_for("chat.postMessage")
    assert "paused" in posts[0].params["text"]
    gate.opened.set()
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    assert fake_slack.posts()[1].params["text"] == "finished anyway"
    await gateway.app.dispatcher.control.set_intake_paused(False, gateway.app.dispatcher.clock.now())
    await gateway.send_event(mention("after resume", thread_ts=root["ts"]))
    await fake_slack.wait_for("chat.postMessage", 3)
    assert fake_slack.posts()[2].params["text"].endswith("after resume")


async def test_a_repeat_while_the_turn_runs_resolves_with_its_outcome(
    gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    root, gate = await _busy_thread(gateway, fake_llm, Reply("the answer"))
    assert (await gateway.send_event(root, retry_num=1)).status == 200
    assert (await gateway.send_event(message(root["text"], ts=root["ts"]))).status == 200
    dispatcher = gateway.app.dispatcher
    session = f"slack:T1:C1:{root['ts']}"
    from core.model import Inbound, MessageRef

    repeat = await dispatcher.accept(Inbound(session_id=session, channel="slack", sender="U1", text="x",
                                             addressed=True, ref=MessageRef("C1", root["ts"]),
                                             idempotency_key=f"C1:{root['ts']}"))
    assert repeat.outcome.value == "duplicate" and repeat.input_id is not None
    waiting = asyncio.create_task(dispatcher.outcome(repeat.input_id))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    gate.opened.set()
    outcome = await asyncio.wait_for(waiting, 5)
    assert (outcome.status, outcome.text) == ("answered", "the answer")
    await gateway.idle()
    assert len(fake_llm.requests) == 1 and len(fake_slack.posts()) == 1
    # Once finished, a repeat resolves at once with the finished result.
    assert (await dispatcher.outcome(repeat.input_id)).text == "the answer"


async def test_one_slow_thread_does_not_hold_up_the_others(
    gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    slow, gate = await _busy_thread(gateway, fake_llm, Reply("slow answer"))
    for i in range(9):
        await gateway.send_event(mention(f"quick {i}", channel=f"C{i + 10}"))
    posts = await fake_slack.wait_for("chat.postMessage", 9)
    assert sorted(p.params["text"] for p in posts) == sorted(f"echo: quick {i}" for i in range(9))
    assert not gate.opened.is_set()
    gate.opened.set()
    await fake_slack.wait_for("chat.postMessage", 10)
    assert fake_slack.posts()[-1].params["thread_ts"] == slow["ts"]
