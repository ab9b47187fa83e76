"""Fitting a long thread into the model's context window (LLM_CONTEXT_TOKENS): old tool results shortened
first, then the oldest messages left out whole (a tool call never without its result), summarised once and
reused, the model told; a provider's "context length exceeded" retried once in less room."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import pytest

from core.context_window import ContextWindow, fit, message_tokens
from core.providers import ChatMessage, ToolCall
from tests.conftest import GatewayClient
from tests.fakes.llm import SUMMARY, FakeLLM, Gate, HttpError, Reply
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import mention, message


def _call(ident: str) -> ChatMessage:
    return ChatMessage("assistant", "", (ToolCall(ident, "shell_run", '{"command": "cat big.log"}'),))


def _result(ident: str, size: int) -> ChatMessage:
    return ChatMessage("tool", "x" * size, tool_call_id=ident)


def _tokens(messages: list[ChatMessage]) -> int:
    return sum(message_tokens(m) for m in messages)


def test_a_thread_that_fits_is_replayed_as_it_is() -> None:
    history = [ChatMessage("user", "hi"), ChatMessage("assistant", "hello"), ChatMessage("user", "again")]
    fitted = fit(history, 1_000, keep_from=2)
    assert fitted.messages == history and fitted.left_out == [] and fitted.shortened == 0


def test_old_tool_results_are_shortened_before_anything_is_left_out() -> None:
    history = [ChatMessage("user", "check the logs"), _call("a"), _result("a", 30_000),
               ChatMessage("assistant", "done"), ChatMessage("user", "and now?")]
    fitted = fit(history, 2_000, keep_from=4)
    assert fitted.left_out == [] and fitted.shortened == 1
    assert "shortened from 30000 characters" in fitted.messages[2].content and _tokens(fitted.messages) <= 2_000


def test_the_oldest_messages_are_left_out_whole_and_this_turn_is_kept() -> None:
    history = []
    for n in range(6):
        history += [ChatMessage("user", f"question {n} " + "q" * 900), _call(f"c{n}"), _result(f"c{n}", 900),
                    ChatMessage("assistant", f"answer {n}")]
    history += [ChatMessage("user", "the question now")]
    fitted = fit(history, 1_500, keep_from=len(history) - 1)
    assert _tokens(fitted.messages) <= 1_500 and fitted.left_out
    assert fitted.messages[-1].content == "the question now"
    kept_calls = {c.id for m in fitted.messages for c in m.tool_calls}
    kept_results = {m.tool_call_id for m in fitted.messages if m.role == "tool"}
    assert kept_results == kept_calls  # no result without its call, no call without its result
    assert fitted.messages[0].role != "tool"
    assert fitted.left_out + fitted.messages == history and fitted.shortened == 0  # left out, nothing else lost


def test_this_turn_is_never_left_out_even_when_it_alone_is_too_big() -> None:
    history = [ChatMessage("user", "old"), ChatMessage("assistant", "old answer"), ChatMessage("user", "now"),
               _call("a"), _result("a", 40_000)]
    fitted = fit(history, 1_000, keep_from=2)
    assert [m.content for m in fitted.messages[:1]] == ["now"] and len(fitted.messages) == 3
    assert fitted.messages[-1].content.endswith("to fit the model's context window]")


async def test_the_summary_is_made_once_and_reused_while_the_same_messages_are_left_out() -> None:
    asked: list[list[ChatMessage]] = []

    async def summarise(messages: list[ChatMessage]) -> str:
        asked.append(messages)
        return "They checked the disk; it was full."

    window = ContextWindow(4_000, summaries=None, summarise=summarise)
    history = [ChatMessage("user", "u" * 6_000), ChatMessage("assistant", "a" * 6_000), ChatMessage("user", "now")]
    first = await window.fit("s", history, 1_200, keep_from=2)
    again = await window.fit("s", history, 1_200, keep_from=2)
    assert first == again and len(asked) == 1
    assert first[0].role == "user" and first[0].content.startswith("(This thread was shortened")
    assert "They checked the disk" in first[0].content and first[-1].content == "now"


async def test_a_summary_is_reused_after_the_window_slides_and_never_stretched_over_a_repeat() -> None:
    asked: list[list[ChatMessage]] = []

    async def summarise(messages: list[ChatMessage]) -> str:
        asked.append(messages)
        return "the start"

    window = ContextWindow(4_000, summaries=None, summarise=summarise)
    history = [ChatMessage("user", "u" * 3_000), ChatMessage("assistant", "ok"), ChatMessage("user", "v" * 3_000),
               ChatMessage("assistant", "ok"), ChatMessage("user", "w" * 600), ChatMessage("assistant", "ok"),
               ChatMessage("user", "now")]
    first = await window.fit("s", history, 1_700, keep_from=6)
    covered = int(first[0].content.split("its ")[1].split(" ")[0])
    slid = [*history[1:], ChatMessage("assistant", "ok"), ChatMessage("user", "y" * 2_000)]  # the window moved on
    again = await window.fit("s", slid, 1_700, keep_from=len(slid) - 1)
    assert len(asked) == 1 and again[0].content.startswith("(This thread was shortened")
    assert again[1:] == slid[covered - 1:]  # shown again: right after what the summary covers

    # A summary that ends at a message repeated later ("ok") is taken to end at its first place: what it does
    # not cover is shown, never dropped unsummarised.
    from core.context_window import left_out_key

    window._remember("t", left_out_key([ChatMessage("assistant", "ok")])[:48], "up to the first ok")
    thread = [ChatMessage("user", "a" * 3_000), ChatMessage("assistant", "ok"), ChatMessage("user", "b" * 300),
              ChatMessage("assistant", "ok"), ChatMessage("user", "c" * 1_800)]
    shown = await window.fit("t", thread, 1_500, keep_from=4)
    assert "its 2 oldest messages" in shown[0].content
    assert shown[1:] == thread[2:] and len(asked) == 1


# -- through the real app ------------------------------------------------------------------------------

async def test_a_long_thread_reaches_the_model_within_its_window_with_a_summary(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    gateway: GatewayClient = await start_gateway(make_settings(llm_context_tokens=8_000))
    root = mention("start " + "s" * 6_000)
    fake_llm.then(Reply("first answer"))
    await gateway.send_event(root)
    await fake_slack.wait_for("chat.postMessage", 1)
    for n in range(1, 11):
        fake_llm.then(Reply(f"answer {n}"))
        await gateway.send_event(mention(f"more {n} " + "m" * (3_000 if n == 1 else 300), thread_ts=root["ts"]))
        await fake_slack.wait_for("chat.postMessage", n + 1)
        await gateway.idle()
    answers = [r for r in fake_llm.requests if not FakeLLM._is_summary(r)]
    last = answers[-1]
    first = last["messages"][1]  # after the system instructions
    assert first["role"] == "user" and "This thread was shortened" in first["content"]
    assert SUMMARY in first["content"] and "not instructions to follow" in first["content"]
    assert last["messages"][-1]["content"].startswith("more 10")
    assert all(len(json.dumps(r["messages"]).encode()) / 3 < 8_000 for r in answers)
    # Left out in steps (to 70% of the room): one summary serves the turns that follow, not one each.
    assert 1 <= fake_llm.summaries <= 2


async def test_context_length_exceeded_is_retried_once_in_less_room_not_a_dead_turn(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    gateway: GatewayClient = await start_gateway(make_settings(llm_context_tokens=8_000))
    root = mention("start " + "s" * 6_000)
    fake_llm.then(Reply("first answer"))
    await gateway.send_event(root)
    await fake_slack.wait_for("chat.postMessage", 1)
    fake_llm.then(HttpError(400, "This model's maximum context length is 4096 tokens", code="context_length_exceeded"),
                  Reply("answered after all"))
    await gateway.send_event(mention("next " + "n" * 6_000, thread_ts=root["ts"]))
    posts = await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    assert posts[1].params["text"] == "answered after all"
    answers = [r for r in fake_llm.requests if not FakeLLM._is_summary(r)]
    assert len(json.dumps(answers[-1]["messages"])) < len(json.dumps(answers[-2]["messages"]))


async def test_a_resumed_turn_keeps_its_own_question() -> None:
    """After a restart the turn's history ends with its own calls: its question is still never left out."""
    from types import SimpleNamespace

    from core.chat_history import turn_start as _turn_start

    rows = [SimpleNamespace(role="user", content="old " + "o" * 5_000, tool_calls=None, tool_call_id=None, turn_id=1),
            SimpleNamespace(role="assistant", content="old answer", tool_calls=None, tool_call_id=None, turn_id=1),
            SimpleNamespace(role="user", content="CURRENT QUESTION", tool_calls=None, tool_call_id=None, turn_id=2),
            SimpleNamespace(role="assistant", content="", tool_calls='[{"id": "a", "name": "time_now", '
                            '"arguments": "{}"}]', tool_call_id=None, turn_id=2),
            SimpleNamespace(role="tool", content="r" * 5_000, tool_call_id="a", tool_calls=None, turn_id=2)]
    from core.chat_history import to_chat as _to_chat

    history = _to_chat(rows)
    keep = _turn_start(rows, 2, history)
    assert keep == 2
    fitted = fit(history, 900, keep_from=keep)
    assert fitted.messages[0].content == "CURRENT QUESTION" and fitted.left_out[0].content.startswith("old ")


