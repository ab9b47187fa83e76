"""Traces (SPEC §17 "Traces", issue 38.7): one trace per turn, named by the GenAI semantic conventions, recorded
with the SDK's in-memory exporter through the real Slack app; no message text unless asked; and no OpenTelemetry at
all (not even imported) when no OTEL_* variable asks for traces."""

from __future__ import annotations

import importlib.abc
import json
import logging
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import aiohttp
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from bot.app import Application, build_application
from bot.settings import Settings
from bot.tracing import OpenTelemetryTracer, from_environment, provider
from core.tracing import NO_TRACING, Tracer
from tests.conftest import GatewayClient
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import block_action, mention
from tests.test_architecture import violations

SECRET = "sk-test-key-abcdef"  # LLM_API_KEY in make_settings: the redactor knows it
CONTENT = ("gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.system_instructions",
           "gen_ai.tool.call.arguments", "gen_ai.tool.call.result")

Start = Callable[..., Awaitable[GatewayClient]]


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
async def traced(exporter: InMemorySpanExporter, database_url: str | None) -> AsyncIterator[Start]:
    """Start the real application (Slack over HTTP) with spans going to ``exporter`` as they end (the test's
    database, ``database_url``, set up first, so it is dropped only after the application stopped)."""
    started: list[tuple[Application, aiohttp.ClientSession]] = []

    async def start(settings: Settings, *, content: bool = False, tracer: Tracer | None = None) -> GatewayClient:
        app = build_application(settings, tracer=tracer or OpenTelemetryTracer(provider([exporter], batch=False),
                                                                              content=content))
        await app.start()
        started.append((app, aiohttp.ClientSession()))
        return GatewayClient(app, started[-1][1])

    yield start
    for app, http in started:
        await http.close()
        await app.stop()


def _named(spans: Sequence[ReadableSpan], prefix: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name.startswith(prefix)]


def _one(spans: Sequence[ReadableSpan], name: str) -> ReadableSpan:
    found = [span for span in spans if span.name == name]
    assert len(found) == 1, [span.name for span in spans]
    return found[0]


