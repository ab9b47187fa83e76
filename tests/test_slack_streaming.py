"""Answers stream into their Slack thread while the model writes (issue 15), through the real bolt app,
the fake Slack and a fake model that streams: the stream ends as exactly one message carrying the
delivery's metadata, appends are paced, secrets are masked before any piece leaves, and a workspace
that refuses streaming gets one message updated as it grows."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from channels.slack.streams import STREAM_LIMIT
from tests.conftest import GatewayClient
from tests.fakes.llm import FakeLLM, HttpError, Reply
from tests.fakes.slack_api import Failure, FakeSlack
from tests.slack_requests import command_body, mention

# The first text of each test's answer: prose, which streams at once (masking holds back only what could
# still begin a secret).
INTRO = "Here is what I found, step by step, as far as the logs of the last hour can tell. " * 5

STREAM_METHODS = ("chat.startStream", "chat.appendStream", "chat.stopStream", "chat.update", "chat.postMessage")


@pytest.fixture
async def streaming(make_settings: Any, start_gateway: Any) -> GatewayClient:
    client: GatewayClient = await start_gateway(make_settings(slack_streaming=True, slack_stream_delay_s=0))
    return client


async def _writing(streaming: GatewayClient, fake_llm: FakeLLM, text: str, rest: str) -> tuple[dict[str, Any], Reply]:
    """A mention whose answer (INTRO, then ``rest``) has its first piece written and waits for the rest."""
    reply = Reply(text=INTRO + rest, pieces=[INTRO, rest], hold_after=1)
    fake_llm.then(reply)
    event = mention(text)
    await streaming.send_event(event)
    await asyncio.wait_for(reply.held.wait(), 5)
    return event, reply


def _answer_calls(slack: FakeSlack) -> list[tuple[str, dict[str, Any]]]:
    return [(c.method, c.params) for c in slack.calls if c.method in STREAM_METHODS]


def _answer_messages(slack: FakeSlack, thread_ts: str) -> list[dict[str, Any]]:
    return [m for m in slack.messages if m["thread_ts"] == thread_ts]


async def test_an_answer_streams_while_the_model_writes_and_ends_as_one_message(
        streaming: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    words = [f" word{n}" for n in range(40)]
    reply = Reply(text=INTRO + "".join(words), pieces=[INTRO, *words], hold_after=1)
    fake_llm.then(reply)
    event = mention("plan the migration")
    await streaming.send_event(event)
    await asyncio.wait_for(reply.held.wait(), 5)
    started = await fake_slack.wait_for("chat.startStream")  # the model is still writing
    assert started[0].params["markdown_text"] and INTRO.startswith(started[0].params["markdown_text"])
    assert started[0].params["thread_ts"] == event["ts"]
    assert started[0].params["recipient_user_id"] == event["user"] and started[0].params["recipient_team_id"] == "T1"
    assert fake_slack.posts() == []
    reply.resume.set()
    await fake_slack.wait_for("chat.stopStream")
    await streaming.idle()

    [message] = _answer_messages(fake_slack, event["ts"])
    assert fake_slack.shown(message["ts"]) == reply.text and not message["streaming"]
    payload = message["metadata"]["event_payload"]
    assert (payload["chunk"], payload["chunks"]) == (0, 1)
    assert fake_slack.posts() == []  # the answer is the stream: no second message
    assert fake_llm.streamed(0)


async def test_appends_are_paced_not_one_per_token(streaming: GatewayClient, fake_slack: FakeSlack,
                                                   fake_llm: FakeLLM) -> None:
    pieces = [INTRO] + ["x" * 5 for _ in range(200)]  # then 1,000 characters in 200 pieces, over ~2.4 s
    reply = Reply(text="".join(pieces), pieces=pieces, every_s=0.012)
    fake_llm.then(reply)
    event = mention("write a lot")
    await streaming.send_event(event)
    await fake_slack.wait_for("chat.stopStream")
    await streaming.idle()
    methods = [m for m, _ in _answer_calls(fake_slack)]
    assert methods[0] == "chat.startStream" and methods[-1] == "chat.stopStream"
    assert 1 <= methods.count("chat.appendStream") <= 3, methods  # one a second at most, not one per piece
    [message] = _answer_messages(fake_slack, event["ts"])
    assert fake_slack.shown(message["ts"]) == reply.text


async def test_a_secret_split_across_pieces_never_leaves(streaming: GatewayClient, fake_slack: FakeSlack,
                                                         fake_llm: FakeLLM) -> None:
    # LLM_API_KEY (sk-test-key-abcdef) is a setting's value: masked wherever the bot writes.
    preface = "I looked through the configuration files one by one, and here is what they hold. " * 3
    pieces = [preface, "The key is sk-", "test-", "key-ab", "cdef and that is all."]
    reply = Reply(text="".join(pieces), pieces=pieces, hold_after=3)
    fake_llm.then(reply)
    event = mention("what is the key?")
    await streaming.send_event(event)
    await asyncio.wait_for(reply.held.wait(), 5)
    await fake_slack.wait_for("chat.startStream")  # what is decided shows while the rest is written
    reply.resume.set()
    await fake_slack.wait_for("chat.stopStream")
    await streaming.idle()
    sent = " ".join(str(params) for _, params in _answer_calls(fake_slack))
    for fragment in ("sk-", "test-key", "key-ab", "abcdef"):
        assert fragment not in sent
    [message] = _answer_messages(fake_slack, event["ts"])
    assert fake_slack.shown(message["ts"]).startswith(preface) and "and that is all." in fake_slack.shown(message["ts"])


async def test_a_workspace_that_refuses_streaming_gets_one_message_updated(
        streaming: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    fake_slack.fail_next("chat.startStream", Failure(error="not_allowed_token_type"))
    event, reply = await _writing(streaming, fake_llm, "hello", "then the rest")
    placeholder = await fake_slack.wait_for("chat.postMessage")
    assert INTRO.startswith(placeholder[0].params["text"]) and not placeholder[0].params.get("metadata")
    reply.resume.set()
    updates = await fake_slack.wait_for("chat.update")
    await streaming.idle()
    assert updates[-1].params["metadata"]["event_payload"]["chunk"] == 0
    [message] = _answer_messages(fake_slack, event["ts"])
    assert message["text"] == reply.text and message["metadata"]
    assert len(fake_slack.posts()) == 1


async def test_text_before_a_tool_call_is_replaced_by_the_answer(streaming: GatewayClient, fake_slack: FakeSlack,
                                                                 fake_llm: FakeLLM) -> None:
    fake_llm.then(Reply(text="Let me look.", tool_calls=[("time_now", {})]), Reply(text="It is noon."))
    event = mention("what time is it?")
    await streaming.send_event(event)
    await fake_slack.wait_for("chat.stopStream")
    await streaming.idle()
    [message] = _answer_messages(fake_slack, event["ts"])
    assert fake_slack.shown(message["ts"]) == "It is noon." and message["metadata"]
    assert fake_slack.posts() == []


async def test_an_answer_longer_than_a_stream_continues_in_a_follow_up(streaming: GatewayClient,
                                                                        fake_slack: FakeSlack,
                                                                        fake_llm: FakeLLM) -> None:
    paragraphs = [f"paragraph {n} " + "y" * 480 for n in range(12)]  # ~5,900 characters
    text = "\n\n".join(paragraphs)
    fake_llm.then(Reply(text=text, pieces=[p + "\n\n" if i < 11 else p for i, p in enumerate(paragraphs)],
                        every_s=0.05))
    event = mention("a long one")
    await streaming.send_event(event)
    await fake_slack.wait_for("chat.postMessage")
    await streaming.idle()
    messages = _answer_messages(fake_slack, event["ts"])
    assert len(messages) == 2
    chunks = [m["metadata"]["event_payload"] for m in messages]
    assert [(c["chunk"], c["chunks"]) for c in chunks] == [(0, 2), (1, 2)]
    assert len(fake_slack.shown(messages[0]["ts"])) <= STREAM_LIMIT
    shown = fake_slack.shown(messages[0]["ts"]) + "\n\n" + messages[1]["text"]
    assert shown == text


async def test_a_quick_answer_is_posted_whole_without_a_stream(make_settings: Any, start_gateway: Any,
                                                                fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    gateway: GatewayClient = await start_gateway(make_settings(slack_streaming=True, slack_stream_delay_s=5))
    await gateway.send_event(mention("quick"))
    posts = await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()
    assert posts[0].params["text"] == "echo: quick"
    assert fake_slack.of("chat.startStream") == []


async def test_a_turn_that_fails_mid_stream_stops_its_stream(streaming: GatewayClient, fake_slack: FakeSlack,
                                                             fake_llm: FakeLLM) -> None:
    reply = Reply(text=INTRO * 2 + "answer", pieces=[INTRO, INTRO, "answer"], hold_after=1, cut_after=2)
    fake_llm.then(reply, *[HttpError(500, "down")] * 4)
    event = mention("this breaks")
    await streaming.send_event(event)
    await asyncio.wait_for(reply.held.wait(), 5)
    await fake_slack.wait_for("chat.startStream")
    reply.resume.set()  # the connection then drops, and every retry fails
    await fake_slack.wait_for("chat.stopStream")
    posts = await fake_slack.wait_for("chat.postMessage")
    await streaming.idle()
    assert posts[0].params["text"].startswith(":warning:")
    assert fake_slack.of("chat.stopStream")[0].params.get("metadata") is None  # not an answer


async def test_a_stream_whose_end_fails_is_finished_by_the_retry_not_posted_again(
        make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    gateway: GatewayClient = await start_gateway(make_settings(slack_streaming=True, slack_stream_delay_s=0,
                                                               delivery_retry_base_s=0.05))
    fake_slack.fail_next("chat.stopStream", Failure(status=500, error="internal_error"))
    reply = Reply(text=INTRO + "two three", pieces=[INTRO, "two", " three"], hold_after=1)
    fake_llm.then(reply)
    event = mention("stream then fail")
    await gateway.send_event(event)
    await asyncio.wait_for(reply.held.wait(), 5)
    await fake_slack.wait_for("chat.startStream")
    reply.resume.set()
    await fake_slack.wait_for("chat.stopStream")  # the retry's (the refused one is not recorded)
    await gateway.idle()
    [message] = _answer_messages(fake_slack, event["ts"])
    assert fake_slack.shown(message["ts"]) == INTRO + "two three" and message["metadata"]
    assert fake_slack.posts() == []


async def test_the_web_chat_streams_the_answer_over_its_event_stream(gateway: GatewayClient,
                                                                     fake_llm: FakeLLM) -> None:
    from tests.test_web_chat import CID, _post, _watch

    fake_llm.then(Reply(text="streamed to the browser", pieces=["streamed", " to the", " browser"], every_s=0.15))
    seen: list[dict[str, Any]] = []
    watcher = await _watch(gateway, CID, "turn.finished", seen)
    await _post(gateway, f"/api/conversations/{CID}/messages", {"text": "hi", "client_id": "s1"})
    await asyncio.wait_for(watcher, 10)
    deltas = [e for e in seen if e["type"] == "answer.delta"]
    assert "".join(e["text"] for e in deltas) == "streamed to the browser"
    assert deltas[0]["restart"] is True and all(e["restart"] is False for e in deltas[1:])
    assert seen[-1]["text"] == "streamed to the browser"


async def test_a_quick_answer_is_not_streamed_at_all(gateway: GatewayClient, fake_llm: FakeLLM) -> None:
    from tests.test_web_chat import CID, _post, _watch

    seen: list[dict[str, Any]] = []
    watcher = await _watch(gateway, CID, "turn.finished", seen)
    await _post(gateway, f"/api/conversations/{CID}/messages", {"text": "quick", "client_id": "q1"})
    await asyncio.wait_for(watcher, 10)
    assert [e for e in seen if e["type"] == "answer.delta"] == []  # it comes whole, with turn.finished


async def test_an_append_that_failed_leaves_the_end_to_replace_the_whole_text(
        streaming: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    fake_slack.fail_next("chat.appendStream", Failure(status=500, error="internal_error"))  # it may have landed
    pieces = [INTRO, "more ", "and the end."]
    reply = Reply(text="".join(pieces), pieces=pieces, hold_after=2, every_s=0.3)  # "more " after the start
    fake_llm.then(reply)
    event = mention("append fails")
    await streaming.send_event(event)
    await asyncio.wait_for(reply.held.wait(), 5)
    await fake_slack.wait_for("chat.startStream")
    for _ in range(300):  # the append of "more " is tried (and refused) within the stream's interval
        if not fake_slack.failures["chat.appendStream"]:
            break
        await asyncio.sleep(0.01)
    assert not fake_slack.failures["chat.appendStream"]
    reply.resume.set()
    updates = await fake_slack.wait_for("chat.update")
    await streaming.idle()
    assert fake_slack.shown(updates[-1].params["ts"]) == reply.text and updates[-1].params["metadata"]
    [message] = _answer_messages(fake_slack, event["ts"])
    assert fake_slack.shown(message["ts"]) == reply.text


async def test_a_stream_slack_ended_on_its_own_is_replaced_not_given_up(
        streaming: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    fake_slack.fail_next("chat.stopStream", Failure(error="message_not_in_streaming_state"))
    event, reply = await _writing(streaming, fake_llm, "slack ended it", "the end.")
    await fake_slack.wait_for("chat.startStream")
    reply.resume.set()
    await fake_slack.wait_for("chat.update")
    await streaming.idle()
    [message] = _answer_messages(fake_slack, event["ts"])
    assert fake_slack.shown(message["ts"]) == reply.text and message["metadata"]
    assert fake_slack.posts() == []


async def test_a_stream_too_old_to_be_found_again_is_deleted_and_the_answer_posted(
        streaming: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM, monkeypatch: pytest.MonkeyPatch) -> None:
    from channels.slack import streams

    monkeypatch.setattr(streams, "STALE_S", 0.0)  # as if the model had been writing for minutes
    event, reply = await _writing(streaming, fake_llm, "an old stream", "the end.")
    await fake_slack.wait_for("chat.startStream")
    reply.resume.set()
    posts = await fake_slack.wait_for("chat.postMessage")
    await streaming.idle()
    assert fake_slack.of("chat.delete")
    [message] = _answer_messages(fake_slack, event["ts"])
    assert message["ts"] == posts[0].params.get("ts", message["ts"]) and message["metadata"]
    assert message["text"] == reply.text


async def test_model_text_cannot_mention_the_channel(streaming: GatewayClient, fake_slack: FakeSlack,
                                                     fake_llm: FakeLLM) -> None:
    reply = Reply(text=INTRO + "<!channel> and <@U999> <", pieces=[INTRO, "<!channel> and <", "@U999> <"],
                  hold_after=1)
    fake_llm.then(reply)
    await streaming.send_event(mention("ping everyone"))
    await asyncio.wait_for(reply.held.wait(), 5)
    await fake_slack.wait_for("chat.startStream")
    reply.resume.set()
    await fake_slack.wait_for("chat.stopStream")
    await streaming.idle()
    sent = "".join(str(params.get("markdown_text") or "") for _, params in _answer_calls(fake_slack))
    assert "<!" not in sent and "<@" not in sent


async def test_a_stopped_turn_says_so_on_its_stream(streaming: GatewayClient, fake_slack: FakeSlack,
                                                    fake_llm: FakeLLM) -> None:
    _event, reply = await _writing(streaming, fake_llm, "stop me", "never written")
    await fake_slack.wait_for("chat.startStream")
    resp = await streaming.interact(command_body("stop"))  # the channel's running turn
    assert resp.status == 200
    stops = await fake_slack.wait_for("chat.stopStream")
    reply.resume.set()
    await streaming.idle()
    assert "(stopped)" in stops[0].params["markdown_text"] and not stops[0].params.get("metadata")


async def test_a_mention_split_across_two_appends_never_forms(streaming: GatewayClient, fake_slack: FakeSlack,
                                                              fake_llm: FakeLLM) -> None:
    pieces = [INTRO + "tell <", "!channel> and <", "https://evil.example|x>"]  # each piece ends in "<"
    reply = Reply(text="".join(pieces), pieces=pieces, hold_after=1)
    fake_llm.then(reply)
    await streaming.send_event(mention("split it"))
    await asyncio.wait_for(reply.held.wait(), 5)
    await fake_slack.wait_for("chat.startStream")
    reply.resume.set()
    await fake_slack.wait_for("chat.stopStream")
    await streaming.idle()
    sent = "".join(str(c.params.get("markdown_text") or "") for c in fake_slack.calls
                   if c.method in ("chat.startStream", "chat.appendStream", "chat.stopStream"))
    assert "<!channel>" not in sent and "<https:" not in sent
