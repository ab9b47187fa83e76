"""MCP servers end to end: a real server built with the SDK (tests/fakes/mcp_server.py), over stdio and
streamable HTTP; its tools listed at start, called, gated, timed out, restarted after a crash; the
OAuth-challenge classifier; doctor's words."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from bot.config.file import load_mcp_servers
from bot.errors import ServerFailed, SettingsError
from bot.mcp import servers as mcp_servers
from bot.mcp import stderr as mcp_stderr
from bot.mcp.challenge import Diagnosis, diagnose
from bot.mcp.manager import McpServers
from bot.mcp.servers import HttpServer
from bot.mcp.spec import McpServerSpec
from bot.sandbox import Unsandboxed
from bot.settings import Settings
from core.errors import ToolError
from core.tools import ToolRegistry
from tests.bot_process import run_cli, slack_env
from tests.conftest import GatewayClient, connections_toml, sandbox_mode
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.oauth import FakeOAuth
from tests.fakes.server import RunningServer
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import block_action, mention, message
from tests.test_connections import consent, personal_link

FAKE = Path(__file__).resolve().parent / "fakes" / "mcp_server.py"


def stdio_entry(name: str = "fake", *, extra: str = "", sandbox: bool = False) -> str:
    command = json.dumps([sys.executable, str(FAKE)])
    return (f'[[mcp_servers]]\nname = "{name}"\ncommand = {command}\nsandbox = {str(sandbox).lower()}\n'
            f'timeout_s = 10\n{extra}\n')


@pytest.fixture
def mcp_settings(make_settings: Callable[..., Settings], tmp_path: Path) -> Callable[..., Settings]:
    def make(toml: str, **overrides: Any) -> Settings:
        config = tmp_path / "bot.toml"
        config.write_text(toml, encoding="utf-8")
        return make_settings(bot_config=config, **overrides)

    return make


def tool_names(request: dict[str, Any]) -> list[str]:
    return [t["function"]["name"] for t in request.get("tools", [])]


def tool_result(fake_llm: FakeLLM) -> str:
    return str([m["content"] for m in fake_llm.requests[-1]["messages"] if m["role"] == "tool"][-1])


async def approve(gateway: GatewayClient, fake_slack: FakeSlack, posts: int) -> dict[str, Any]:
    card = (await fake_slack.wait_for("chat.postMessage", posts))[posts - 1]
    button = card.params["blocks"][-1]["elements"][0]
    assert button["action_id"] == "approval:approve", card.params["text"]
    await gateway.interact(block_action("approval:approve", str(button["value"])))
    return dict(card.params)


async def test_stdio_tools_are_listed_called_and_gated(
    mcp_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
) -> None:
    gateway: GatewayClient = await start_gateway(mcp_settings(stdio_entry(extra='tools = ["echo", "add", "fail"]')))
    fake_llm.then(Reply(tool_calls=[("fake__add", {"a": 2, "b": 3})]), Reply("five"))
    await gateway.send_event(mention("add them"))
    card = await approve(gateway, fake_slack, 1)  # gated by default: a person approves, seeing every argument
    shown = json.dumps(card["blocks"])
    assert "fake__add" in shown and "a: 2" in shown and "b: 3" in shown
    assert (await fake_slack.wait_for("chat.postMessage", 2))[1].params["text"] == "five"
    first = fake_llm.requests[0]
    names = tool_names(first)
    assert {"fake__echo", "fake__add", "fake__fail"} <= set(names) and "fake__crash" not in names  # the globs
    add = next(t for t in first["tools"] if t["function"]["name"] == "fake__add")["function"]
    assert add["parameters"]["properties"]["a"]["type"] == "integer" and "[MCP server fake]" in add["description"]
    assert tool_result(fake_llm) == "5"

    fake_llm.then(Reply(tool_calls=[("fake__fail", {"message": "the disk is full"})]), Reply("it failed"))
    await gateway.send_event(mention("fail please"))
    await approve(gateway, fake_slack, 3)
    await fake_slack.wait_for("chat.postMessage", 4)
    assert "error: fake__fail:" in tool_result(fake_llm) and "the disk is full" in tool_result(fake_llm)
    audit = await gateway.app.approvals.audit_entries(__import__("datetime").datetime(2000, 1, 1,
                                                      tzinfo=__import__("datetime").UTC))
    assert [e.action for e in audit if e.action.startswith("mcp.")] == ["mcp.call", "mcp.call"]


async def test_a_crashed_server_is_restarted_and_a_slow_call_times_out(
    mcp_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
) -> None:
    toml = stdio_entry(extra='risk = "safe"').replace("timeout_s = 10", "timeout_s = 1")
    gateway: GatewayClient = await start_gateway(mcp_settings(toml))
    assert gateway.app.mcp is not None
    server = gateway.app.mcp.servers["fake"]
    fake_llm.then(Reply(tool_calls=[("fake__crash", {})]), Reply("it crashed"))
    await gateway.send_event(mention("crash it"))
    await fake_slack.wait_for("chat.postMessage")
    assert "fake failed while answering" in tool_result(fake_llm)
    async with asyncio.timeout(15):
        while server.client is None or server.starts < 2:  # type: ignore[attr-defined]
            await asyncio.sleep(0.05)
    fake_llm.then(Reply(tool_calls=[("fake__echo", {"text": "back again"})]), Reply("ok"))
    await gateway.send_event(mention("echo"))
    await fake_slack.wait_for("chat.postMessage", 2)
    assert tool_result(fake_llm) == "back again"

    fake_llm.then(Reply(tool_calls=[("fake__slow", {"seconds": 30})]), Reply("too slow"))
    await gateway.send_event(mention("slow"))
    await fake_slack.wait_for("chat.postMessage", 3, timeout=20)
    assert "timed out" in tool_result(fake_llm) or "failed while answering" in tool_result(fake_llm)


async def test_a_stdio_server_gets_only_the_credentials_its_entry_names(
    mcp_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BOT_OWN_SECRET_FOR_TEST", "the-bot-s-own-environment")
    settings = mcp_settings(stdio_entry(extra='risk = "safe"\nenv = ["acc.token"]'))
    # The credential is stored before the start (the process gets it when it starts).
    from bot.app import build_application
    app = build_application(settings)
    await app.db.migrate()
    await app.credentials.set_secret("acc.token", "s3cr3t-for-the-server", scope="agent", agent="default", by="U1")
    await app.db.close()
    gateway: GatewayClient = await start_gateway(settings)
    fake_llm.then(Reply(tool_calls=[("fake__env", {"name": "ACC_TOKEN"}), ("fake__env",
                                                                           {"name": "BOT_OWN_SECRET_FOR_TEST"})]),
                  Reply("ok"))
    await gateway.send_event(mention("what were you given?"))
    await fake_slack.wait_for("chat.postMessage")
    results = [m["content"] for m in fake_llm.requests[-1]["messages"] if m["role"] == "tool"]
    assert results == ["ACC_TOKEN=[redacted:acc.token]", "BOT_OWN_SECRET_FOR_TEST is not set"]


async def test_a_server_that_cannot_start_does_not_stop_the_bot(
    mcp_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
) -> None:
    toml = ('[[mcp_servers]]\nname = "ghost"\ncommand = ["/nonexistent/mcp-server"]\nsandbox = false\n'
            'timeout_s = 2\n' + stdio_entry(extra='risk = "safe"'))
    gateway: GatewayClient = await start_gateway(mcp_settings(toml))
    fake_llm.then(Reply("fine"))
    await gateway.send_event(mention("hello"))
    assert (await fake_slack.wait_for("chat.postMessage"))[0].params["text"] == "fine"
    names = tool_names(fake_llm.requests[0])
    assert "fake__echo" in names and not any(n.startswith("ghost__") for n in names)
    assert gateway.app.mcp is not None
    report = dict((name, (ok, text)) for name, ok, text in gateway.app.mcp.report())
    assert report["ghost"][0] is False and report["fake"][0] is True


async def test_a_policy_rule_matches_server_globs(
    mcp_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
) -> None:
    toml = stdio_entry() + '[[policies]]\ntool = "fake__*"\naction = "deny"\n'
    gateway: GatewayClient = await start_gateway(mcp_settings(toml))
    fake_llm.then(Reply(tool_calls=[("fake__echo", {"text": "hi"})]), Reply("refused"))
    await gateway.send_event(mention("echo"))
    await fake_slack.wait_for("chat.postMessage")
    assert "the approval policy refuses `fake__echo`" in tool_result(fake_llm)


# -- streamable HTTP ------------------------------------------------------------------------------------


async def _http_server(tmp_path: Path, token: str | None) -> AsyncIterator[tuple[str, Path]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    log = tmp_path / "mcp-auth.log"
    env = os.environ | {"FAKE_MCP_LOG": str(log), "FAKE_MCP_CHALLENGE": 'Bearer error="invalid_token"'}
    if token is not None:
        env["FAKE_MCP_TOKEN"] = token
    proc = await asyncio.create_subprocess_exec(sys.executable, str(FAKE), "http", str(port), env=env)
    try:
        async with asyncio.timeout(20):
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    await asyncio.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp", log
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 10)


@pytest.fixture
async def http_server(tmp_path: Path) -> AsyncIterator[tuple[str, Path]]:
    """An HTTP MCP server that takes only the bearer token mcp-bearer-123456."""
    async for running in _http_server(tmp_path, "mcp-bearer-123456"):
        yield running


@pytest.fixture
async def open_http_server(tmp_path: Path) -> AsyncIterator[tuple[str, Path]]:
    """An HTTP MCP server that takes any request, and logs the Authorization header of each."""
    async for running in _http_server(tmp_path, None):
        yield running


async def test_an_http_server_gets_its_bearer_token_per_call_and_the_audit_says_which(
    mcp_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    http_server: tuple[str, Path], tmp_path: Path,
) -> None:
    url, log = http_server
    settings = mcp_settings(f'[[mcp_servers]]\nname = "remote"\nurl = "{url}"\ncredential = "remote.token"\n'
                            'risk = "safe"\n')
    from bot.app import build_application
    app = build_application(settings)
    await app.db.migrate()
    await app.credentials.set_secret("remote.token", "mcp-bearer-123456", scope="agent", agent="default", by="U1")
    await app.db.close()
    gateway: GatewayClient = await start_gateway(settings)
    fake_llm.then(Reply(tool_calls=[("remote__add", {"a": 20, "b": 22})]), Reply("42"))
    await gateway.send_event(mention("add remotely"))
    await fake_slack.wait_for("chat.postMessage")
    assert tool_result(fake_llm) == "42"
    assert "Bearer mcp-bearer-123456" in log.read_text()
    assert "mcp-bearer-123456" not in json.dumps(fake_llm.requests)
    audit = await gateway.app.approvals.audit_entries(__import__("datetime").datetime(2000, 1, 1,
                                                      tzinfo=__import__("datetime").UTC))
    call = next(e for e in audit if e.action == "mcp.call")
    assert json.loads(call.detail or "{}")["credential"] == "remote.token" and call.subject == "tool:remote__add"


async def test_an_http_server_refusing_the_token_is_reported_as_such(http_server: tuple[str, Path]) -> None:
    url, _log = http_server
    server = HttpServer(McpServerSpec(name="remote", url=url, timeout_s=10))
    await server.start(10)
    assert server.tools is None and server.problem is not None
    assert server.problem.kind == "invalid_token" and "refused the token" in server.problem.message
    with pytest.raises(ServerFailed):
        await server.call("echo", {"text": "x"}, {"Authorization": "Bearer wrong"})


@pytest.mark.parametrize(("status", "challenge", "kind", "words"), [
    (401, 'Bearer realm="OAuth", resource_metadata="https://mcp.example.com/.well-known/oauth-protected-resource"',
     "oauth", "locked: needs OAuth authorization (resource metadata at https://mcp.example.com/.well-known/"
              "oauth-protected-resource); add a connection"),
    (401, 'Bearer resource_metadata="https://m.example/x"', "oauth", "resource metadata at https://m.example/x"),
    (401, 'Bearer error="invalid_token"', "invalid_token", "refused the token"),
    (401, 'Basic realm="oauth"', "basic", "Basic authentication"),
    # Quoted strings are text (RFC 7235): no challenge or parameter hides in one.
    (401, 'Basic realm="x, Bearer resource_metadata=evil"', "basic", "Basic authentication"),
    (401, 'Bearer error_description="bad, Basic realm=x", resource_metadata="https://a.example/m"', "oauth",
     "resource metadata at https://a.example/m"),
    # A refused token, as spec-following servers say it (with resource_metadata too): not "add a connection".
    (401, 'Bearer error="invalid_token", resource_metadata="https://a.example/.well-known/x"', "invalid_token",
     "refused the token"),
    (500, "", "server_error", "HTTP 500"),
])
async def test_the_oauth_challenge_classifier_against_a_real_endpoint(status: int, challenge: str, kind: str,
                                                                      words: str) -> None:
    async def answer(_request: web.Request) -> web.Response:
        return web.Response(status=status, headers={"WWW-Authenticate": challenge} if challenge else {})

    app = web.Application()
    app.router.add_route("*", "/mcp", answer)
    running = await RunningServer(app).start()
    try:
        server = HttpServer(McpServerSpec(name="locked", url=f"{running.url}/mcp", timeout_s=5))
        await server.start(5)
        assert server.tools is None and server.problem is not None
        assert server.problem.kind == kind and words in server.problem.message, server.problem
    finally:
        await running.stop()


async def test_a_refused_connection_is_reported_as_unreachable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = HttpServer(McpServerSpec(name="gone", url=f"http://127.0.0.1:{port}/mcp", timeout_s=5))
    await server.start(5)
    assert server.problem is not None and server.problem.kind == "unreachable"
    assert diagnose(401, 'Bearer error="invalid_token"').kind != "oauth"


async def test_doctor_names_each_server_and_the_fix(tmp_path: Path, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    async def locked(_request: web.Request) -> web.Response:
        return web.Response(status=401, headers={"WWW-Authenticate": 'Bearer realm="OAuth", resource_metadata='
                                                                     '"https://auth.example.com/.well-known/x"'})

    app = web.Application()
    app.router.add_route("*", "/mcp", locked)
    running = await RunningServer(app).start()
    try:
        locked_entry = f'[[mcp_servers]]\nname = "notion"\nurl = "{running.url}/mcp"\n'
        boxed = stdio_entry("boxed", sandbox=True)  # SHELL_SANDBOX=none runs it on the host: doctor says so
        (tmp_path / "bot.toml").write_text(stdio_entry() + locked_entry + boxed, encoding="utf-8")
        env = slack_env(fake_slack, fake_llm, 3000) | {"SHELL_SANDBOX": "none"}
        code, out = await run_cli(tmp_path, env, "doctor")
    finally:
        await running.stop()
    assert code == 1, out
    assert "✓ mcp fake: stdio, 6 tool(s): echo, add, slow, fail, crash, env\n" in out
    assert ("! mcp boxed: stdio, 6 tool(s): echo, add, slow, fail, crash, env; runs UNSANDBOXED "
            "(SHELL_SANDBOX=none)") in out
    assert "fix: install bubblewrap (SHELL_SANDBOX=bwrap), or set sandbox = false" in out
    assert ("✗ mcp notion: locked: needs OAuth authorization (resource metadata at "
            "https://auth.example.com/.well-known/x); add a connection") in out
    assert "fix: add a [[connections]] entry" in out


async def test_a_stdio_server_runs_in_the_shell_sandbox_unless_its_entry_says_not(
    mcp_settings: Callable[..., Settings], start_gateway: Any, tmp_path: Path,
) -> None:
    if sandbox_mode() != "bwrap":
        pytest.skip("bubblewrap does not work here")
    toml = stdio_entry("boxed", sandbox=True) + stdio_entry("open", sandbox=False)
    gateway: GatewayClient = await start_gateway(mcp_settings(toml))
    assert gateway.app.mcp is not None
    report = {name: ok for name, ok, _text in gateway.app.mcp.report()}
    # Inside the sandbox only the system and its own folder exist: the bot's checkout (its virtualenv, keys,
    # database and settings) is not there, so this server's interpreter is not found; it is retried.
    assert report == {"boxed": False, "open": True}
    log = (tmp_path / "home" / "mcp" / "boxed.stderr.log").read_text()
    assert f"bwrap: execvp {sys.executable}: No such file or directory" in log, log


async def test_an_http_server_behind_a_connection_pauses_for_consent_then_gets_the_token(
    make_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    oauth: FakeOAuth, open_http_server: tuple[str, Path], tmp_path: Path,
) -> None:
    url, log = open_http_server
    config = tmp_path / "bot.toml"
    config.write_text(connections_toml(oauth) + f'\n[[mcp_servers]]\nname = "gh"\nurl = "{url}"\n'
                      'connection = "github"\n', encoding="utf-8")
    gateway: GatewayClient = await start_gateway(make_settings(bot_config=config, http_allow_hosts="127.0.0.1"))
    fake_llm.then(Reply(tool_calls=[("gh__echo", {"text": "as me"})]))
    await gateway.send_event(mention("echo as me"))
    await approve(gateway, fake_slack, 1)
    asked = (await fake_slack.wait_for("chat.postMessage", 2))[1]
    assert asked.params["text"] == "Connect github to continue"
    fake_llm.then(Reply("done"))
    status, page, _ = await consent(await personal_link(fake_slack))
    assert status == 200, page
    assert (await fake_slack.wait_for("chat.postMessage", 3))[2].params["text"] == "done"
    await gateway.idle()
    assert tool_result(fake_llm) == "as me"
    token = oauth.valid_access_tokens()[0]
    assert f"Bearer {token}" in log.read_text().splitlines()  # the call carried the connected account's token
    assert token not in json.dumps(fake_llm.requests)
    audit = await gateway.app.approvals.audit_entries(__import__("datetime").datetime(2000, 1, 1,
                                                      tzinfo=__import__("datetime").UTC))
    call = next(e for e in audit if e.action == "mcp.call")
    assert json.loads(call.detail or "{}")["connection"] == "github"


async def test_a_guest_cannot_start_a_connection_through_a_safe_server(
    make_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    oauth: FakeOAuth, open_http_server: tuple[str, Path], tmp_path: Path,
) -> None:
    # risk = "safe": no approval stands between a guest's words and the consent request (review point 8).
    url, log = open_http_server
    config = tmp_path / "bot.toml"
    config.write_text(connections_toml(oauth) + f'\n[[mcp_servers]]\nname = "gh"\nurl = "{url}"\n'
                      'connection = "github"\nrisk = "safe"\n', encoding="utf-8")
    fake_slack.people["UGUEST"] = {"is_restricted": True}
    gateway: GatewayClient = await start_gateway(make_settings(bot_config=config, http_allow_hosts="127.0.0.1"))
    fake_llm.then(Reply(tool_calls=[("gh__echo", {"text": "as me"})]), Reply("could not"))
    await gateway.send_event(message("echo as me", channel="D1", channel_type="im", user="UGUEST"))
    await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()
    assert [p.params["text"] for p in fake_slack.posts()] == ["could not"]  # no Connect message, no link
    assert fake_slack.of("chat.postEphemeral") == []
    assert "asking people to connect github is" in tool_result(fake_llm) and "(guest)" in tool_result(fake_llm)
    assert "Bearer" not in (log.read_text() if log.exists() else "")
    async with gateway.app.db.read() as s:
        from sqlmodel import select

        from core.store.connection_tables import ConnectionRequestRow
        assert list((await s.exec(select(ConnectionRequestRow))).all()) == []


# -- what a server lists, and how it runs ----------------------------------------------------------------


def mode_spec(mode: str, name: str = "fake", **fields: Any) -> McpServerSpec:
    return McpServerSpec(name=name, command=(sys.executable, str(FAKE), "stdio", mode), timeout_s=10,
                         sandbox=False, **fields)


async def nothing(*_args: Any) -> None:
    return None


async def started(tmp_path: Path, *specs: McpServerSpec, sandbox: Any = None) -> tuple[McpServers, ToolRegistry]:
    servers = McpServers(list(specs), home=tmp_path / "home", sandbox=sandbox, audit=nothing)
    registry = ToolRegistry()
    await servers.start(registry, timeout_s=20)
    return servers, registry


async def test_a_listing_is_cleaned_capped_and_lookalike_names_left_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="bot.mcp")
    servers, registry = await started(tmp_path, mode_spec("poison"))
    try:
        names = registry.names()
        assert "fake__echo" in names and "fake__sneaky" in names
        assert "fake___hidden" not in names and "fake__big" not in names  # a leading "_"; a 20 KB schema
        sneaky = registry.get("fake__sneaky")
        assert sneaky is not None
        assert sneaky.description == "[MCP server fake] Say hi hidden"  # zero-width, tags, bidi: gone
        assert sneaky.parameters["properties"]["q"] == {"type": "string", "description": "abc", "enum": ["xy", "z"]}
        logged = caplog.text
        assert "tool '_hidden' left out: its name begins with '_'" in logged
        assert "tool 'big' left out: its input schema is too big" in logged
        # The report (what `bot doctor` prints) names the registered tools only, and nothing raw.
        [(_name, ok, text)] = servers.report()
        assert ok and "\x1b" not in text and "evil" not in text and "_hidden" not in text and "big" not in text
        assert text.startswith("stdio, 7 tool(s) (of 10 listed): echo, add, slow, fail, crash, env, sneaky")
        servers.servers["fake"].tools = None
        servers.servers["fake"].problem = Diagnosis("unreachable", "stopped: \x1b]0;pwned\x07 \x1b[2J")
        [(_name, ok, text)] = servers.report()
        assert not ok and "\x1b" not in text and "\x07" not in text and "⟦U+001B⟧" in text
    finally:
        await servers.stop()


async def test_a_schema_that_refers_outside_itself_is_left_out_and_nothing_is_fetched(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="bot.mcp")
    servers, registry = await started(tmp_path, mode_spec("refs"))
    try:
        names = registry.names()
        assert {"fake__remote", "fake__disk", "fake__dynamic"}.isdisjoint(names)
        for tool, ref in (("remote", "$ref 'http://169.254.169.254/latest/meta-data'"),
                          ("disk", "$ref 'file:///etc/passwd'"), ("dynamic", "$dynamicRef 'https://example.com/s#meta'")):
            assert (f"tool '{tool}' left out: its input schema cannot be checked safely: it refers outside itself "
                    f"({ref})") in caplog.text
        local, redos = registry.get("fake__local"), registry.get("fake__redos")
        assert local is not None and redos is not None
        assert local.parse_arguments({"q": "short"}) == {"q": "short"}
        with pytest.raises(ToolError, match="is too long"):
            local.parse_arguments({"q": "too long"})
        with pytest.raises(ToolError, match="took too long"):  # the server's pattern cannot freeze the bot
            redos.parse_arguments({"q": "a" * 40 + "b"})
    finally:
        await servers.stop()


async def test_every_page_is_listed_up_to_a_hundred_tools(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="bot.mcp")
    servers, registry = await started(tmp_path, mode_spec("many"))
    try:
        names = [n for n in registry.names() if n.startswith("fake__")]
        assert len(names) == 100  # 156 listed on 4 pages: the first 100 (the 6 own, t000…t093: page 3)
        assert "fake__t093" in names and "fake__t094" not in names
        assert "lists more than 100 tools" in caplog.text
    finally:
        await servers.stop()


async def test_the_heartbeat_reaches_the_server_whatever_it_says_about_caching(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(mcp_servers, "PING_S", 0.1)
    servers, _registry = await started(tmp_path, mode_spec("ttl"))
    try:
        listings = tmp_path / "home" / "mcp" / "fake" / "listings.log"
        async with asyncio.timeout(10):  # ttlMs of a day must not turn the heartbeat into a cache hit
            while not listings.exists() or len(listings.read_text().splitlines()) < 4:
                await asyncio.sleep(0.05)
    finally:
        await servers.stop()


async def test_the_stderr_log_is_rotated_at_start_and_capped_while_the_server_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    log = tmp_path / "home" / "mcp" / "fake.stderr.log"
    log.parent.mkdir(parents=True)
    log.write_bytes(b"old\n" * 400_000)  # 1.6 MB from earlier runs
    servers, _registry = await started(tmp_path, mode_spec("noisy"))
    try:
        assert (log.parent / "fake.stderr.log.1").read_bytes().startswith(b"old\n")  # rotated: one copy kept
        async with asyncio.timeout(10):
            while b"END" not in log.read_bytes():
                await asyncio.sleep(0.05)
        assert log.stat().st_size < 100_000
    finally:
        await servers.stop()
    monkeypatch.setattr(mcp_stderr, "LOG_MAX", 20_000)  # while it runs: 50 KB of noise, never more than 2 files
    servers, _registry = await started(tmp_path, mode_spec("noisy"))
    try:
        async with asyncio.timeout(10):
            while b"END" not in log.read_bytes():
                await asyncio.sleep(0.05)
        assert log.stat().st_size <= 20_000 and (log.parent / "fake.stderr.log.1").stat().st_size <= 20_000
        assert sorted(p.name for p in log.parent.glob("fake.stderr.log*")) == ["fake.stderr.log",
                                                                                "fake.stderr.log.1"]
    finally:
        await servers.stop()


async def test_a_server_meant_for_the_sandbox_run_without_one_is_said_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="bot.mcp")
    boxed = McpServerSpec(name="boxed", command=(sys.executable, str(FAKE)), timeout_s=10, sandbox=True)
    servers, _registry = await started(tmp_path, boxed, mode_spec("", name="open"), sandbox=Unsandboxed())
    try:
        report = {name: (ok, text) for name, ok, text in servers.report()}
        assert report["boxed"][0] and "runs UNSANDBOXED (SHELL_SANDBOX=none)" in report["boxed"][1]
        assert "UNSANDBOXED" not in report["open"][1]  # sandbox = false: the operator said so
        assert "MCP server boxed runs UNSANDBOXED" in caplog.text and "server open runs" not in caplog.text
    finally:
        await servers.stop()


@pytest.mark.parametrize(("entry", "words"), [
    ('name = "gh_"\nurl = "https://a.example/mcp"', "must not end with '_' or '-'"),
    ('name = "gh-"\ncommand = ["x"]', "must not end with '_' or '-'"),
    ('name = "gh"\nurl = "http://mcp.example.com/mcp"\ncredential = "gh.token"', "use https://"),
    ('name = "gh"\nurl = "http://10.0.0.5/mcp"\nconnection = "github"', "use https://"),
    ('name = "gh"\ncommand = ["x"]\nenv = ["path"]', "would become PATH"),
    ('name = "gh"\ncommand = ["x"]\nenv = ["ld.preload"]', "would become LD_PRELOAD"),
    ('name = "gh"\ncommand = ["x"]\nenv = ["bot-shell.run"]', "would become BOT_SHELL_RUN"),
    ('name = "gh"\ncommand = ["x"]\nenv = ["home"]', "would become HOME"),
])
def test_config_refuses_lookalike_names_cleartext_tokens_and_reserved_variables(tmp_path: Path, entry: str,
                                                                                  words: str) -> None:
    config = tmp_path / "bot.toml"
    config.write_text(f"[[mcp_servers]]\n{entry}\n", encoding="utf-8")
    with pytest.raises(SettingsError, match=words.replace("(", r"\(")):
        load_mcp_servers(config)


def test_config_accepts_http_to_loopback_and_plain_http_without_a_token(tmp_path: Path) -> None:
    config = tmp_path / "bot.toml"
    config.write_text('[[mcp_servers]]\nname = "a"\nurl = "http://127.0.0.1:8080/mcp"\ncredential = "a.t"\n'
                      '[[mcp_servers]]\nname = "b"\nurl = "http://localhost/mcp"\nconnection = "c"\n'
                      '[[mcp_servers]]\nname = "c"\nurl = "http://[::1]/mcp"\ncredential = "c.t"\n'
                      '[[mcp_servers]]\nname = "d"\nurl = "http://mcp.example.com/mcp"\n'
                      '[[mcp_servers]]\nname = "e"\ncommand = ["x"]\nenv = ["github.token"]\n', encoding="utf-8")
    assert [s.name for s in load_mcp_servers(config)] == ["a", "b", "c", "d", "e"]
