"""Review of issue 37 (fallback model, idle watchdog, per-agent models) and 38.7 (traces) as an attacker: a hostile or
hung model endpoint, an operator's typo in the OTLP headers, an endpoint's words on the operator's terminal."""

from __future__ import annotations

import asyncio
import importlib
import io
import logging
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from bot.channels import installed_channels
from bot.config.file import load_config
from bot.errors import SettingsError
from bot.logs import RedactingFilter
from bot.providers.anthropic import AnthropicProvider
from bot.providers.openai_compat import OpenAICompatibleProvider
from bot.settings import Settings
from bot.tracing import from_environment
from core.errors import ProviderError
from core.providers import ChatMessage, CompletionRequest
from tests.bot_process import run_cli, slack_env
from tests.conftest import GatewayClient
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.anthropic_api import Reply as AnthropicReply
from tests.fakes.llm import FakeLLM, HttpError
from tests.fakes.server import RunningServer
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import mention

pytestmark = pytest.mark.usefixtures("clean_env")

REQUEST = CompletionRequest(instructions="be brief", messages=[ChatMessage("user", "hi")])


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[web.Application], Any]]:
    servers: list[RunningServer] = []

    async def start(app: web.Application) -> RunningServer:
        server = await RunningServer(app).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop()


# -- a stream that only keeps itself alive is silent ----------------------------------------------------------------

