"""A signed mention into the real bolt app gets the model's answer in the thread, exactly once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.conftest import GatewayClient
from tests.fakes.llm import FakeLLM, Gate, HttpError, Reply
from tests.fakes.slack_api import Failure, FakeSlack
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


async def test_direct_message_is_answered_without_mention(gateway: GatewayClient, fake_slack: FakeSlack) -> None:
    dm = message("status of prod?", channel="D1", channel_type="im")
    await gateway.send_event(dm)
    posts = await fake_slack.wait_for("chat.postMessage")
    assert posts[0].params["channel"] == "D1"
    assert posts[0].params["thread_ts"] == dm["ts"]
    assert posts[0].params["text"] == "echo: status of prod?"


async def test_thread_messages_without_mention_are_context_not_turns(
    gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    root = mention("start")
    await gateway.send_event(root)
    await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()
    await gateway.send_event(message("the error is E42", thread_ts=root["ts"], user="U2"))
    await gateway.idle()
    assert len(fake_llm.requests) == 1  # context only: no turn
    await gateway.send_event(mention("what was the error?", thread_ts=root["ts"]))
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    contents = [m.get("content") for m in fake_llm.requests[1]["messages"]]
    # The context recorded since the last answer reaches the model with the question, as one message.
    assert contents[1:] == ["start", "echo: start", "the error is E42\n\nwhat was the error?"]
    assert fake_slack.posts()[1].params["thread_ts"] == root["ts"]


async def test_messages_outside_bot_threads_and_from_bots_are_ignored(
    gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    for event in (
        message("chatter in a channel"),
        message("chatter in someone's thread", thread_ts="1.000001"),
        message("I am a bot", bot_id="B2", channel_type="im", channel="D1"),
        message("integration", subtype="bot_message", channel_type="im", channel="D1"),
        message("edited", subtype="message_changed", channel_type="im", channel="D1"),
        mention("talking to myself", user="UBOT"),
    ):
        assert (await gateway.send_event(event)).status == 200
    await gateway.idle()
    assert fake_llm.requests == []
    assert fake_slack.posts() == []


async def test_the_ack_does_not_wait_for_the_model(
    gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    gate = Gate(Reply("slow answer"))
    fake_llm.then(gate)
    resp = await gateway.send_event(mention("take your time"))
    assert resp.status == 200
    await asyncio.wait_for(gate.reached.wait(), 5)
    assert fake_slack.posts() == []  # acknowledged while the model is still thinking
    # Only the progress sign: the status line (this fake workspace refuses it), then the reaction; and the
    # sender's trust label, looked up as the turn started (after the ack).
    assert [c.method for c in fake_slack.calls if c.method not in ("auth.test", "users.info")] == [
        "assistant.threads.setStatus", "reactions.add"]
    assert [c.params["user"] for c in fake_slack.of("users.info")] == ["U1"]
    gate.opened.set()
    posts = await fake_slack.wait_for("chat.postMessage")
    assert posts[0].params["text"] == "slow answer"


async def test_a_quick_answer_is_its_own_sign_and_costs_no_reaction_calls(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack
) -> None:
    gateway: GatewayClient = await start_gateway(make_settings(slack_progress_delay_s=5))
    await gateway.send_event(mention("quick one"))
    await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()
    assert [c.method for c in fake_slack.calls if c.method.startswith("reactions.")] == []


async def test_a_turn_still_working_after_the_delay_shows_progress_until_it_ends(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    gateway: GatewayClient = await start_gateway(make_settings(slack_progress_delay_s=0.05))
    gate = Gate(Reply("slow answer"))
    fake_llm.then(gate)
    event = mention("take your time")
    await gateway.send_event(event)
    await asyncio.wait_for(gate.reached.wait(), 5)
    added = await fake_slack.wait_for("reactions.add")
    assert (added[0].params["name"], added[0].params["timestamp"]) == ("eyes", event["ts"])
    assert fake_slack.of("reactions.remove") == []  # still working: the sign stays
    gate.opened.set()
    await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()
    removed = fake_slack.of("reactions.remove")
    assert [(c.params["name"], c.params["timestamp"]) for c in removed] == [("eyes", event["ts"])]
    assert len(fake_slack.of("reactions.add")) == 1


async def test_tool_calls_run_and_their_results_reach_the_model(
    gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    fake_llm.then(Reply(tool_calls=[("time_now", {"timezone": "UTC"})]), Reply("It is late."))
    await gateway.send_event(mention("what time is it?"))
    posts = await fake_slack.wait_for("chat.postMessage")
    assert posts[0].params["text"] == "It is late."
    second = fake_llm.requests[1]["messages"]
    assert second[-2]["tool_calls"][0]["function"]["name"] == "time_now"
    assert second[-1]["role"] == "tool" and "UTC" in second[-1]["content"]
    assert [t["function"]["name"] for t in fake_llm.requests[0]["tools"]] == [
        "channel_archive", "channel_create", "channel_invite", "credential_request", "forget", "http_request",
        "message_pin", "message_read", "message_send", "recall", "remember", "schedule_cancel", "schedule_create",
        "schedule_list", "shell_run", "skill_read", "time_now"]


async def test_invalid_tool_arguments_go_back_to_the_model_as_an_error(
    gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    fake_llm.then(Reply(tool_calls=[("time_now", "{not json")]), Reply(tool_calls=[("nope", {})]), Reply("ok"))
    await gateway.send_event(mention("time?"))
    await fake_slack.wait_for("chat.postMessage")
    assert fake_llm.requests[1]["messages"][-1]["content"].startswith("error: arguments for time_now are not valid")
    assert "no tool named 'nope'" in fake_llm.requests[2]["messages"][-1]["content"]


async def test_step_limit_ends_with_a_message(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    gateway = await start_gateway(make_settings(max_steps=2))
    fake_llm.then(*[Reply(tool_calls=[("time_now", {})]) for _ in range(3)])
    await gateway.send_event(mention("loop forever"))
    posts = await fake_slack.wait_for("chat.postMessage")
    assert "2 steps" in posts[0].params["text"] and "MAX_STEPS" in posts[0].params["text"]
    assert len(fake_llm.requests) == 2


async def test_long_answers_are_split_under_slack_limits(
    gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    paragraphs = [f"Paragraph {i}: " + "word " * 150 for i in range(20)]  # ~15,000 characters
    fake_llm.then(Reply("\n\n".join(paragraphs)))
    await gateway.send_event(mention("write a lot"))
    await fake_slack.wait_for("chat.postMessage", 4)
    await gateway.idle()
    texts = [c.params["text"] for c in fake_slack.posts()]
    assert all(len(t) <= 4000 for t in texts)
    joined = "\n\n".join(texts)
    assert [p.split(":")[0] for p in joined.split("\n\n")] == [f"Paragraph {i}" for i in range(20)]


@pytest.mark.parametrize(
    ("failure", "expected"),
    [
        (HttpError(401, "Incorrect API key provided"), "rejected the API key"),
        (HttpError(404, "model 'x' does not exist"), "LLM_MODEL"),
        (HttpError(400, "This model's maximum context length is 8192 tokens"), "too long"),
    ],
)
async def test_model_failures_end_with_a_message_naming_the_problem(
    gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM, failure: HttpError, expected: str
) -> None:
    # Too long for the model: asked once more in half the room (core.context_window), then it is said.
    tries = 2 if expected == "too long" else 1
    fake_llm.then(*[failure] * tries)
    await gateway.send_event(mention("hi"))
    posts = await fake_slack.wait_for("chat.postMessage")
    assert posts[0].params["text"].startswith(":warning:")
    assert expected in posts[0].params["text"]
    assert failure.message in posts[0].params["text"]
    assert len(fake_llm.requests) == tries  # not retried with the same request
    await gateway.idle()
    assert len(fake_slack.of("reactions.remove")) == 1


async def test_an_endpoint_error_cannot_ping_the_channel(gateway: GatewayClient, fake_slack: FakeSlack,
                                                         fake_llm: FakeLLM) -> None:
    fake_llm.then(HttpError(401, "bad key <!channel> see <https://evil.example|here>"))
    await gateway.send_event(mention("hi"))
    [post] = await fake_slack.wait_for("chat.postMessage")
    assert "<!channel>" not in post.params["text"] and "&lt;!channel&gt;" in post.params["text"]
    await gateway.idle()


async def test_unreachable_model_endpoint_is_reported(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, unused_port: int
) -> None:
    gateway = await start_gateway(make_settings(llm_base_url=f"http://127.0.0.1:{unused_port}/v1",
                                                llm_max_attempts=2))
    await gateway.send_event(mention("hi"))
    posts = await fake_slack.wait_for("chat.postMessage")
    assert "could not reach the model endpoint" in posts[0].params["text"]
    assert "LLM_BASE_URL" in posts[0].params["text"]


async def test_rate_limited_model_call_is_retried(
    gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    fake_llm.then(HttpError(429, "slow down", retry_after=0), Reply("after a retry"))
    await gateway.send_event(mention("hi"))
    posts = await fake_slack.wait_for("chat.postMessage")
    assert posts[0].params["text"] == "after a retry"
    assert len(fake_llm.requests) == 2


async def test_slack_rate_limit_on_post_is_retried_after_retry_after(
    gateway: GatewayClient, fake_slack: FakeSlack
) -> None:
    fake_slack.fail_next("chat.postMessage", Failure(status=429, error="ratelimited", retry_after=0))
    await gateway.send_event(mention("hi"))
    posts = await fake_slack.wait_for("chat.postMessage")
    assert posts[0].params["text"] == "echo: hi"


async def test_oversized_message_gets_a_clear_refusal(
    gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    await gateway.send_event(mention("x" * 40_001))
    posts = await fake_slack.wait_for("chat.postMessage")
    assert "can't take this message" in posts[0].params["text"]
    assert fake_llm.requests == []


async def test_metrics_move_as_turns_run(gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    before = await gateway.metrics()
    fake_slack.fail_next("reactions.add", Failure(error="invalid_name"))
    await gateway.send_event(mention("count me"))
    await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()
    after = await gateway.metrics()
    assert after["chatops_turns_started_total"] == before.get("chatops_turns_started_total", 0) + 1
    key = 'chatops_turns_ended_total{outcome="answered"}'
    assert after[key] == before.get(key, 0) + 1
    assert after["chatops_turn_duration_seconds_count"] == before.get("chatops_turn_duration_seconds_count", 0) + 1
    error = 'chatops_slack_api_errors_total{error="invalid_name",method="reactions.add"}'
    assert after[error] == before.get(error, 0) + 1
    for gauge in ("chatops_queue_depth", "chatops_approvals_pending", "chatops_credential_requests_pending"):
        assert after[gauge] == 0
