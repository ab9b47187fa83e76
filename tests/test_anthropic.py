"""The native Anthropic provider (LLM_PROVIDER=anthropic) against a fake Messages API: whole and streamed
answers, tool use both ways, images, usage with the prompt cache, each error class, settings, `bot doctor`,
and a Slack mention answered through the real app."""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from bot.doctor import _anthropic_model
from bot.errors import SettingsError
from bot.providers.anthropic import AnthropicProvider, api_base
from bot.settings import Settings, load_settings
from core.errors import ProviderError
from core.providers import ChatMessage, CompletionRequest, RetryPolicy, ToolCall, complete_with_retries
from tests.bot_process import run_cli, slack_env
from tests.fakes.anthropic_api import BAD_KEY, MODEL, ApiError, FakeAnthropic, Reply
from tests.fakes.llm import FakeLLM
from tests.fakes.server import RunningServer
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import mention

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "time_now", "description": "The time.",
                                      "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "file_write", "description": "Write a file.",
                                      "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                     "required": ["path"]}}},
]
REQUEST = CompletionRequest(instructions="be brief", messages=[ChatMessage("user", "hi")])
PNG = "data:image/png;base64,iVBORw0KGgo="


class Texts:
    def __init__(self) -> None:
        self.pieces: list[str] = []
        self.restarts = 0

    def restart(self) -> None:
        self.restarts += 1
        self.pieces.clear()

    def __call__(self, text: str) -> None:
        self.pieces.append(text)


@pytest.fixture
async def api() -> AsyncIterator[tuple[FakeAnthropic, str]]:
    fake = FakeAnthropic()
    server = await RunningServer(fake.app()).start()
    yield fake, server.url
    await server.stop()


@pytest.fixture
async def provider(api: tuple[FakeAnthropic, str]) -> AsyncIterator[AnthropicProvider]:
    made = AnthropicProvider(base_url=f"{api[1]}/v1", api_key="sk-ant-test", model=MODEL, timeout_s=5)
    yield made
    await made.aclose()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- answers ---------------------------------------------------------------------------------------------


async def test_a_plain_answer_as_json_with_its_usage(api: Any, provider: AnthropicProvider) -> None:
    fake, _ = api
    fake.then(Reply("The disk is fine."))
    completion = await provider.complete(REQUEST)
    assert completion.content == "The disk is fine." and completion.tool_calls == ()
    body, headers = fake.requests[0], fake.headers[0]
    assert "stream" not in body and body["model"] == MODEL and body["max_tokens"] == 4096
    assert body["system"] == [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}]
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert "sk-ant-test" in (headers.get("x-api-key"), headers.get("authorization", "").removeprefix("Bearer "))
    assert headers["anthropic-version"]
    # input + output + the prompt cache written (the first call): every token counts against the budget
    usage = fake.usages[0]
    assert usage["cache_creation_input_tokens"] > 0 and usage["cache_read_input_tokens"] == 0
    assert completion.usage == sum(usage.values())


async def test_a_streamed_answer_arrives_piece_by_piece_and_counts_cache_reads(
        api: Any, provider: AnthropicProvider) -> None:
    fake, _ = api
    fake.then(Reply("warm the cache"), Reply("The disk is fine.", pieces=["The disk ", "is fine."]))
    first = await provider.complete(REQUEST, on_text=Texts())
    texts = Texts()
    second = await provider.complete(REQUEST, on_text=texts)
    assert fake.streamed(0) and fake.streamed(1)
    assert first.content == "warm the cache"
    assert texts.pieces == ["The disk ", "is fine."] and second.content == "The disk is fine."
    usage = fake.usages[1]  # message_start's input figures and message_delta's output tokens, added up
    assert usage["cache_read_input_tokens"] > 0 and usage["cache_creation_input_tokens"] == 0
    assert second.usage == sum(usage.values())


async def test_without_llm_stream_the_answer_is_asked_for_whole(api: Any) -> None:
    fake, url = api
    quiet = AnthropicProvider(base_url=url, api_key="k", model=MODEL, timeout_s=5, stream=False)
    try:
        assert (await quiet.complete(REQUEST, on_text=Texts())).content == "echo: hi"
    finally:
        await quiet.aclose()
    assert not fake.streamed()


def test_the_base_url_is_the_api_root_with_or_without_v1() -> None:
    assert api_base(None) == "https://api.anthropic.com"
    assert api_base("http://proxy:4000/v1/") == api_base("http://proxy:4000") == "http://proxy:4000"


