"""The vault and what is built on it: keys, rotation, redaction, and the one-time link page."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from core.agents import Agent, AgentDirectory
from core.approvals import ApprovalPolicy
from core.clock import SystemClock
from core.credential_links import CredentialLinks
from core.credentials import CredentialService
from core.events import EventBus
from core.store import CredentialStore, Database
from core.stored_secrets import env_name
from core.tools import ToolError
from core.vault import KeyRing, VaultError
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

    with pytest.raises(Interrupted):
        await rotating.rotate(stop_after_first)  # killed right after the first secret was committed
    keys = [r.key_id for r in await rotating.store.all_secrets()]
    assert keys.count("k2") == 1 and keys.count("k1") == 2
    lines: list[str] = []
    assert await rotating.rotate(lines.append) == (2, 1)  # it resumes with what is left
    assert len(lines) == 2 and all("from key 'k1' to 'k2'" in line for line in lines)
    assert await rotating.rotate(lines.append) == (0, 3)  # a second run is a no-op
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