def _parent(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def _id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


def _trace(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.trace_id


def _every_value(spans: Sequence[ReadableSpan]) -> str:
    return json.dumps([{k: str(v) for k, v in (span.attributes or {}).items()} | {"name": span.name}
                       for span in spans])


async def _approve_shell_call(gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM, text: str) -> str:
    """A mention whose model call asks for a gated shell_run; returns the approval card's request id."""
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo traced-output"})]))
    await gateway.send_event(mention(text))
    card = (await fake_slack.wait_for("chat.postMessage", 1))[0]
    return str(card.params["blocks"][-1]["elements"][0]["value"])


async def test_a_mention_is_one_trace_from_intake_to_delivery(
    traced: Start, make_settings: Callable[..., Settings], exporter: InMemorySpanExporter, fake_slack: FakeSlack,
    fake_llm: FakeLLM,
) -> None:
    gateway = await traced(make_settings())
    request_id = await _approve_shell_call(gateway, fake_slack, fake_llm, "please run the traced thing")
    fake_llm.then(Reply("It printed what you asked."))
    await gateway.interact(block_action("approval:approve", request_id, user="U1"))
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    spans = exporter.get_finished_spans()

    intake, turn = _one(spans, "intake slack"), _one(spans, "invoke_agent default")
    chats, tool = _named(spans, "chat "), _one(spans, "execute_tool shell_run")
    approval, delivery = _one(spans, "await_approval shell_run"), _one(spans, "deliver slack")
    assert [chat.name for chat in chats] == ["chat fake-model"] * 2
    # One trace, from the Slack event to the answer's post: intake → turn → model calls and the tool call (whose
    # approval's wait is its child); the delivery joins the trace the intake began.
    assert {_trace(span) for span in spans} == {_trace(intake)}
    assert intake.parent is None and _parent(turn) == _id(intake) and _parent(delivery) == _id(intake)
    assert [_parent(chat) for chat in chats] == [_id(turn)] * 2 and _parent(tool) == _id(turn)
    assert _parent(approval) == _id(tool)

    assert turn.attributes is not None and dict(turn.attributes) == {
        "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "default", "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "fake-model", "gen_ai.conversation.id": intake.attributes["gen_ai.conversation.id"],
        "chatops.turn.id": turn.attributes["chatops.turn.id"]}
    for chat, request in zip(chats, fake_llm.requests, strict=True):
        attributes = dict(chat.attributes or {})
        assert chat.kind is SpanKind.CLIENT
        assert attributes["gen_ai.operation.name"] == "chat" and attributes["gen_ai.provider.name"] == "openai"
        assert attributes["gen_ai.request.model"] == "fake-model"
        # The tokens the endpoint reported for this very call (the fake counts the request's characters).
        assert attributes["gen_ai.usage.input_tokens"] == _fake_prompt_tokens(request)
        assert attributes["gen_ai.usage.output_tokens"] > 0
    call_id = fake_llm.requests[1]["messages"][-1]["tool_call_id"]
    assert tool.attributes is not None and tool.attributes["gen_ai.tool.call.id"] == call_id
    assert tool.attributes["gen_ai.operation.name"] == "execute_tool" and tool.status.status_code is StatusCode.UNSET
    assert approval.attributes is not None and approval.attributes["chatops.approval.status"] == "approved"
    assert delivery.attributes is not None and delivery.attributes["chatops.delivery.attempt"] == 1

    # No message text by default: neither the question, the command, the tool's output nor the answer.
    shown = _every_value(spans)
    assert not any(key in (span.attributes or {}) for span in spans for key in CONTENT)
    for text in ("please run the traced thing", "traced-output", "It printed"):
        assert text not in shown


def _fake_prompt_tokens(request: dict[str, Any]) -> int:
    from tests.fakes.llm import _usage

    return _usage(request, Reply(""))["prompt_tokens"]


async def test_content_is_captured_only_when_asked_and_then_masked(
    traced: Start, make_settings: Callable[..., Settings], exporter: InMemorySpanExporter, fake_slack: FakeSlack,
    fake_llm: FakeLLM,
) -> None:
    gateway = await traced(make_settings(), content=True)
    # The model repeats a secret it was shown, in its answer and in a call's arguments (that call never runs).
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": f"echo {SECRET}"})]),
                  Reply(f"Your key is {SECRET}."))
    await gateway.send_event(mention(f"remember my key {SECRET} and say hello"))
    await fake_slack.wait_for("chat.postMessage", 1)
    await gateway.idle()
    spans = exporter.get_finished_spans()

    first, second = _named(spans, "chat ")
    attributes = dict(second.attributes or {})
    assert SECRET not in _every_value(spans)
    asked = json.loads(str(attributes["gen_ai.input.messages"]))
    assert asked[0]["role"] == "user"
    assert asked[0]["parts"] == [{"type": "text", "content": "remember my key [redacted:LLM_API_KEY] and say hello"}]
    call = asked[1]["parts"][0]
    assert call["type"] == "tool_call" and "[redacted:LLM_API_KEY]" in call["arguments"]
    assert asked[2]["parts"][0]["type"] == "tool_call_response"
    answer = json.loads(str(attributes["gen_ai.output.messages"]))
    assert answer == [{"role": "assistant",
                       "parts": [{"type": "text", "content": "Your key is [redacted:LLM_API_KEY]."}]}]
    assert "gen_ai.system_instructions" in attributes and "gen_ai.input.messages" in dict(first.attributes or {})
    assert _named(spans, "execute_tool") == []  # a call holding a secret never runs (core.runner)


async def test_a_resumed_turn_joins_its_trace_and_links_to_its_first_span(
    traced: Start, make_settings: Callable[..., Settings], exporter: InMemorySpanExporter, fake_slack: FakeSlack,
    fake_llm: FakeLLM,
) -> None:
    settings = make_settings()
    first = await traced(settings)
    request_id = await _approve_shell_call(first, fake_slack, fake_llm, "run it, then restart")
    await first.app.stop()  # the parked turn is set aside: the next start continues it
    exporter_spans = exporter.get_finished_spans()
    intake = _one(exporter_spans, "intake slack")

    again = await traced(settings)  # another process, as far as the turn knows: only the database carries it
    fake_llm.then(Reply("Done after the restart."))
    await again.interact(block_action("approval:approve", request_id, user="U1"))
    await fake_slack.wait_for("chat.postMessage", 2)
    await again.idle()
    spans = exporter.get_finished_spans()

    turns = _named(spans, "invoke_agent")
    assert len(turns) == 2
    interrupted, resumed = turns
    assert {_trace(span) for span in spans} == {_trace(intake)}
    assert _parent(interrupted) == _parent(resumed) == _id(intake)
    assert [link.context.span_id for link in resumed.links] == [_id(intake)]
    assert resumed.attributes is not None and resumed.attributes["chatops.turn.resumed"] is True
    assert interrupted.links == () and interrupted.status.status_code is StatusCode.ERROR
    assert _parent(_one(spans, "deliver slack")) == _id(intake)


@contextmanager
def opentelemetry_unavailable() -> Iterator[list[str]]:
    """While open, no ``opentelemetry`` module is loaded or can be (as without the extra); the names code
    asked for are listed."""
    asked: list[str] = []

    def ours(name: str) -> bool:
        return name == "opentelemetry" or name.startswith("opentelemetry.")

    class Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> None:
            if ours(name):
                asked.append(name)
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    loaded = {name: module for name, module in sys.modules.items() if ours(name)}
    for name in loaded:
        del sys.modules[name]
    refuse = Refuse()
    sys.meta_path.insert(0, refuse)
    try:
        yield asked
    finally:
        sys.meta_path.remove(refuse)
        for name in [name for name in sys.modules if ours(name)]:
            del sys.modules[name]
        sys.modules.update(loaded)


async def test_without_otel_variables_a_turn_never_imports_opentelemetry(
    make_settings: Callable[..., Settings], fake_slack: FakeSlack, fake_llm: FakeLLM,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in [name for name in os.environ if name.startswith("OTEL_")]:
        monkeypatch.delenv(name)
    with opentelemetry_unavailable() as asked:
        # The bot run path: the application built from the environment, started, a mention answered, stopped.
        app = build_application(make_settings())
        assert app.dispatcher.tracer is NO_TRACING and app.dispatcher.runner.tracer is NO_TRACING
        await app.start()
        async with aiohttp.ClientSession() as http:
            gateway = GatewayClient(app, http)
            fake_llm.then(Reply("Plain answer."))
            await gateway.send_event(mention("hello"))
            await fake_slack.wait_for("chat.postMessage", 1)
            await gateway.idle()
        await app.stop()
        assert asked == [] and not [name for name in sys.modules if name.startswith("opentelemetry")]


def test_only_otel_variables_turn_traces_on() -> None:
    assert from_environment({}) is NO_TRACING
    assert from_environment({"OTEL_SERVICE_NAME": "bot"}) is NO_TRACING  # a name alone sends nothing anywhere
    assert from_environment({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}) is NO_TRACING
    assert from_environment({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "console"}) is NO_TRACING
    for environ, content in (({"OTEL_TRACES_EXPORTER": "console"}, False),
                             ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
                               "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true"}, True)):
        tracer = from_environment(environ)
        assert isinstance(tracer, OpenTelemetryTracer) and tracer.content is content
        tracer.provider.shutdown()