# -- tools -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_a_tool_use_round_trip(api: Any, provider: AnthropicProvider, stream: bool) -> None:
    fake, _ = api
    fake.then(Reply("Let me look.", tool_calls=[("time_now", {}), ("file_write", {"path": "a b.txt"})]),
              Reply("Done."))
    on_text = Texts() if stream else None
    first = await provider.complete(CompletionRequest("be brief", [ChatMessage("user", "write it")], TOOLS),
                                    on_text=on_text)
    assert first.content == "Let me look."
    assert [(c.name, json.loads(c.arguments)) for c in first.tool_calls] == [
        ("time_now", {}), ("file_write", {"path": "a b.txt"})]
    assert all(c.id.startswith("toolu_") for c in first.tool_calls)
    sent = fake.requests[0]["tools"]
    assert sent == [
        {"name": "time_now", "description": "The time.", "input_schema": {"type": "object", "properties": {}}},
        {"name": "file_write", "description": "Write a file.", "input_schema": TOOLS[1]["function"]["parameters"],
         "cache_control": {"type": "ephemeral"}},  # the last tool closes the cached prefix
    ]

    history = [ChatMessage("user", "write it"),
               ChatMessage("assistant", first.content, tool_calls=first.tool_calls),
               ChatMessage("tool", "12:00", tool_call_id=first.tool_calls[0].id),
               ChatMessage("tool", "", tool_call_id=first.tool_calls[1].id),
               ChatMessage("user", "and hurry")]  # taken in mid-turn
    second = await provider.complete(CompletionRequest("be brief", history, TOOLS), on_text=on_text)
    assert second.content == "Done."
    messages = fake.requests[1]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"] == [
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": first.tool_calls[0].id, "name": "time_now", "input": {}},
        {"type": "tool_use", "id": first.tool_calls[1].id, "name": "file_write", "input": {"path": "a b.txt"}}]
    assert messages[2]["content"] == [  # the results merged into one user message, first in it
        {"type": "tool_result", "tool_use_id": first.tool_calls[0].id, "content": "12:00"},
        {"type": "tool_result", "tool_use_id": first.tool_calls[1].id},
        {"type": "text", "text": "and hurry"}]


async def test_adjacent_messages_of_one_role_are_merged_and_odd_ids_made_valid(
        api: Any, provider: AnthropicProvider) -> None:
    fake, _ = api
    history = [ChatMessage("assistant", "Hello, I am the bot."),  # a thread may open with the bot's own post
               ChatMessage("user", "first"), ChatMessage("user", "second"),
               ChatMessage("assistant", "", tool_calls=(ToolCall("call:1/x", "time_now", "not json"),)),
               ChatMessage("tool", "12:00", tool_call_id="call:1/x")]
    await provider.complete(CompletionRequest("", history, TOOLS))
    body = fake.requests[0]
    assert "system" not in body  # no empty system block
    messages = body["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    assert messages[2]["content"] == [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]
    assert messages[3]["content"] == [{"type": "tool_use", "id": "call_1_x", "name": "time_now", "input": {}}]
    assert messages[4]["content"][0]["tool_use_id"] == "call_1_x"


async def test_images_go_as_base64_and_url_sources(api: Any, provider: AnthropicProvider) -> None:
    fake, _ = api
    message = ChatMessage("user", "what is this?", images=(PNG, "https://example.com/chart.jpg"))
    await provider.complete(CompletionRequest("be brief", [message]))
    assert fake.requests[0]["messages"][0]["content"] == [
        {"type": "text", "text": "what is this?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/chart.jpg"}}]


# -- errors ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("error", "kind", "retryable", "retry_after"), [
    (ApiError(401, "invalid x-api-key"), "auth", False, None),
    (ApiError(403, "not allowed"), "auth", False, None),
    (ApiError(429, "Number of request tokens has exceeded your rate limit", retry_after=7), "rate_limit", True, 7.0),
    (ApiError(529, "Overloaded", retry_after=3), "rate_limit", True, 3.0),
    (ApiError(500, "Internal server error"), "model", True, None),
    (ApiError(400, "prompt is too long: 215000 tokens > 200000 maximum"), "context_overflow", False, None),
    (ApiError(400, "input length and `max_tokens` exceed context limit: 198000 + 4096 > 200000, decrease input "
                   "length or `max_tokens` and try again"), "context_overflow", False, None),
    (ApiError(400, "messages.0: unexpected field"), "model", False, None),
    (ApiError(404, "model: claude-nope"), "model", False, None),
])
async def test_each_error_is_classified_like_the_openai_provider(
        api: Any, provider: AnthropicProvider, stream: bool, error: ApiError, kind: str, retryable: bool,
        retry_after: float | None) -> None:
    fake, _ = api
    fake.then(error)
    with pytest.raises(ProviderError) as failure:
        await provider.complete(REQUEST, on_text=Texts() if stream else None)
    assert (failure.value.kind, failure.value.retryable, failure.value.retry_after) == (kind, retryable, retry_after)
    assert failure.value.status == error.status and error.message[:20] in str(failure.value)