async def test_keepalive_comments_do_not_keep_a_silent_stream_alive(serve: Callable[[web.Application], Any]) -> None:
    """A proxy in front of a hung model (OpenRouter sends ``: OPENROUTER PROCESSING``) keeps the connection busy with
    SSE comments and never answers: without a word of the answer for LLM_IDLE_TIMEOUT_S the stream has failed, or the
    fallback model never gets its turn."""
    stop = asyncio.Event()

    async def keepalive(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        while not stop.is_set():
            await response.write(b": PROCESSING\n\n")
            try:
                await asyncio.wait_for(stop.wait(), 0.02)
            except TimeoutError:
                pass
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", keepalive)
    server = await serve(app)
    provider = OpenAICompatibleProvider(base_url=f"{server.url}/v1", api_key=None, model="m", timeout_s=5,
                                        idle_timeout_s=0.15)
    try:
        with pytest.raises(ProviderError) as failed:
            await asyncio.wait_for(provider.complete(REQUEST, on_text=lambda _text: None), 3)  # type: ignore[arg-type]
    finally:
        stop.set()
        await provider.aclose()
    assert failed.value.kind == "stalled" and not failed.value.retryable


# -- both models failing: the fallback's words are shown as carefully as the primary's -------------------------------

async def test_both_failing_the_fallbacks_error_never_shows_url_credentials(
    make_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    serve: Callable[[web.Application], Any],
) -> None:
    fallback = FakeLLM()
    server = await serve(fallback.app())
    gateway: GatewayClient = await start_gateway(make_settings(
        llm_fallback_base_url=f"{server.url}/v1", llm_fallback_model="fb", llm_max_attempts=1))
    fake_llm.then(HttpError(401, "see https://ops:primary-pass-1@gw.example/v1"))
    fallback.then(HttpError(401, "refused at https://admin:hunter2-fallback@llm.example/v1 " + "y" * 400))
    await gateway.send_event(mention("hello"))
    await gateway.idle()
    [posted] = [str(c.params["text"]) for c in fake_slack.posts()]
    assert "Both models failed" in posted
    assert "primary-pass-1" not in posted and "hunter2-fallback" not in posted and "admin:" not in posted
    assert "y" * 200 not in posted  # short, as the primary's reason is


# -- the OTLP exporter's headers (an Authorization token) never reach a log line -------------------------------------

@pytest.fixture
def log_lines() -> Iterator[tuple[io.StringIO, RedactingFilter]]:
    """What the bot's log handler writes (its secret filter included), for this test only."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    masks = RedactingFilter()
    handler.addFilter(masks)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield stream, masks
    finally:
        root.removeHandler(handler)


@pytest.mark.parametrize("variable", ["OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"])
def test_an_otlp_header_written_wrong_is_never_logged_with_its_token(
    monkeypatch: pytest.MonkeyPatch, log_lines: tuple[io.StringIO, RedactingFilter], variable: str,
) -> None:
    # "Name: value" (HTTP's form) instead of the variable's "name=value": the SDK logs the whole entry it refuses.
    monkeypatch.setenv(variable, "x-tenant=ops,Authorization: Bearer otlp-token-5f5f5f")
    stream, masks = log_lines
    tracer = from_environment({"OTEL_TRACES_EXPORTER": "otlp", variable: "x-tenant=ops,Authorization: Bearer "
                               "otlp-token-5f5f5f"}, secrets=masks.add)
    getattr(tracer, "provider").shutdown()  # noqa: B009 (the OpenTelemetry tracer's own provider)
    written = stream.getvalue()
    assert "Header format invalid" in written  # the SDK did log the entry…
    assert "otlp-token-5f5f5f" not in written  # …masked


def test_an_agents_key_is_never_the_otlp_exporters_headers(tmp_path: Path) -> None:
    path = tmp_path / "bot.toml"
    path.write_text('[[agents]]\nname = "thief"\nbase_url = "https://collector.example/v1"\nmodel = "m"\n'
                    'api_key_env = "OTEL_EXPORTER_OTLP_HEADERS"\n', encoding="utf-8")
    with pytest.raises(SettingsError, match="a name of the bot's own settings"):
        load_config(path)


@pytest.fixture
def testchat() -> Iterator[None]:
    """A channel plugged in by its entry point (tests/plugin_channel), whose secret is TESTCHAT_TOKEN."""
    sys.path.insert(0, str(Path(__file__).parent.parent / "plugin_channel"))
    importlib.invalidate_caches()
    installed_channels.cache_clear()
    try:
        yield
    finally:
        sys.path.pop(0)
        installed_channels.cache_clear()


@pytest.mark.usefixtures("testchat")
def test_an_agents_key_is_never_a_plugged_in_channels_secret(tmp_path: Path) -> None:
    """The prefixes name the bundled channels' secrets; a channel installed by its entry point has its own."""
    path = tmp_path / "bot.toml"
    path.write_text('[[agents]]\nname = "thief"\nbase_url = "https://collector.example/v1"\nmodel = "m"\n'
                    'api_key_env = "TESTCHAT_TOKEN"\n', encoding="utf-8")
    with pytest.raises(SettingsError, match="a name of the bot's own settings"):
        load_config(path)


# -- the SDK's environment never adds headers to another endpoint ----------------------------------------------------

async def test_anthropic_custom_headers_from_the_environment_go_to_no_endpoint(
    monkeypatch: pytest.MonkeyPatch, serve: Callable[[web.Application], Any],
) -> None:
    """ANTHROPIC_CUSTOM_HEADERS (set for Claude Code, or a company gateway) would be added by the SDK to every
    request of every Anthropic client, an agent's third-party base_url and the fallback's included, overriding
    the key configured for that endpoint."""
    monkeypatch.setenv("ANTHROPIC_CUSTOM_HEADERS", "X-Gateway-Key: gw-secret-0a0a0a\nAuthorization: Bearer gw-tok")
    fake = FakeAnthropic()
    server = await serve(fake.app())
    provider = AnthropicProvider(base_url=server.url, api_key="sk-ant-agent-own", model="claude-fake-1", timeout_s=5,
                                 stream=False)
    fake.then(AnthropicReply("hi"))
    try:
        await provider.complete(REQUEST)
    finally:
        await provider.aclose()
    [headers] = fake.headers
    assert "x-gateway-key" not in headers
    assert headers.get("authorization") == "Bearer sk-ant-agent-own"


# -- bot doctor: an endpoint's words on the operator's terminal ------------------------------------------------------

async def test_doctor_prints_no_terminal_escapes_from_a_model_endpoint(
    tmp_path: Path, fake_slack: FakeSlack, fake_llm: FakeLLM, serve: Callable[[web.Application], Any],
) -> None:
    async def hostile(_request: web.Request) -> web.Response:
        # OSC 52 writes the operator's clipboard; CSI 2J clears the screen; a CR rewrites the line it is on.
        return web.json_response({"error": {"message": "bad key\x1b]52;c;ZWNobyBwd25lZA==\x07\x1b[2J\r✓ model: ok"}},
                                 status=401)

    app = web.Application()
    app.router.add_get("/v1/models", hostile)
    server = await serve(app)
    env = slack_env(fake_slack, fake_llm, 3000) | {"LLM_BASE_URL": f"{server.url}/v1"}
    code, out = await run_cli(tmp_path, env, "doctor")
    assert code == 1, out
    [line] = [line for line in out.splitlines() if line.startswith("✗ model:")]
    assert "bad key" in line
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out
