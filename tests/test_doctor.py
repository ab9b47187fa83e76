"""`bot doctor` names each problem of a misconfigured setup, and passes a good one."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from bot.doctor import openai_model_check
from core.plugins import Check
from tests.bot_process import run_cli, slack_env
from tests.fakes.llm import FakeLLM
from tests.fakes.server import RunningServer
from tests.fakes.slack_api import FakeSlack


async def test_a_good_setup_passes(tmp_path: Path, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    env = slack_env(fake_slack, fake_llm, 3000) | {"BOT_SECRET_KEYS": "k1:" + "A" * 43 + "="}
    code, out = await run_cli(tmp_path, env, "doctor")
    assert code == 0, out
    assert "database: sqlite" in out and "✗" not in out  # a new database is fine: `bot run` creates it
    assert "✓ slack: bot bot in team Team; scopes match" in out
    assert "✓ model" in out and "everything looks right" in out


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"SLACK_BOT_TOKEN": "xoxb-this-is-bad"}, "✗ slack: auth.test failed: invalid_auth"),
        ({"LLM_API_KEY": "sk-bad-key"}, "✗ model: The model endpoint rejected the API key"),
        ({"LLM_MODEL": "gpt-unknown"}, "has no model 'gpt-unknown'"),
        ({"LLM_BASE_URL": "http://127.0.0.1:{port}/v1"}, "✗ model: I could not reach the model endpoint"),
        ({"DATABASE_URL": "postgresql://u:p@127.0.0.1:{port}/db"}, "✗ database: postgresql+asyncpg://u:***@"),
        ({"PORT": "abc"}, "✗ settings: invalid settings"),
    ],
)
async def test_each_problem_is_named(tmp_path: Path, fake_slack: FakeSlack, fake_llm: FakeLLM,
                                     change: dict[str, str], expected: str) -> None:
    port = _closed_port()
    env = slack_env(fake_slack, fake_llm, 3000) | {k: v.format(port=port) for k, v in change.items()}
    code, out = await run_cli(tmp_path, env, "doctor")
    assert code == 1 and expected in out, out
    assert "fix:" in out and "Traceback" not in out


async def test_missing_scopes_are_listed(tmp_path: Path, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    fake_slack.scopes = ["chat:write", "app_mentions:read"]
    code, out = await run_cli(tmp_path, slack_env(fake_slack, fake_llm, 3000), "doctor")
    assert code == 1 and "missing scopes: " in out and "reactions:write" in out and "bot manifest" in out
    assert ("tools not offered for want of them: message_read, channel_create, channel_invite, channel_archive, "
            "message_pin") in out


async def test_a_bad_bot_toml_and_the_new_scopes_are_named(tmp_path: Path, fake_slack: FakeSlack,
                                                           fake_llm: FakeLLM) -> None:
    (tmp_path / "bot.toml").write_text('[slack]\nsuggested_prompts = "ask me"\n')
    fake_slack.scopes = [s for s in fake_slack.scopes if s not in ("files:read", "users:read")]
    code, out = await run_cli(tmp_path, slack_env(fake_slack, fake_llm, 3000), "doctor")
    assert code == 1, out
    assert "✗ bot.toml: " in out and "[slack].suggested_prompts must be a list" in out
    [slack] = [line for line in out.splitlines() if line.startswith("✗ slack:")]
    assert "missing scopes: " in slack and "users:read" in slack and "files:read" in slack, out


async def test_connections_are_checked_and_the_callback_to_register_is_named(
    tmp_path: Path, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    entry = ('[[connections]]\nname = "github"\nclient_id = "c"\nclient_secret_env = "GH_SECRET"\n'
             'token_url = "https://github.com/login/oauth/access_token"\n')
    (tmp_path / "bot.toml").write_text(entry + 'authorize_url = "https://github.com/login/oauth/authorize"\n'
                                       'hosts = ["api.github.com"]\n')
    env = slack_env(fake_slack, fake_llm, 3000) | {"BOT_PUBLIC_URL": "https://bot.example.com"}
    code, out = await run_cli(tmp_path, env, "doctor")
    assert "✗ bot.toml" in out and "GH_SECRET (client_secret_env) is not set" in out, out
    code, out = await run_cli(tmp_path, env | {"GH_SECRET": "s3cret-value"}, "doctor")
    assert code == 0, out
    assert "✓ connections: github (user; token to api.github.com); register " \
           "https://bot.example.com/oauth/callback as the redirect URI" in out
    assert "s3cret-value" not in out
    (tmp_path / "bot.toml").write_text(entry)  # no authorize_url: never asks
    code, out = await run_cli(tmp_path, env | {"GH_SECRET": "s3cret-value"}, "doctor")
    assert "! connections: " in out and "no authorize_url: github (calls fail, never ask)" in out
    assert "tokens may go to every name below the token server's domain: github (*.github.com)" in out


async def test_an_allow_rule_that_admits_flags_that_load_files_is_a_warning(
    tmp_path: Path, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    (tmp_path / "bot.toml").write_text('[[policies]]\ntool = "shell_run"\nmatch = "kubectl get *"\naction = "allow"\n')
    env = slack_env(fake_slack, fake_llm, 3000) | {"BOT_SECRET_KEYS": "k1:" + "A" * 43 + "="}
    code, out = await run_cli(tmp_path, env, "doctor")
    assert code == 0, out  # a warning: the rule may be meant
    [line] = [line for line in out.splitlines() if line.startswith("! approval rules:")]
    assert "rule 1 (allow 'shell_run' matching 'kubectl get *')" in line and "--kubeconfig" in line, out


async def test_event_sources_are_checked_and_the_url_to_configure_is_named(
    tmp_path: Path, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    (tmp_path / "bot.toml").write_text(
        '[[event_sources]]\nname = "ci"\nkind = "github"\nsecret_env = "CI_SECRET"\ndestination = "#ops"\n'
        '[[event_sources]]\nname = "alerts"\nkind = "bearer"\nsecret_env = "AM_TOKEN"\ndestination = "#nowhere"\n'
        '[[event_sources]]\nname = "deploys"\nkind = "standard"\nsecret_env = "SW_KEY"\ndestination = "#ops"\n')
    env = slack_env(fake_slack, fake_llm, 3000) | {"BOT_PUBLIC_URL": "https://bot.example.com"}
    code, out = await run_cli(tmp_path, env, "doctor")
    assert code == 1, out
    assert "✗ event source ci: CI_SECRET is not set" in out
    assert "✗ event source deploys: SW_KEY is not set" in out

    env |= {"CI_SECRET": "too-short", "AM_TOKEN": "a-long-enough-bearer-token", "SW_KEY": "whsec_%%%"}
    code, out = await run_cli(tmp_path, env, "doctor")
    assert "✗ event source ci: CI_SECRET: a GitHub webhook secret must have at least 16 characters" in out
    assert "✗ event source alerts: destination #nowhere:" in out
    assert "✗ event source deploys: SW_KEY: the Standard Webhooks key is" in out

    # Read as `bot run` reads them: the environment, else .env.
    (tmp_path / ".env").write_text("CI_SECRET=a-github-secret-of-32-characters\n")
    env = {k: v for k, v in env.items() if k != "CI_SECRET"} | {"SW_KEY": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}
    code, out = await run_cli(tmp_path, env, "doctor")
    assert "✓ event source ci: github, answers in #ops (COPS) at trust external; configure the sender with " \
           "POST https://bot.example.com/events/ci" in out, out
    assert "✓ event source deploys: standard" in out


# -- the OpenAI-compatible model check: GET {base}/models over the provider's own client ---------------------------

def answering(response: web.StreamResponse) -> Any:
    async def handler(_request: web.Request) -> web.StreamResponse:
        return response

    return handler


async def _model_check_against(handler: Any, *, timeout_s: float = 5,
                               released: asyncio.Event | None = None) -> tuple[Check, str]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    server = await RunningServer(app).start()
    try:
        return await openai_model_check(f"{server.url}/v1", "sk-key", "fake-model", timeout_s=timeout_s), server.url
    finally:
        if released is not None:
            released.set()  # a held handler ends, so the server stops at once
        await server.stop()


async def test_an_endpoint_without_a_model_list_is_a_warning() -> None:
    check, url = await _model_check_against(answering(web.json_response({"error": "no"}, status=404)))
    assert (check.ok, check.warning, check.detail) == (True, True, f"{url}/v1 answers (it lists no models)")


@pytest.mark.parametrize("body", ["<html>a login page</html>", '{"data": "none"}', "[" * 100_000])
async def test_an_answer_that_is_not_a_model_list_fails_the_check(body: str) -> None:
    check, _ = await _model_check_against(answering(web.Response(text=body)))
    assert not check.ok and "unexpected response from the endpoint" in check.detail


async def test_the_listed_ids_are_printed_without_control_characters() -> None:
    listing = {"data": [{"id": "gpt-\x1b]52;c;evil\x07x"}, {"id": 7}, {"name": "no id"}]}
    check, _ = await _model_check_against(answering(web.json_response(listing)))
    assert not check.ok and "(it has gpt-]52;c;evilx)" in check.detail and "\x1b" not in check.detail


async def test_a_redirect_is_not_followed_and_the_key_goes_nowhere_else() -> None:
    elsewhere: list[str] = []

    async def catch(request: web.Request) -> web.Response:
        elsewhere.append(request.headers.get("Authorization", ""))
        return web.json_response({"data": [{"id": "fake-model"}]})

    other = web.Application()
    other.router.add_get("/{tail:.*}", catch)
    server = await RunningServer(other).start()
    try:
        redirect = web.Response(status=302, headers={"Location": f"{server.url}/v1/models"})
        check, _ = await _model_check_against(answering(redirect))
    finally:
        await server.stop()
    assert not check.ok and elsewhere == []


async def test_a_silent_endpoint_fails_within_the_timeout() -> None:
    released = asyncio.Event()

    async def silent(_request: web.Request) -> web.Response:
        await released.wait()  # past the deadline below
        return web.Response()

    check, _ = await _model_check_against(silent, timeout_s=0.2, released=released)
    assert not check.ok and "I could not reach the model endpoint" in check.detail


async def test_the_check_goes_through_the_environment_s_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, str]] = []

    async def proxy(request: web.Request) -> web.Response:
        seen.append((str(request.url), request.headers.get("Authorization", "")))  # a forward proxy: absolute URL
        return web.json_response({"object": "list", "data": [{"id": "fake-model"}]})

    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy", "ALL_PROXY",
                 "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", proxy)
    server = await RunningServer(app).start()
    monkeypatch.setenv("HTTP_PROXY", server.url)
    try:
        check = await openai_model_check("http://models.example/v1", "sk-key", "fake-model", timeout_s=5)
    finally:
        await server.stop()
    assert check.ok and check.detail == "http://models.example/v1 reachable, model 'fake-model'"
    assert seen == [("http://models.example/v1/models", "Bearer sk-key")]