async def test_an_error_event_inside_a_stream_is_classified_by_its_type(api: Any, provider: AnthropicProvider) -> None:
    fake, _ = api
    fake.then(Reply("The disk", error_event="overloaded_error"))
    with pytest.raises(ProviderError) as failure:
        await provider.complete(REQUEST, on_text=Texts())
    assert (failure.value.kind, failure.value.retryable, failure.value.status) == ("rate_limit", True, 529)


async def test_a_stream_that_breaks_off_is_a_retryable_network_error(api: Any, provider: AnthropicProvider) -> None:
    fake, _ = api
    fake.then(Reply("The disk is almost full", cut_after=2))
    with pytest.raises(ProviderError) as failure:
        await provider.complete(REQUEST, on_text=Texts())
    assert (failure.value.kind, failure.value.retryable) == ("network", True)


async def test_an_unreachable_endpoint_is_a_retryable_network_error() -> None:
    gone = AnthropicProvider(base_url=f"http://127.0.0.1:{_closed_port()}", api_key="k", model=MODEL, timeout_s=5)
    try:
        for on_text in (None, Texts()):
            with pytest.raises(ProviderError) as failure:
                await gone.complete(REQUEST, on_text=on_text)
            assert (failure.value.kind, failure.value.retryable) == ("network", True)
    finally:
        await gone.aclose()


async def test_retries_honour_retry_after_and_restart_the_stream(api: Any, provider: AnthropicProvider) -> None:
    fake, _ = api
    fake.then(ApiError(529, "Overloaded", retry_after=0.01), ApiError(429, "slow down", retry_after=0.01),
              Reply("at last"))
    texts = Texts()
    completion = await complete_with_retries(provider, REQUEST, RetryPolicy(attempts=3, base_delay_s=0.01), texts)
    assert completion.content == "at last" and texts.pieces == ["at", " last"] and texts.restarts == 3
    assert len(fake.requests) == 3


# -- settings, doctor, the app ---------------------------------------------------------------------------


def _settings(**values: Any) -> Settings:
    return load_settings(env_file=None, **values)


def test_settings_take_anthropic_and_need_a_model_and_a_key() -> None:
    settings = _settings(llm_provider="anthropic", llm_api_key="sk-ant-x", llm_model=MODEL)
    assert settings.provider == "anthropic" and settings.llm_base_url is None
    with pytest.raises(SettingsError, match="LLM_MODEL is required for LLM_PROVIDER=anthropic"):
        _settings(llm_provider="anthropic", llm_api_key="sk-ant-x")
    with pytest.raises(SettingsError, match="LLM_API_KEY is required"):
        _settings(llm_provider="anthropic", llm_model=MODEL)
    assert _settings(llm_provider="anthropic", llm_model=MODEL, llm_base_url="http://proxy:4000").llm_api_key is None


def test_anthropic_without_its_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "anthropic", None)  # as on a machine without the [anthropic] extra
    with pytest.raises(SettingsError) as failure:
        _settings(llm_provider="anthropic", llm_api_key="sk-ant-secret", llm_model=MODEL)
    message = str(failure.value)
    assert ("LLM_PROVIDER (got 'anthropic'): needs anthropic, which is not installed: "
            "pip install 'chatops-gateway[anthropic]'") in message
    assert "sk-ant-secret" not in message and len(message.splitlines()) == 2


