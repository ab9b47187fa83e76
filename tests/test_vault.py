"""The vault and what is built on it: keys, rotation, redaction, and the one-time link page."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bot.channels import sealed_kinds
from core.agents import Agent, AgentDirectory
from core.approval_policy import ApprovalPolicy
from core.clock import SystemClock
from core.credential_links import CredentialLinks
from core.credentials import CredentialService
from core.errors import ToolError, VaultError
from core.events import EventBus
from core.sealed_values import reseal_all, unsettled
from core.store import CredentialStore, Database
from core.stored_secrets import env_name
from core.vault import KeyRing
from tests.conftest import GatewayClient
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import mention


def key(key_id: str) -> str:
    return f"{key_id}:{base64.b64encode(os.urandom(32)).decode()}"


def test_seal_and_open_with_key_ids() -> None:
    k1, k2 = key("k1"), key("k2")
    sealed = KeyRing.parse(k1).seal("value-1", context="a.token")
    assert sealed.key_id == "k1" and "value-1" not in sealed.blob
    both = KeyRing.parse(f"{k2},{k1}")
    assert both.current == "k2" and both.open(sealed, "a.token") == "value-1"
    with pytest.raises(VaultError, match="sealed with key 'k1', which is not configured"):
        KeyRing.parse(k2).open(sealed, "a.token")
    with pytest.raises(VaultError, match="cannot be opened with key 'k1': wrong key"):
        KeyRing.parse(key("k1")).open(sealed, "a.token")  # same id, other bytes: an error, never garbage
    with pytest.raises(VaultError, match="wrong key or damaged"):
        both.open(sealed, "b.token")  # the name is bound to the ciphertext


@pytest.mark.parametrize("spec", ["", "k1", "k1:", ":abc", f"k1:{base64.b64encode(b'short').decode()}"])
def test_bad_key_specs_are_refused(spec: str) -> None:
    with pytest.raises(VaultError):
        KeyRing.parse(spec)


def test_environment_names() -> None:
    assert env_name("github.token") == "GITHUB_TOKEN"
    assert env_name("acc-api.key") == "ACC_API_KEY"


async def _service(tmp_path: Path, keys: str) -> tuple[CredentialService, Database]:
    db = Database(f"sqlite:///{tmp_path / 'vault.db'}")
    await db.migrate()
    service = CredentialService(CredentialStore(db), KeyRing.parse(keys), EventBus(), SystemClock(),
                                ApprovalPolicy(("requester",), ()), AgentDirectory([Agent()]))
    return service, db


async def test_rotation_moves_every_secret_and_resumes_when_interrupted(tmp_path: Path) -> None:
    k1, k2 = key("k1"), key("k2")
    old, db = await _service(tmp_path, k1)
    for i in range(3):
        await old.set_secret(f"s{i}.token", f"value-{i}", scope="agent", agent="default", by="U1")
    await db.close()

    rotating, db = await _service(tmp_path, f"{k2},{k1}")

    class Interrupted(Exception):
        pass

    def stop_after_first(_line: str) -> None:
        raise Interrupted

    async def rotate(progress: Any) -> tuple[int, int]:
        [report, *_others] = await reseal_all(sealed_kinds(db), rotating.keys, SystemClock(), progress)
        return report.resealed, report.current

    with pytest.raises(Interrupted):
        await rotate(stop_after_first)  # killed right after the first secret was committed
    keys = [r.key_id for r in await rotating.store.all_secrets()]
    assert keys.count("k2") == 1 and keys.count("k1") == 2
    lines: list[str] = []
    assert await rotate(lines.append) == (2, 1)  # it resumes with what is left
    assert len(lines) == 2 and all("from key 'k1' to 'k2'" in line for line in lines)
    assert await rotate(lines.append) == (0, 3)  # a second run is a no-op
    await db.close()

    only_new, db = await _service(tmp_path, k2)  # the old key can now be removed
    names = ["s0.token", "s1.token", "s2.token"]
    assert sorted((await only_new.env_for(_ctx(), names)).values()) == ["value-0", "value-1", "value-2"]
    await db.close()


def _ctx() -> Any:
    from core.tools import ToolContext

    return ToolContext(session_id="s", turn_id=1, agent="default", sender="U1")


async def test_redaction_and_scopes(tmp_path: Path) -> None:
    service, db = await _service(tmp_path, key("k1"))
    await service.set_secret("own.token", "own-secret-1", scope="agent", agent="default", by="U1")
    await service.set_secret("other.token", "other-secret-2", scope="agent", agent="ops", by="U1")
    await service.set_secret("team.key", "shared-secret-3", scope="shared", agent="ops", by="U1")
    assert await service.env_for(_ctx(), ["own.token"]) == {"OWN_TOKEN": "own-secret-1"}
    for name in ("other.token", "team.key"):  # only what is granted
        with pytest.raises(ToolError, match="no credential named"):
            await service.env_for(_ctx(), [name])
    text = "own-secret-1 and other-secret-2 and shared-secret-3"
    assert await service.redact(text) == ("[redacted:own.token] and [redacted:other.token] and "
                                          "[redacted:team.key]")  # every stored value, whoever owns it
    assert (await service.headers_for(_ctx(), "own.token")).headers == {"Authorization": "Bearer own-secret-1"}
    with pytest.raises(ToolError, match=r"no credential named 'team\.key'"):
        await service.headers_for(_ctx(), "team.key")
    await db.close()


async def test_one_time_link_page(gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    fake_llm.then(Reply(tool_calls=[("credential_request", {"name": "link.token", "reason": "via a link"})]),
                  Reply("got it"))
    await gateway.send_event(mention("need a token"))
    await fake_slack.wait_for("chat.postMessage")
    credentials = gateway.app.credentials
    request = (await credentials.store.pending())[0]
    token = await CredentialLinks(credentials).create_link(request.id)
    url = f"{gateway.base}/credentials/{token}"
    async with aiohttp.ClientSession() as http:
        async with http.get(url) as resp:
            assert resp.status == 200 and "link.token" in await resp.text()
        async with http.get(url, headers={"Host": "bot.example.com"}) as resp:
            assert resp.status == 403  # not HTTPS and not this machine
        async with http.post(url, data={"value": ""}) as resp:
            assert resp.status == 400 and "Enter the value." in await resp.text()
        async with http.post(url, data={"value": "linked-secret-9"}) as resp:
            assert resp.status == 200 and "stored" in await resp.text()
            assert "linked-secret-9" not in await resp.text()
        async with http.get(url) as resp:
            assert resp.status == 410 and "already been used" in await resp.text()
        async with http.get(f"{gateway.base}/credentials/not-a-token") as resp:
            assert resp.status == 410 and "not valid" in await resp.text()
    posts = await fake_slack.wait_for("chat.postMessage", 2)
    assert posts[1].params["text"] == "got it"


async def test_an_expired_link_says_so(gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    import datetime as dt

    import jwt

    fake_llm.then(Reply(tool_calls=[("credential_request", {"name": "late.token", "reason": "x"})]))
    await gateway.send_event(mention("need a token"))
    await fake_slack.wait_for("chat.postMessage")
    credentials = gateway.app.credentials
    request = (await credentials.store.pending())[0]
    past = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
    await credentials.store.add_link("old-jti", request.id, past)
    token = jwt.encode({"jti": "old-jti", "rid": request.id, "exp": past, "aud": "credential-link"},
                       credentials.keys.derive("credential-links"), algorithm="HS256")
    async with aiohttp.ClientSession() as http, http.get(f"{gateway.base}/credentials/{token}") as resp:
        assert resp.status == 410 and "expired" in await resp.text()


async def test_http_request_gets_the_credential_as_a_header(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    from aiohttp import web

    # The server is local and speaks plain http: listed as internal, so the credential may go there.
    gateway: GatewayClient = await start_gateway(make_settings(http_allow_hosts="127.0.0.1"))

    from tests.fakes.server import RunningServer
    from tests.slack_requests import block_action

    seen: list[str] = []

    async def echo(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        return web.Response(text=f"you sent {request.headers.get('Authorization')}")

    app = web.Application()
    app.router.add_get("/whoami", echo)
    server = await RunningServer(app).start()
    try:
        await gateway.app.credentials.set_secret("api.token", "api-secret-77", scope="agent", agent="default",
                                                 by="U1")
        fake_llm.then(Reply(tool_calls=[("http_request", {"method": "GET", "url": f"{server.url}/whoami",
                                                           "credential": "api.token"})]), Reply("done"))
        await gateway.send_event(mention("call the api"))
        approval = (await fake_slack.wait_for("chat.postMessage"))[0]
        assert "api-secret-77" not in str(approval.params)
        await gateway.interact(block_action("approval:approve", approval.params["blocks"][-1]["elements"][0]["value"]))
        await fake_slack.wait_for("chat.postMessage", 2)
        assert seen == ["Bearer api-secret-77"]
        result = fake_llm.requests[1]["messages"][-1]["content"]
        assert "HTTP 200" in result and "you sent Bearer [redacted:api.token]" in result
    finally:
        await server.stop()


# -- rotation covers every sealed value (issue 32, point 5) ------------------------------------------------


def _cli_env(settings: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, keys: str) -> dict[str, str]:
    """What an operator's shell holds for this deployment: multi-workspace Slack, the connection's client secret."""
    from tests.conftest import CLIENT_SECRET_ENV
    from tests.slack_requests import SIGNING_SECRET

    return {"BOT_HOME": str(settings.bot_home), "BOT_CONFIG": str(settings.bot_config), "BOT_SECRET_KEYS": keys,
            "SLACK_CLIENT_ID": fake_slack.client_id, "SLACK_CLIENT_SECRET": fake_slack.client_secret,
            "SLACK_SIGNING_SECRET": SIGNING_SECRET, "SLACK_ALLOWED_TEAMS": "T1",
            "SLACK_API_URL": f"{fake_slack.url}/api/", "LLM_BASE_URL": f"{fake_llm.url}/v1",  # type: ignore[attr-defined]
            "LLM_API_KEY": "sk-test-key-abcdef", "LLM_MODEL": "fake-model",
            CLIENT_SECRET_ENV: os.environ[CLIENT_SECRET_ENV],
            # the test's own database (PostgreSQL under TEST_DATABASE_URL; else SQLite in BOT_HOME, the default)
            **({"DATABASE_URL": settings.database_url} if settings.database_url else {})}


async def test_rotation_reseals_connections_and_slack_installs_so_the_old_key_can_go(
    connected_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, oauth: Any,
    tmp_path: Path,
) -> None:
    from tests.slack_workspaces import install
    from tests.test_cli import bot
    from tests.test_connections import approve, call, connect_first, resource_calls

    k1, k2 = key("k1"), key("k2")
    oauth_mode = {"slack_bot_token": None, "slack_client_id": fake_slack.client_id,
                  "slack_client_secret": fake_slack.client_secret, "slack_allowed_teams": "T1"}
    settings = connected_settings(bot_secret_keys=k1, **oauth_mode)
    first: GatewayClient = await start_gateway(settings)
    await install(first, fake_slack, "T1")  # the workspace's bot token, sealed under k1
    await connect_first(first, fake_slack, fake_llm, oauth)  # U1's github tokens, sealed under k1
    await first.app.credentials.set_secret("api.token", "api-secret-5", scope="agent", agent="default", by="U1")
    await first.app.stop()
    [connected_with] = {r["headers"]["Authorization"] for r in resource_calls(oauth)}

    both = _cli_env(settings, fake_slack, fake_llm, f"{k2},{k1}")
    code, out, err = await bot(tmp_path, "doctor", env=both)
    old = [line for line in out.splitlines() if "not under the current key" in line]
    assert len(old) == 1, out + err  # every row still under k1, by kind and name, and what to run
    assert "credential 'api.token'" in old[0] and "connection 'github' (U1)" in old[0], old
    assert "Slack install of T1" in old[0] and "'k1'" in old[0], old
    assert "bot credentials rotate" in out
    sealed = [connected_with.removeprefix("Bearer "), fake_slack.token_of("T1"), "api-secret-5"]
    assert not any(value in out + err for value in sealed)

    code, out, err = await bot(tmp_path, "credentials", "rotate", env=both)
    assert code == 0, out + err
    for kind in ("credentials: 1 re-sealed", "connections: 1 re-sealed", "slack installs: 1 re-sealed"):
        assert kind in out, out
    assert not any(value in out + err for value in sealed)
    code, out, err = await bot(tmp_path, "credentials", "rotate", env=both)
    assert code == 0 and "0 re-sealed" in out and "1 re-sealed" not in out, out + err  # a second run moves nothing
    after = Database(settings.resolved_database_url)
    assert await unsettled(sealed_kinds(after), KeyRing.parse(k2)) == (3, [])  # what the doctor reads: all under k2
    await after.close()

    # The old key is dropped: the workspace is still answered with its token, the account still used.
    second: GatewayClient = await start_gateway(connected_settings(bot_secret_keys=k2, **oauth_mode))
    fake_llm.then(call(oauth), Reply("still octocat"))
    posts = len(fake_slack.posts())
    await second.send_event(mention("who am I now?"))
    await approve(second, fake_slack, posts + 1)
    answer = (await fake_slack.wait_for("chat.postMessage", posts + 2))[posts + 1]
    assert answer.params["text"] == "still octocat" and answer.token == fake_slack.token_of("T1")
    await second.idle()
    assert resource_calls(oauth)[-1]["headers"]["Authorization"] == connected_with  # no new consent
    assert "HTTP 200" in fake_llm.requests[-1]["messages"][-1]["content"]
    assert (await second.app.credentials.env_for(_ctx(), ["api.token"])) == {"API_TOKEN": "api-secret-5"}


async def test_rotation_goes_past_a_value_no_key_opens_and_names_it(tmp_path: Path, fake_llm: FakeLLM) -> None:
    from tests.test_cli import bot

    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    gone, k1, k2 = key("gone"), key("k1"), key("k2")
    lost, db = await _service(home, gone)  # a value sealed under a key nobody kept (listed first)
    await lost.set_secret("broken.token", "broken-value-1", scope="agent", agent="default", by="U1")
    await db.close()
    kept, db = await _service(home, k1)
    await kept.set_secret("kept.token", "kept-value-2", scope="agent", agent="default", by="U1")
    await db.close()

    env = {"BOT_HOME": str(home), "DATABASE_URL": f"sqlite:///{home / 'vault.db'}", "BOT_SECRET_KEYS": f"{k2},{k1}",
           "LLM_BASE_URL": f"{fake_llm.url}/v1", "LLM_MODEL": "fake-model"}  # type: ignore[attr-defined]
    code, out, err = await bot(tmp_path, "doctor", env=env)
    assert code == 1 and "✗ encryption keys: credential 'broken.token'" in out and "'gone'" in out, out + err
    assert "! sealed values: 1 value(s) not under the current key 'k2'" in out and "'kept.token'" in out, out
    code, out, err = await bot(tmp_path, "credentials", "rotate", env=env)
    assert code == 1, out + err  # not done: said at the end, after everything else was re-sealed
    assert "credential 'broken.token'" in out + err and "'gone'" in out + err, out + err
    assert "broken-value-1" not in out + err and "kept-value-2" not in out + err
    assert "credentials: 1 re-sealed" in out, out
    rotated, db = await _service(home, k2)
    assert await rotated.env_for(_ctx(), ["kept.token"]) == {"KEPT_TOKEN": "kept-value-2"}
    await db.close()


async def test_rotation_never_overwrites_a_value_written_meanwhile(tmp_path: Path) -> None:
    import json
    from dataclasses import replace
    from datetime import UTC, datetime, timedelta

    from core.connections.service import seal_context
    from core.store.connection_tables import ConnectionRow
    from core.store.connections import ConnectionStore
    from core.vault import Sealed

    k1, k2 = key("k1"), key("k2")
    old, db = await _service(tmp_path, k1)  # the running bot, still sealing under k1
    await old.set_secret("a.token", "first-value", scope="agent", agent="default", by="U1")
    connections, now = ConnectionStore(db), datetime.now(UTC)

    def seal(row: ConnectionRow) -> None:
        assert row.id is not None
        sealed = old.keys.seal(json.dumps({"access_token": "at-1", "refresh_token": "rt-1"}),
                               seal_context(row.name, row.owner, row.id))
        row.key_id, row.ciphertext = sealed.key_id, sealed.blob

    account, _ = await connections.connect(
        ConnectionRow(name="github", owner="U1", key_id="", ciphertext="", scopes="null", connected_by="U1",
                      created_at=now, updated_at=now), seal=seal, request_id=None, by="U1", now=now, audit={})
    assert account.id is not None
    # A refresh is in flight: its new refresh token replaces this one when it lands (the old one works once).
    assert await connections.claim_refresh(account.id, expected_ciphertext=account.ciphertext, now=now,
                                           until=now + timedelta(minutes=1))

    rotating, rotating_db = await _service(tmp_path, f"{k2},{k1}")
    kinds = sealed_kinds(rotating_db)
    credentials = kinds[0]
    read_first = [await credentials.rows()]  # rotation read the credentials, then the bot replaced one

    async def read_before_the_write() -> Any:
        return read_first.pop() if read_first else await credentials.rows()

    kinds[0] = replace(kinds[0], rows=read_before_the_write)
    await old.set_secret("a.token", "second-value", scope="agent", agent="default", by="U1")
    lines: list[str] = []
    reports = {r.kind: r for r in await reseal_all(kinds, rotating.keys, SystemClock(), lines.append)}
    assert reports["credentials"].resealed == 1  # the value read again, never the stale one written back
    assert reports["connections"].resealed == 0 and reports["connections"].busy == ["connection 'github' (U1)"]
    assert (await connections.get("github", "U1")).ciphertext == account.ciphertext  # type: ignore[union-attr]

    await connections.release_refresh(account.id)  # the refresh ended: now it can move
    reports = {r.kind: r for r in await reseal_all(sealed_kinds(rotating_db), rotating.keys, SystemClock(),
                                                   lines.append)}
    assert (reports["credentials"].resealed, reports["credentials"].current) == (0, 1)
    assert reports["connections"].resealed == 1 and not reports["connections"].busy
    await db.close()
    await rotating_db.close()

    only_new, db = await _service(tmp_path, k2)
    assert await only_new.env_for(_ctx(), ["a.token"]) == {"A_TOKEN": "second-value"}
    row = await ConnectionStore(db).get("github", "U1")
    assert row is not None and row.id is not None
    opened = only_new.keys.open(Sealed(row.key_id, row.ciphertext), seal_context(row.name, row.owner, row.id))
    assert json.loads(opened) == {"access_token": "at-1", "refresh_token": "rt-1"}
    await db.close()
