"""Connections from the web chat, the operator's command line, and bot.toml's checks."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bot.config.file import load_connections
from bot.errors import SettingsError
from bot.settings import Settings
from tests.bot_process import BotProcess, post_form, send_event, slack_env
from tests.conftest import CLIENT_SECRET_ENV, GatewayClient, connections_toml
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.oauth import FakeOAuth
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import block_action, mention
from tests.test_cli import bot
from tests.test_connections import browser, call, connect_first, consent, personal_link, resource_calls

CID = "0123456789abcdef0123456789abcdef"


@pytest.fixture(autouse=True)
def _process_database(database_url: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """With TEST_DATABASE_URL, the CLI runs against this test's fresh PostgreSQL database."""
    if database_url:
        monkeypatch.setenv("BOT_PROCESS_DATABASE_URL", database_url)
JSON = {"Content-Type": "application/json"}


async def _conversation(gateway: GatewayClient, until: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    async with asyncio.timeout(10):
        while True:
            async with gateway.http.get(f"{gateway.base}/api/conversations/{CID}") as resp:
                conv: dict[str, Any] = await resp.json()
            if until(conv):
                return conv
            await asyncio.sleep(0.02)


async def test_web_chat_flow_connects_and_lists(
    connected_settings: Callable[..., Settings], start_gateway: Any, fake_llm: FakeLLM, oauth: FakeOAuth,
) -> None:
    gateway: GatewayClient = await start_gateway(connected_settings())
    fake_llm.then(call(oauth))
    async with gateway.http.post(f"{gateway.base}/api/conversations/{CID}/messages", headers=JSON,
                                 data=json.dumps({"text": "who am I on github?"})) as resp:
        assert resp.status in (200, 202)
    conv = await _conversation(gateway, lambda c: bool(c["approvals"]))
    async with gateway.http.post(f"{gateway.base}/api/approvals/{conv['approvals'][0]['id']}", headers=JSON,
                                 data=json.dumps({"verdict": "approve"})) as resp:
        assert resp.status == 200
    conv = await _conversation(gateway, lambda c: bool(c["connections"]))
    parked = conv["connections"][0]
    assert parked["ask"] == "Connect github to continue" and parked["status"] == "pending"
    fake_llm.then(Reply("You are octocat."))
    async with browser() as b:
        async with b.get(f"{gateway.base}{parked['connect']}", allow_redirects=False) as minted:
            assert minted.status == 302  # the web user's own link, minted now
            link = minted.headers["Location"]
        status, page, _ = await consent(link, b)
        assert status == 200 and "Connected, you can close this tab" in page
    await _conversation(gateway, lambda c: any(m["content"] == "You are octocat." for m in c["messages"]))
    await gateway.idle()
    assert len(resource_calls(oauth)) == 1
    async with gateway.http.get(f"{gateway.base}/api/connections") as resp:
        listed = await resp.json()
    assert [(c["name"], c["shared"], c["scopes"]) for c in listed["connections"]] == [("github", False, ["repo"])]
    assert all(t not in json.dumps(listed) for t in oauth.all_tokens())
    # The link was personal and single-use: a second opening mints nothing for a settled request.
    async with browser() as b, b.get(f"{gateway.base}{parked['connect']}", allow_redirects=False) as again:
        assert again.status == 404
    async with gateway.http.post(f"{gateway.base}/api/connections/github/disconnect", headers=JSON,
                                 data="{}") as resp:
        assert resp.status == 200 and "revoked" in (await resp.json())["message"]


async def test_cli_lists_without_tokens_and_disconnect_needs_force_when_revocation_fails(
    connected_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    oauth: FakeOAuth, tmp_path: Path,
) -> None:
    settings = connected_settings()
    gateway: GatewayClient = await start_gateway(settings)
    await connect_first(gateway, fake_slack, fake_llm, oauth)
    env = {"BOT_HOME": str(settings.bot_home), "BOT_CONFIG": str(settings.bot_config),
           CLIENT_SECRET_ENV: oauth.client_secret}
    code, out, err = await bot(tmp_path, "connections", "list", env=env)
    assert code == 0, err
    assert "github\tU1\t" in out and "repo" in out
    assert all(t not in out + err for t in oauth.all_tokens()) and oauth.client_secret not in out + err

    code, out, err = await bot(tmp_path, "connections", "disconnect", "github", env=env)
    assert code != 0 and "--user" in err
    oauth.revoke_status = 503
    code, out, err = await bot(tmp_path, "connections", "disconnect", "github", "--user", "U1", env=env)
    assert code != 0 and "nothing was deleted" in err and "--force" in err
    code, out, err = await bot(tmp_path, "connections", "disconnect", "github", "--user", "U1", "--force", env=env)
    assert code == 0 and "deleted here (forced)" in out, err
    code, out, err = await bot(tmp_path, "connections", "list", env=env)
    assert "no connected accounts" in out and "configured, nobody connected: github" in out


@pytest.mark.parametrize(("entry", "problem"), [
    ('name = "gh"\ntoken_url = "https://x.example/token"\nclient_id = "c"\ncolour = "red"', "unknown keys"),
    ('name = "gh"\ntoken_url = "http://oauth.example/token"\nclient_id = "c"', "must be an https:// URL"),
    ('name = "gh"\ntoken_url = "https://x.example/token"\nclient_id = "c"\nclient_secret_env = "NOPE_NOT_SET"',
     "NOPE_NOT_SET (client_secret_env) is not set"),
    ('name = "gh"\ntoken_url = "https://x.example/token"\nclient_id = "c"\nowner = "team"', "owner must be"),
    ('name = "gh"\ntoken_url = "https://x.example/token"\nclient_id = "c"\nhosts = ["*.github.io"]',
     "names anyone can register"),
    ('name = "gh"\ntoken_url = "https://x.example/token"', "client_id"),
    ('name = "a b"\ntoken_url = "https://x.example/token"\nclient_id = "c"', "name must match"),
])
def test_bad_entries_are_refused_at_start(tmp_path: Path, entry: str, problem: str) -> None:
    config = tmp_path / "bot.toml"
    config.write_text(f"[[connections]]\n{entry}\n", encoding="utf-8")
    with pytest.raises(SettingsError, match=re.escape(problem)):
        load_connections(config, env_file=None)


def test_defaults_send_the_token_to_the_token_servers_domain(tmp_path: Path) -> None:
    config = tmp_path / "bot.toml"
    config.write_text('[[connections]]\nname = "github"\nclient_id = "c"\n'
                      'token_url = "https://github.com/login/oauth/access_token"\n'
                      '[[connections]]\nname = "app"\nclient_id = "c"\n'
                      'token_url = "https://myapp.herokuapp.com/token"\n', encoding="utf-8")
    specs = load_connections(config, env_file=None)
    assert specs["github"].hosts == ("github.com", "*.github.com") and specs["github"].owner == "user"
    assert specs["github"].allows("api.github.com") and not specs["github"].allows("github.com.evil.example")
    assert specs["app"].hosts == ("myapp.herokuapp.com", "*.myapp.herokuapp.com")  # not every herokuapp.com app
    assert specs["github"].authorize_url is None  # no login URL: calls fail instead of pausing


async def test_kill_while_waiting_for_consent_then_connect_once(
    tmp_path: Path, unused_port: int, fake_slack: FakeSlack, fake_llm: FakeLLM, oauth: FakeOAuth,
) -> None:
    (tmp_path / "bot.toml").write_text(connections_toml(oauth), encoding="utf-8")
    env = slack_env(fake_slack, fake_llm, unused_port) | {
        "APPROVAL_POLL_S": "0.1", "HTTP_ALLOW_HOSTS": "127.0.0.1", CLIENT_SECRET_ENV: oauth.client_secret}
    fake_llm.then(call(oauth))
    process = await BotProcess(tmp_path, env).start()
    await send_event(process, mention("who am I on github?"), "EvConnect")
    card = (await fake_slack.wait_for("chat.postMessage"))[0]
    approve = block_action("approval:approve", card.params["blocks"][-1]["elements"][0]["value"])
    assert await post_form(process, approve) == 200
    link = await personal_link(fake_slack)  # sent once the request is stored and announced
    await process.kill()

    process = await BotProcess(tmp_path, env).start()
    try:
        fake_llm.then(Reply("You are octocat."))
        status, page, _ = await consent(link)
        assert status == 200 and "Connected" in page
        async with asyncio.timeout(20):
            while not any(c.params.get("text") == "You are octocat." for c in fake_slack.posts()):
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # anything run twice would show by now
        assert [c.params.get("text") for c in fake_slack.posts()].count("You are octocat.") == 1
        assert len(resource_calls(oauth)) == 1
        assert "octocat" in fake_llm.requests[-1]["messages"][-1]["content"]
    finally:
        assert await process.terminate() == 0


@pytest.mark.skipif(not os.environ.get("TEST_DATABASE_URL"), reason="needs TEST_DATABASE_URL")
async def test_consent_completed_on_another_replica_resumes_the_waiting_one(
    tmp_path: Path, fake_slack: FakeSlack, fake_llm: FakeLLM, oauth: FakeOAuth, database_url: str,
) -> None:
    keys = f"k1:{base64.b64encode(os.urandom(32)).decode()}"  # replicas share their keys
    replicas = []
    for name in ("a", "b"):
        home = tmp_path / name
        home.mkdir()
        (home / "bot.toml").write_text(connections_toml(oauth), encoding="utf-8")
        env = slack_env(fake_slack, fake_llm, _free_port()) | {
            "DATABASE_URL": database_url, "BOT_SECRET_KEYS": keys, "APPROVAL_POLL_S": "0.1",
            "HTTP_ALLOW_HOSTS": "127.0.0.1", CLIENT_SECRET_ENV: oauth.client_secret}
        replicas.append(await BotProcess(home, env).start())
    a, b = replicas
    try:
        fake_llm.then(call(oauth))
        await send_event(a, mention("who am I on github?"), "EvRepl")
        card = (await fake_slack.wait_for("chat.postMessage"))[0]
        approve = block_action("approval:approve", card.params["blocks"][-1]["elements"][0]["value"])
        assert await post_form(a, approve) == 200
        link = await personal_link(fake_slack)
        fake_llm.then(Reply("You are octocat."))
        status, page, _ = await consent(link.replace(a.base, b.base))  # the browser reaches replica b
        assert status == 200 and "Connected" in page
        async with asyncio.timeout(20):
            while not any(c.params.get("text") == "You are octocat." for c in fake_slack.posts()):
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        assert [c.params.get("text") for c in fake_slack.posts()].count("You are octocat.") == 1
        assert len(resource_calls(oauth)) == 1
    finally:
        for replica in replicas:
            await replica.terminate()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