@pytest.mark.parametrize(("key", "model", "closed", "ok", "expected"), [
    ("sk-ant-good", MODEL, False, True, f"key accepted, model '{MODEL}' (Claude Fake)"),
    (BAD_KEY, MODEL, False, False, "The model endpoint rejected the API key"),
    ("sk-ant-good", "claude-nope", False, False, "has no model 'claude-nope'"),
    ("sk-ant-good", MODEL, True, False, "I could not reach the model endpoint"),
])
async def test_doctor_checks_the_key_and_the_model(api: Any, key: str, model: str, closed: bool, ok: bool,
                                                   expected: str) -> None:
    _, url = api
    base = f"http://127.0.0.1:{_closed_port()}" if closed else url
    check = await _anthropic_model(_settings(llm_provider="anthropic", llm_api_key=key, llm_model=model,
                                             llm_base_url=base))
    assert check.ok is ok and expected in check.detail, check
    assert ok or "LLM_" in check.fix


async def test_bot_doctor_prints_the_model_check(api: Any, tmp_path: Path, fake_slack: FakeSlack,
                                                 fake_llm: FakeLLM) -> None:
    _, url = api
    env = slack_env(fake_slack, fake_llm, 3000) | {"LLM_PROVIDER": "anthropic", "LLM_BASE_URL": url,
                                                   "LLM_MODEL": MODEL, "BOT_SECRET_KEYS": "k1:" + "A" * 43 + "="}
    code, out = await run_cli(tmp_path, env, "doctor")
    assert code == 0 and f"✓ model: {url} reachable, key accepted, model '{MODEL}'" in out, out
    code, out = await run_cli(tmp_path, env | {"LLM_API_KEY": BAD_KEY}, "doctor")
    assert code == 1 and "✗ model: The model endpoint rejected the API key" in out and "fix: " in out, out


async def test_a_slack_mention_is_answered_through_anthropic(api: Any, make_settings: Callable[..., Settings],
                                                             start_gateway: Any, fake_slack: FakeSlack) -> None:
    fake, url = api
    gateway = await start_gateway(make_settings(llm_provider="anthropic", llm_base_url=f"{url}/v1",
                                                llm_model=MODEL, llm_api_key="sk-ant-test"))
    event = mention("why is the deploy failing?")
    assert (await gateway.send_event(event)).status == 200
    posts = await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()
    assert posts[0].params["thread_ts"] == event["ts"]
    assert posts[0].params["text"] == "echo: why is the deploy failing?"
    body = fake.requests[0]
    assert body["model"] == MODEL and body["stream"] is True  # LLM_STREAM: the model streams
    assert body["system"][0]["cache_control"] == {"type": "ephemeral"} and body["system"][0]["text"]
    assert body["tools"][-1]["cache_control"] == {"type": "ephemeral"}
    assert all("cache_control" not in tool for tool in body["tools"][:-1])
    assert body["messages"][-1]["role"] == "user"


# -- attack review ----------------------------------------------------------------------------------------


async def test_a_redirect_is_not_followed_and_is_a_configuration_error() -> None:
    from aiohttp import web

    stolen: list[str] = []

    async def moved(request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(f"http://{request.host}/steal")

    async def steal(request: web.Request) -> web.Response:
        stolen.append(await request.text())
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/v1/messages", moved)
    app.router.add_post("/steal", steal)
    server = await RunningServer(app).start()
    provider = AnthropicProvider(base_url=server.url, api_key="sk-ant-test", model=MODEL, timeout_s=5,
                                 stream=False)
    try:
        with pytest.raises(ProviderError) as info:
            await provider.complete(REQUEST)
    finally:
        await provider.aclose()
        await server.stop()
    assert info.value.status == 307 and not info.value.retryable and "LLM_BASE_URL" in str(info.value)
    assert stolen == []  # the prompt went nowhere else


def test_usage_figures_only_grow_and_unsupported_images_are_left_out() -> None:
    from types import SimpleNamespace

    from bot.providers.anthropic_format import StreamedMessage, body

    whole = StreamedMessage()
    whole.add(SimpleNamespace(type="message_start", message=SimpleNamespace(
        usage=SimpleNamespace(input_tokens=120, output_tokens=1))))
    whole.add(SimpleNamespace(type="message_delta", usage=SimpleNamespace(input_tokens=0, output_tokens=40)))
    whole.add(SimpleNamespace(type="message_stop"))
    assert whole.completion().usage == 160  # a later 0 does not wipe the input count
    svg = "data:image/svg+xml;base64,PHN2Zz48L3N2Zz4="
    request = CompletionRequest(instructions="x", messages=[ChatMessage("user", "look", images=(svg, PNG))])
    blocks = body(MODEL, 100, request)["messages"][0]["content"]
    assert [b["source"]["media_type"] for b in blocks if b["type"] == "image"] == ["image/png"]