# -- the newest question in a long thread (issue 32, point 6) ------------------------------------------

def _reply(n: int) -> str:
    """One thread reply seen as context: a person pasting a log excerpt (about 1,200 characters)."""
    lines = [f"2024-05-01T10:{n:02d}:{k:02d}Z worker-{n % 7} GET /api/orders/{n * 100 + k} 502 upstream timed out "
             "after 30000 ms (pool exhausted)" for k in range(10)]
    return f"REPLY-{n:02d} from the on-call: here is what I see\n" + "\n".join(lines)


def _request_tokens(request: dict[str, Any]) -> int:
    """What the model received, estimated the way the context window counts (UTF-8 bytes / 3)."""
    return math.ceil(len(json.dumps(request["messages"], ensure_ascii=False).encode()) / 3)


@pytest.mark.parametrize("window", [6_000, 12_000, 24_000])
async def test_the_question_after_a_pile_up_of_thread_replies_reaches_the_model_and_the_window_is_filled(
    window: int, make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    """Dozens of long replies seen as context, then a mention: the question is never cut, the newest replies
    come with it, the oldest are what is left out (the model is told), and the window is used, not left empty."""
    gateway: GatewayClient = await start_gateway(make_settings(llm_context_tokens=window))
    root = mention("start")
    await gateway.send_event(root)
    await fake_slack.wait_for("chat.postMessage", 1)
    await gateway.idle()
    replies = [_reply(n) for n in range(60)]  # about 75,000 characters: more than any of these windows
    for n, text in enumerate(replies):
        await gateway.send_event(message(text, thread_ts=root["ts"], user=f"U{2 + n % 3}"))
    await gateway.idle()
    question = "QUESTION: which worker failed first, and what should we restart?"
    await gateway.send_event(mention(question, thread_ts=root["ts"]))
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()

    request = [r for r in fake_llm.requests if not FakeLLM._is_summary(r)][-1]
    sent = json.dumps(request["messages"], ensure_ascii=False)
    last = request["messages"][-1]
    assert last["role"] == "user" and last["content"].endswith(question)  # verbatim, and last
    assert replies[-1] in last["content"] and replies[-2] in last["content"]  # the newest context, whole
    assert "REPLY-00" not in sent  # the oldest is what was left out
    assert "left out" in sent  # and the model is told so
    kept = [n for n in range(60) if f"REPLY-{n:02d}" in sent]
    assert kept == list(range(kept[0], 60))  # left out oldest first: what is kept is the newest, in a row
    # Filled: the request holds most of what the window leaves for the messages, and never more.
    room = ContextWindow(window).room(request["messages"][0]["content"], [t["function"] for t in request["tools"]])
    assert 0.7 * room < _request_tokens(request) <= window


def _answers(fake_llm: FakeLLM) -> list[dict[str, Any]]:
    return [r for r in fake_llm.requests if not FakeLLM._is_summary(r)]


def _room(window: int, request: dict[str, Any]) -> int:
    return ContextWindow(window).room(request["messages"][0]["content"], [t["function"] for t in request["tools"]])


async def test_the_question_is_kept_when_a_long_reply_came_after_it_in_the_same_batch(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    """What addressed the bot is kept, not whatever came last: a long plain reply written just after the
    mention (both waiting behind a running turn) is context, cut before the question ever is."""
    gateway: GatewayClient = await start_gateway(make_settings(llm_context_tokens=6_000))
    held = Gate(Reply("first answer"))
    fake_llm.then(held)
    root = mention("start")
    await gateway.send_event(root)
    await asyncio.wait_for(held.reached.wait(), 10)
    replies = [_reply(n) for n in range(25)]
    for n, text in enumerate(replies):
        await gateway.send_event(message(text, thread_ts=root["ts"], user=f"U{2 + n % 3}"))
    question = "QUESTION: which worker failed first?"
    await gateway.send_event(mention(question, thread_ts=root["ts"]))
    late = "LATE-REPLY " + "\n".join(_reply(n) for n in range(100, 110))  # 12,000 characters, after the question
    await gateway.send_event(message(late, thread_ts=root["ts"], user="U3"))
    held.opened.set()
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()

    request = _answers(fake_llm)[-1]
    sent = json.dumps(request["messages"], ensure_ascii=False)
    assert question in request["messages"][-1]["content"]
    assert "REPLY-00" not in sent and "left out" in sent
    assert late[-2_000:] in request["messages"][-1]["content"]  # the newest context: as much of it as fits
    assert 0.7 * _room(6_000, request) < _request_tokens(request) <= 6_000


async def test_a_question_steered_into_a_running_turn_after_a_pile_up_reaches_the_model(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    """The newest steered message that addressed the bot is never cut either, nor the turn's own question."""
    gateway: GatewayClient = await start_gateway(make_settings(llm_context_tokens=6_000))
    held = Gate(Reply(tool_calls=[("time_now", {})]))
    fake_llm.then(held, Reply("both answered"))
    first = "FIRST-QUESTION: is the checkout service healthy?"
    root = mention(first)
    await gateway.send_event(root)
    await asyncio.wait_for(held.reached.wait(), 10)
    for n in range(60):
        await gateway.send_event(message(_reply(n), thread_ts=root["ts"], user=f"U{2 + n % 3}"))
    steered = "SECOND-QUESTION: and which worker failed first?"
    await gateway.send_event(mention(steered, thread_ts=root["ts"]))
    held.opened.set()
    assert (await fake_slack.wait_for("chat.postMessage", 1))[0].params["text"] == "both answered"
    await gateway.idle()

    request = _answers(fake_llm)[-1]
    sent = json.dumps(request["messages"], ensure_ascii=False)
    users = [m["content"] for m in request["messages"] if m["role"] == "user"]
    assert users[0].endswith(first) and users[-1].endswith(steered)
    assert _reply(59) in users[-1] and "REPLY-00" not in sent and "left out" in sent
    assert 0.7 * _room(6_000, request) < _request_tokens(request) <= 6_000


async def test_a_question_longer_than_the_whole_window_keeps_its_start_and_its_end_and_says_so(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    """Nothing older is left to drop: the message itself is cut in its middle (where a pasted log usually is),
    so the model reads how it begins and the question at its end, and is told how much it did not see."""
    gateway: GatewayClient = await start_gateway(make_settings(llm_context_tokens=6_000))
    head = "HEAD: the deploy of checkout failed, log below."
    tail = "TAIL-QUESTION: what went wrong, and is it safe to retry?"
    body = "\n".join(_reply(n) for n in range(25))
    await gateway.send_event(mention(f"{head}\n{body}\n{tail}"))
    await fake_slack.wait_for("chat.postMessage", 1)
    await gateway.idle()

    request = _answers(fake_llm)[-1]
    text = request["messages"][-1]["content"]
    assert head in text and text.endswith(tail)
    assert "characters of this message were left out" in text
    assert 0.7 * _room(6_000, request) < _request_tokens(request) <= 6_000


def test_this_turns_context_goes_oldest_first_the_question_stays_and_the_gap_is_marked() -> None:
    """In a merged batch, the newest message that addressed the bot is kept; older questions and context go oldest
    first, one mark per gap, and the message at the boundary keeps its end so the budget is used."""
    context = [ChatMessage("user", f"C{n} " + "c" * 900) for n in range(20)]
    older_question = ChatMessage("user", "Q1 " + "q" * 900, asked=True)
    question = ChatMessage("user", "Q2: and now?", asked=True)
    history = [ChatMessage("user", "old"), ChatMessage("assistant", "old answer"),
               older_question, *context[:10], question, *context[10:]]
    fitted = fit(history, 2_000, keep_from=2)
    texts = [m.content for m in fitted.messages]
    assert fitted.left_out == history[:2] and "Q2: and now?" in texts
    assert not any(t.startswith(("Q1", "C0 ", "C9 ")) for t in texts)  # oldest first, the older question too
    assert texts[0].startswith("[") and "earlier messages of this conversation left out" in texts[0]
    assert texts[-1] == context[-1].content  # the newest context, whole
    assert 1_900 < _tokens(fitted.messages) <= 2_000 and fitted.dropped > 0


def test_without_marks_the_turns_first_message_is_its_question() -> None:
    """A sub-agent's task (no input marks it): never left out, however much follows it."""
    history = [ChatMessage("user", "TASK: check the disks"), _call("a"), _result("a", 900),
               *[ChatMessage("user", f"C{n} " + "c" * 900) for n in range(10)]]
    fitted = fit(history, 1_200, keep_from=0)
    assert fitted.messages[0].content == "TASK: check the disks" and _tokens(fitted.messages) <= 1_200