def test_traces_asked_for_without_the_extra_cost_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    with opentelemetry_unavailable(), caplog.at_level(logging.WARNING, logger="bot.tracing"):
        assert from_environment({"OTEL_TRACES_EXPORTER": "otlp"}) is NO_TRACING
    warnings = [r.getMessage() for r in caplog.records if r.name == "bot.tracing"]
    assert len(warnings) == 1 and "[otel] extra is not installed" in warnings[0]


def test_core_never_imports_opentelemetry() -> None:
    assert violations("core", ("opentelemetry",)) == []


def test_both_providers_split_their_token_counts() -> None:
    from bot.providers.anthropic_format import usage_split
    from bot.providers.openai_compat import tokens_of

    assert tokens_of({"usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}}) == {
        "input_tokens": 12, "output_tokens": 3}
    assert tokens_of({"usage": {"prompt_tokens": True}}) == tokens_of({}) == {"input_tokens": None,
                                                                               "output_tokens": None}
    # Anthropic counts cache writes and reads apart from input_tokens: the request's tokens are all three.
    assert usage_split({"input_tokens": 5, "cache_creation_input_tokens": 7, "cache_read_input_tokens": 11,
                        "output_tokens": 2}) == {"input_tokens": 23, "output_tokens": 2}
    assert usage_split(None) == {"input_tokens": None, "output_tokens": None}
