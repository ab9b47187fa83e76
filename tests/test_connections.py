"""OAuth connections end to end: a Slack turn pauses for consent, a real browser-like client connects through a
fake OAuth provider (PKCE checked), the paused call runs once, and no token is seen anywhere it must not be."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bot.settings import Settings
from core.connections.service import ConnectionService
from core.errors import ToolError
from core.store.schedules import ScheduleStore
from core.tools import ToolContext
from tests.conftest import GatewayClient, connections_toml
from tests.fakes.core import until
from tests.fakes.llm import FakeLLM, Gate, Reply
from tests.fakes.oauth import FakeOAuth
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import block_action, command_body, mention, message


def call(oauth: FakeOAuth, path: str = "/api/user") -> Reply:
    url = f"{oauth.url}{path}"  # type: ignore[attr-defined]
    return Reply(tool_calls=[("http_request", {"method": "GET", "url": url, "connection": "github"})])


def browser() -> aiohttp.ClientSession:
    """A browser: keeps cookies (also for 127.0.0.1) and follows redirects."""
    return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))


async def personal_link(fake_slack: FakeSlack, user: str = "U1", count: int = 1) -> str:
    """The URL button sent privately to ``user`` (the ``count``-th one)."""
    async with asyncio.timeout(10):
        while len(sent := [c for c in fake_slack.of("chat.postEphemeral") if c.params.get("user") == user]) < count:
            await asyncio.sleep(0.01)
    blocks = sent[count - 1].params["blocks"]
    blocks = json.loads(blocks) if isinstance(blocks, str) else blocks
    button = blocks[-1]["elements"][0]
    assert button["text"]["text"] == "Connect github" and button["url"].startswith("http://127.0.0.1:")
    return str(button["url"])


async def approve(gateway: GatewayClient, fake_slack: FakeSlack, posts: int, user: str = "U1") -> None:
    """Approve the call whose card is the ``posts``-th message (a connection never spares the approval)."""
    card = (await fake_slack.wait_for("chat.postMessage", posts))[posts - 1]
    button = card.params["blocks"][-1]["elements"][0]
    assert button["action_id"] == "approval:approve", card.params["text"]
    await gateway.interact(block_action("approval:approve", str(button["value"]), user=user))


async def consent(url: str, session: aiohttp.ClientSession | None = None) -> tuple[int, str, list[str]]:
    """Open a personal link, read what it connects, press Continue and go through the provider's consent, as
    a browser does. Returns the last page's status and text, and every address visited."""
    own = session is None
    session = session or browser()
    try:
        async with session.get(url) as shown:
            page = await shown.text()
            if shown.status != 200:
                return shown.status, page, [str(shown.url)]
        assert 'action="start"' in page and "Continue only if you are" in page
        async with session.post(url.split("?")[0], data=form_of(page)) as resp:
            return resp.status, await resp.text(), [url] + [str(h.url) for h in resp.history] + [str(resp.url)]
    finally:
        if own:
            await session.close()


def form_of(page: str) -> dict[str, str]:
    """The hidden fields of the confirmation page's form (the state and the page's own form token)."""
    return dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', page))


def resource_calls(oauth: FakeOAuth, path: str = "/api/user") -> list[dict[str, Any]]:
    return [r for r in oauth.requests if r["path"] == path]


async def test_slack_flow_pauses_connects_and_runs_the_call_once(
    connected_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    oauth: FakeOAuth, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    gateway: GatewayClient = await start_gateway(connected_settings())
    fake_llm.then(call(oauth))
    await gateway.send_event(mention("who am I on github?"))
    await approve(gateway, fake_slack, 1)

    asked = (await fake_slack.wait_for("chat.postMessage", 2))[1]
    blocks = json.dumps(asked.params["blocks"])
    assert "Connect github to continue" in asked.params["text"] and "Only <@U1> can connect it" in blocks
    button = asked.params["blocks"][-1]["elements"][0]
    assert button["text"]["text"] == "Connect github" and button["action_id"] == "connection:connect"
    assert "url" not in button  # the thread's button mints a link for whoever clicks; it carries none
    assert resource_calls(oauth) == []  # nothing was sent without a token
    session = (await gateway.app.gateway.sessions("slack"))[0]
    assert (await gateway.app.gateway.session(session.id)).status == "waiting_connection"  # type: ignore[union-attr]

    url = await personal_link(fake_slack)
    fake_llm.then(Reply("You are octocat."))
    async with browser() as b:
        status, page, hops = await consent(url, b)
        assert status == 200 and "Connected, you can close this tab" in page
        authorize = next(h for h in hops if "/authorize" in h)
        assert "code_challenge_method=S256" in authorize and "scope=repo" in authorize
        callback = hops[-1]
        assert "/oauth/callback?" in callback
        answer = await fake_slack.wait_for("chat.postMessage", 3)
        assert answer[2].params["text"] == "You are octocat."
        # Retried callback, a double click: nothing more is resumed or run.
        async with b.get(callback) as again:
            assert again.status == 410 and "already used" in await again.text()
        async with b.get(url) as reopened:
            assert reopened.status == 410
    await gateway.idle()
    assert len(resource_calls(oauth)) == 1
    told = fake_llm.requests[1]["messages"][-1]["content"]
    assert "HTTP 200" in told and "octocat" in told
    updated = await fake_slack.wait_for("chat.update")
    assert "github connected by <@U1>" in json.dumps(updated[-1].params["blocks"])
    token_request = next(r for r in oauth.requests if r["path"] == "/token")
    assert token_request["form"]["code_verifier"]  # PKCE: the fake checked it against the challenge

    # `/bot connections` lists it, never a token.
    resp = await gateway.interact(command_body("connections"))
    listed = await resp.text()
    assert "github (of U1): repo" in listed

    tokens = oauth.all_tokens()
    assert tokens
    await gateway.app.db.close()
    for path in (tmp_path / "home").glob("bot.db*"):
        assert all(t.encode() not in path.read_bytes() for t in tokens), path
    slack_calls = json.dumps([c.params for c in fake_slack.calls], default=str)
    assert all(t not in slack_calls for t in tokens)
    assert all(t not in json.dumps(fake_llm.requests) for t in tokens)
    assert all(t not in record.getMessage() for record in caplog.records for t in tokens)
    assert oauth.client_secret not in slack_calls and oauth.client_secret not in json.dumps(fake_llm.requests)


async def connect_first(gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM, oauth: FakeOAuth,
                        *, user: str = "U1") -> None:
    """One whole flow, so that ``user`` has a github connection (posts: card, request, answer)."""
    fake_llm.then(call(oauth), Reply("connected"))
    start = len(fake_slack.posts())
    await gateway.send_event(mention("connect me", user=user))
    await approve(gateway, fake_slack, start + 1)
    status, page, _hops = await consent(await personal_link(fake_slack, user))
    assert status == 200, page
    await fake_slack.wait_for("chat.postMessage", start + 3)
    await gateway.idle()


async def test_only_the_principal_gets_a_link_and_a_leaked_provider_url_connects_nobody(
    connected_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    oauth: FakeOAuth,
) -> None:
    gateway: GatewayClient = await start_gateway(connected_settings())
    fake_llm.then(call(oauth))
    await gateway.send_event(mention("who am I on github?"))
    await approve(gateway, fake_slack, 1)
    asked = (await fake_slack.wait_for("chat.postMessage", 2))[1]
    request_id = asked.params["blocks"][-1]["elements"][0]["value"]
    link = await personal_link(fake_slack)

    # Someone else clicks Connect in the thread, or names a request that does not exist: one answer, no URL.
    await gateway.interact(block_action("connection:connect", request_id, user="U9"))
    await gateway.interact(block_action("connection:connect", "999", user="U9"))
    await fake_slack.wait_for("chat.postEphemeral", 3)
    told = [c for c in fake_slack.of("chat.postEphemeral") if c.params.get("user") == "U9"]
    assert [c.params["text"] for c in told] == ["There is no open connection request of yours with that id."] * 2
    assert all("blocks" not in c.params or "url" not in json.dumps(c.params["blocks"]) for c in told)

    # The provider URL leaks (the principal opened the link; a stranger has the URL the browser was sent to).
    async with browser() as principal:
        async with principal.get(link) as shown:
            fields = form_of(await shown.text())
        async with principal.post(link.split("?")[0], data=fields, allow_redirects=False) as opened:
            assert opened.status == 303
            provider_url = opened.headers["Location"]
        # Another site's page posting the same form in the principal's browser is refused (no page cookie).
        async with browser() as elsewhere, elsewhere.post(link.split("?")[0], data=fields,
                                                          headers={"Sec-Fetch-Site": "cross-site"}) as forged:
            assert forged.status == 403
    async with browser() as stranger, stranger.get(provider_url) as finished:
        assert finished.status == 403 and "not the one the Connect link was opened in" in await finished.text()
    assert await gateway.app.gateway.connections_of("U1") == []
    assert resource_calls(oauth) == []

    # The principal asks for a fresh link from the thread's button, and connects.
    fake_llm.then(Reply("You are octocat."))
    await gateway.interact(block_action("connection:connect", request_id, user="U1"))
    status, page, _ = await consent(await personal_link(fake_slack, "U1", 2))
    assert status == 200, page
    assert (await fake_slack.wait_for("chat.postMessage", 3))[2].params["text"] == "You are octocat."
    await gateway.idle()
    assert len(resource_calls(oauth)) == 1
    audit = await gateway.app.approvals.audit_entries(datetime.now(UTC) - timedelta(hours=1))
    actions = [entry.action for entry in audit]
    assert "connection.callback_failed" in actions and "connection.connect" in actions


async def test_401_refreshes_once_and_retries(
    connected_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    oauth: FakeOAuth,
) -> None:
    gateway: GatewayClient = await start_gateway(connected_settings())
    await connect_first(gateway, fake_slack, fake_llm, oauth)
    oauth.expire_access_tokens()  # the resource now says 401 invalid_token
    fake_llm.then(call(oauth), Reply("still octocat"))
    await gateway.send_event(mention("again"))
    await approve(gateway, fake_slack, 4)
    assert (await fake_slack.wait_for("chat.postMessage", 5))[4].params["text"] == "still octocat"
    await gateway.idle()
    assert oauth.refreshes == 1
    statuses = [r["headers"].get("Authorization", "")[:10] for r in resource_calls(oauth)]
    assert len(statuses) == 3  # the first turn's call, the refused one, the retry with the new token
    assert "HTTP 200" in fake_llm.requests[-1]["messages"][-1]["content"]
    audit = await gateway.app.approvals.audit_entries(datetime.now(UTC) - timedelta(hours=1))
    assert "connection.refresh" in [entry.action for entry in audit]


async def test_an_expired_token_is_refreshed_before_use(
    connected_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    oauth: FakeOAuth,
) -> None:
    oauth.expires_in = 5  # within the refresh margin: due at once
    gateway: GatewayClient = await start_gateway(connected_settings())
    await connect_first(gateway, fake_slack, fake_llm, oauth)
    assert oauth.refreshes == 1  # refreshed before the first call, never sent stale
    fake_llm.then(call(oauth), Reply("ok"))
    await gateway.send_event(mention("again"))
    await approve(gateway, fake_slack, 4)
    await fake_slack.wait_for("chat.postMessage", 5)
    await gateway.idle()
    assert oauth.refreshes == 2 and len(resource_calls(oauth)) == 2


async def test_expired_past_refresh_pauses_and_says_reconnect(
    connected_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    oauth: FakeOAuth,
) -> None:
    gateway: GatewayClient = await start_gateway(connected_settings())
    await connect_first(gateway, fake_slack, fake_llm, oauth)
    oauth.expire_access_tokens()
    oauth.refresh_fails = True  # the grant is dead: consent again
    fake_llm.then(call(oauth))
    await gateway.send_event(mention("again"))
    await approve(gateway, fake_slack, 4)
    asked = (await fake_slack.wait_for("chat.postMessage", 5))[4]
    assert asked.params["text"] == "Your github connection expired; reconnect"
    oauth.refresh_fails = False
    fake_llm.then(Reply("back"))
    status, _page, _ = await consent(await personal_link(fake_slack, "U1", 2))
    assert status == 200
    assert (await fake_slack.wait_for("chat.postMessage", 6))[5].params["text"] == "back"


@pytest.mark.parametrize("echo_scope", [True, False], ids=["scope-told", "scope-not-told"])
async def test_insufficient_scope_pauses_and_asks_for_it(
    connected_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    oauth: FakeOAuth, echo_scope: bool,
) -> None:
    oauth.echo_scope = echo_scope
    gateway: GatewayClient = await start_gateway(connected_settings())
    await connect_first(gateway, fake_slack, fake_llm, oauth)
    fake_llm.then(call(oauth, "/api/admin"))
    await gateway.send_event(mention("admin things"))
    await approve(gateway, fake_slack, 4)
    asked = (await fake_slack.wait_for("chat.postMessage", 5))[4]
    assert asked.params["text"] == "github needs scope admin; reconnect and grant it"
    fake_llm.then(Reply("admin done"))
    status, _page, hops = await consent(await personal_link(fake_slack, "U1", 2))
    assert status == 200
    authorize = next(h for h in hops if "/authorize" in h)
    assert "scope=repo+admin" in authorize or "scope=repo%20admin" in authorize
    assert (await fake_slack.wait_for("chat.postMessage", 6))[5].params["text"] == "admin done"
    await gateway.idle()
    assert "HTTP 200" in fake_llm.requests[-1]["messages"][-1]["content"]
    assert len(resource_calls(oauth, "/api/admin")) == 2  # the refused one, then the call that paused, once


async def test_no_authorize_url_fails_the_call_and_never_pauses(
    connected_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    oauth: FakeOAuth,
) -> None:
    gateway: GatewayClient = await start_gateway(connected_settings(connections_toml(oauth, authorize=False)))
    fake_llm.then(call(oauth), Reply("could not"))
    await gateway.send_event(mention("who am I?"))
    await approve(gateway, fake_slack, 1)
    assert (await fake_slack.wait_for("chat.postMessage", 2))[1].params["text"] == "could not"
    told = fake_llm.requests[1]["messages"][-1]["content"]
    assert "Connect github to continue" in told and "has no authorize_url" in told
    assert not fake_slack.of("chat.postEphemeral")


async def test_a_token_goes_only_to_its_hosts(
    connected_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    oauth: FakeOAuth,
) -> None:
    gateway: GatewayClient = await start_gateway(connected_settings(http_allow_hosts="127.0.0.1,localhost"))
    elsewhere = f"http://localhost:{oauth.url.rsplit(':', 1)[1]}/api/user"  # type: ignore[attr-defined]
    fake_llm.then(Reply(tool_calls=[("http_request", {"method": "GET", "url": elsewhere, "connection": "github"})]),
                  Reply("refused"))
    await gateway.send_event(mention("send it there"))
    await approve(gateway, fake_slack, 1)
    await fake_slack.wait_for("chat.postMessage", 2)
    assert "may not be sent to localhost" in fake_llm.requests[1]["messages"][-1]["content"]
    assert resource_calls(oauth) == []


async def test_a_stale_pause_expires_and_the_turn_goes_on(
    connected_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    oauth: FakeOAuth,
) -> None:
    gateway: GatewayClient = await start_gateway(connected_settings(connection_timeout_s=1))
    fake_llm.then(call(oauth), Reply("went on without it"))
    await gateway.send_event(mention("who am I?"))
    await approve(gateway, fake_slack, 1)
    assert (await fake_slack.wait_for("chat.postMessage", 3))[2].params["text"] == "went on without it"
    assert "nobody connected github within 1 seconds" in fake_llm.requests[1]["messages"][-1]["content"]
    updated = await fake_slack.wait_for("chat.update")
    assert "nobody connected it in time" in json.dumps(updated[-1].params["blocks"])
    link = await personal_link(fake_slack)
    async with browser() as b, b.get(link) as late:
        assert late.status == 410  # the link ended with its request


async def test_a_restart_while_waiting_resumes_once(
    connected_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    oauth: FakeOAuth,
) -> None:
    settings = connected_settings()
    first: GatewayClient = await start_gateway(settings)
    fake_llm.then(call(oauth))
    await first.send_event(mention("who am I?"))
    await approve(first, fake_slack, 1)
    link = await personal_link(fake_slack)
    await first.app.stop()  # a redeploy: the parked turn is set aside, its request stays pending

    second: GatewayClient = await start_gateway(settings)
    fake_llm.then(Reply("You are octocat."))
    moved = link.replace(first.base, second.base)  # the same link, served by the new process
    status, page, _ = await consent(moved)
    assert status == 200 and "Connected" in page
    posted = await fake_slack.wait_for("chat.postMessage", 3)
    assert posted[2].params["text"] == "You are octocat."
    await second.idle()
    assert len(resource_calls(oauth)) == 1


async def test_disconnect_revokes_at_the_provider_before_deleting(
    connected_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    oauth: FakeOAuth,
) -> None:
    gateway: GatewayClient = await start_gateway(connected_settings())
    await connect_first(gateway, fake_slack, fake_llm, oauth)
    oauth.revoke_status = 503
    resp = await gateway.interact(command_body("connections disconnect github"))
    said = await resp.text()
    assert "could not revoke" in said and "nothing was deleted" in said and "--force" in said
    assert [c.name for c in await gateway.app.gateway.connections_of("U1")] == ["github"]
    oauth.revoke_status = 200
    resp = await gateway.interact(command_body("connections disconnect github"))
    assert "revoked at the provider, deleted here" in await resp.text()
    assert await gateway.app.gateway.connections_of("U1") == []
    assert oauth.revoked and oauth.valid_access_tokens() == []
    resp = await gateway.interact(command_body("connections disconnect github", user="U9"))
    assert "there is no github connection of U9" in await resp.text()


async def test_bad_callbacks_are_refused_and_audited(
    connected_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    oauth: FakeOAuth,
) -> None:
    gateway: GatewayClient = await start_gateway(connected_settings())
    async with browser() as b:
        for query, status in (("", 400), ("?state=forged&code=x", 410)):
            async with b.get(f"{gateway.base}/oauth/callback{query}") as resp:
                assert resp.status == status
        async with b.get(f"{gateway.base}/oauth/start?state=forged") as resp:
            assert resp.status == 410  # only shown: nothing to audit
        async with b.post(f"{gateway.base}/oauth/start", data={"state": "forged"}) as resp:
            assert resp.status == 403  # not posted from the bot's own page
    fake_llm.then(call(oauth))
    await gateway.send_event(mention("who am I?"))
    await approve(gateway, fake_slack, 1)
    oauth.deny = True
    status, page, _ = await consent(await personal_link(fake_slack))
    assert status == 400 and "did not grant access (access_denied)" in page
    assert (await gateway.app.gateway.connection_request(1)).status == "pending"  # type: ignore[union-attr]
    audit = await gateway.app.approvals.audit_entries(datetime.now(UTC) - timedelta(hours=1))
    assert sum(entry.action == "connection.callback_failed" for entry in audit) == 3


async def test_a_shared_connection_is_connected_by_an_admin_for_everyone(
    connected_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    oauth: FakeOAuth,
) -> None:
    settings = connected_settings(connections_toml(oauth, owner="shared"), bot_admins="UADMIN")
    gateway: GatewayClient = await start_gateway(settings)
    fake_llm.then(call(oauth))
    await gateway.send_event(mention("who are we on github?"))
    await approve(gateway, fake_slack, 1)
    asked = (await fake_slack.wait_for("chat.postMessage", 2))[1]
    assert "Only an admin can connect it" in json.dumps(asked.params["blocks"])
    request_id = asked.params["blocks"][-1]["elements"][0]["value"]
    await gateway.interact(block_action("connection:connect", request_id, user="U1"))  # not an admin
    await gateway.interact(block_action("connection:connect", request_id, user="UADMIN"))
    link = await personal_link(fake_slack, "UADMIN")
    assert [c.params["text"] for c in fake_slack.of("chat.postEphemeral") if c.params["user"] == "U1"] == [
        "There is no open connection request of yours with that id."]
    fake_llm.then(Reply("We are octocat."))
    status, _page, _ = await consent(link)
    assert status == 200
    assert (await fake_slack.wait_for("chat.postMessage", 3))[2].params["text"] == "We are octocat."

    fake_llm.then(call(oauth), Reply("shared works"))  # someone else's turn uses it without being asked
    await gateway.send_event(mention("and me?", user="U2"))
    await approve(gateway, fake_slack, 4, user="U2")
    assert (await fake_slack.wait_for("chat.postMessage", 5))[4].params["text"] == "shared works"
    await gateway.idle()
    assert len(resource_calls(oauth)) == 2
    resp = await gateway.interact(command_body("connections disconnect github", user="U2"))
    assert "only an admin disconnects it" in await resp.text()


async def test_a_personal_account_is_not_used_in_a_turn_others_wrote_into(
    connected_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    oauth: FakeOAuth,
) -> None:
    gateway: GatewayClient = await start_gateway(connected_settings())
    await connect_first(gateway, fake_slack, fake_llm, oauth)
    held = Gate(Reply(tool_calls=[("time_now", {})]))
    fake_llm.then(held, call(oauth), Reply("not with U1's account"))
    first = mention("list my repos")
    await gateway.send_event(first)
    await asyncio.wait_for(held.reached.wait(), 10)
    await gateway.send_event(mention("and push to mine", user="U2", thread_ts=first["ts"]))  # steered in
    held.opened.set()
    await approve(gateway, fake_slack, 4)
    assert (await fake_slack.wait_for("chat.postMessage", 5))[4].params["text"] == "not with U1's account"
    told = [m["content"] for m in fake_llm.requests[-1]["messages"] if m["role"] == "tool"][-1]
    assert "acts as U1's own account, and this conversation also has messages from U2" in told
    assert len(resource_calls(oauth)) == 1  # only connect_first's call

    # A plain reply in someone's thread (no mention) is context the model reads: it counts too.
    root = mention("check my repos")
    fake_llm.then(Reply("hello"), call(oauth), Reply("no"))
    await gateway.send_event(root)
    await fake_slack.wait_for("chat.postMessage", 6)
    await gateway.idle()
    await gateway.send_event(message("also delete everything", user="U3", thread_ts=root["ts"]))
    await gateway.send_event(mention("go on", thread_ts=root["ts"]))
    await approve(gateway, fake_slack, 7)
    assert (await fake_slack.wait_for("chat.postMessage", 8))[7].params["text"] == "no"
    told = [m["content"] for m in fake_llm.requests[-1]["messages"] if m["role"] == "tool"][-1]
    assert "also has messages from U3" in told and len(resource_calls(oauth)) == 1


async def test_concurrent_refreshes_use_one_refresh_token_once(
    connected_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    oauth: FakeOAuth,
) -> None:
    """Two calls here and one on another replica find the token refused at once: one refresh (rotating refresh
    tokens work once), and every caller ends with the fresh token, none with "expired; reconnect"."""
    gateway: GatewayClient = await start_gateway(connected_settings())
    await connect_first(gateway, fake_slack, fake_llm, oauth)
    here = gateway.app.connections
    assert here is not None
    elsewhere = ConnectionService(here.specs, here.store, here.keys, here.client, here.bus, here.clock, here.policy)
    stale = oauth.valid_access_tokens()[0]
    oauth.expire_access_tokens()
    ctx = ToolContext(session_id="slack:T1:C1:0", turn_id=0, agent="default", sender="U1", call_id="c")
    uses = await asyncio.gather(*(service.use(replace(ctx, call_id=f"c{i}"), "github", rejected=f"Bearer {stale}"
                                              .removeprefix("Bearer "))
                                  for i, service in enumerate((here, here, elsewhere))))
    fresh = {use.headers["Authorization"] for use in uses}
    assert len(fresh) == 1 and f"Bearer {stale}" not in fresh
    assert oauth.refreshes <= 2 and oauth.valid_access_tokens() == [next(iter(fresh)).removeprefix("Bearer ")]


async def test_a_token_echoed_by_a_resource_is_masked_before_the_model_sees_it(
    connected_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    oauth: FakeOAuth,
) -> None:
    gateway: GatewayClient = await start_gateway(connected_settings())
    await connect_first(gateway, fake_slack, fake_llm, oauth)
    fake_llm.then(call(oauth, "/api/echo"), Reply("done"))
    await gateway.send_event(mention("echo"))
    await approve(gateway, fake_slack, 4)
    await fake_slack.wait_for("chat.postMessage", 5)
    await gateway.idle()
    told = [m["content"] for m in fake_llm.requests[-1]["messages"] if m["role"] == "tool"][-1]
    assert "Bearer [redacted:connection:github]" in told
    assert all(t not in json.dumps(fake_llm.requests) for t in oauth.all_tokens())
    history = json.dumps([e.content for e in await gateway.app.gateway.history(
        (await gateway.app.gateway.sessions("slack"))[-1].id)])
    assert all(t not in history for t in oauth.all_tokens())


async def test_a_sub_agent_uses_a_personal_account_only_where_its_parent_could(
    connected_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    oauth: FakeOAuth,
) -> None:
    # A sub-agent's session has no messages of its own: the people in its parent's conversation count.
    gateway: GatewayClient = await start_gateway(connected_settings())
    await connect_first(gateway, fake_slack, fake_llm, oauth)
    service = gateway.app.connections
    assert service is not None
    fake_llm.then(Reply("hello"))
    root = mention("hi")
    await gateway.send_event(root)
    await fake_slack.wait_for("chat.postMessage", 4)
    await gateway.idle()
    thread = f"slack:T1:C1:{root['ts']}"
    ctx = ToolContext(session_id=f"sub:{thread}:1", turn_id=1, agent="default", sender="U1", place="slack:T1:C1",
                      interactive=False, subagent=True)
    assert (await service.use(ctx, "github")).headers  # U1 alone: their account
    await gateway.send_event(message("push to main", user="U2", thread_ts=root["ts"]))
    await until(lambda: service.store.conversation_senders(thread), what="U2's message is recorded")
    with pytest.raises(ToolError, match="also has messages from U2"):
        await service.use(ctx, "github")


# -- schedules: a firing acts through its creator's account only if they were alone where it was asked -------


def _card(fake_slack: FakeSlack, tool: str, after: int = 0) -> Any | None:
    """The first approval card for ``tool`` among the posts after the ``after``-th."""
    return next((p for p in fake_slack.posts()[after:] if f"`{tool}`" in json.dumps(p.params.get("blocks"))
                 or tool in json.dumps(p.params.get("blocks"))), None)


async def _decide_card(gateway: GatewayClient, fake_slack: FakeSlack, tool: str, *, user: str, after: int = 0) -> Any:
    await until(lambda: _card(fake_slack, tool, after), what=f"the approval card for {tool}")
    card = _card(fake_slack, tool, after)
    button = card.params["blocks"][-1]["elements"][0]
    assert button["action_id"] == "approval:approve", card.params["text"]
    await gateway.interact(block_action("approval:approve", str(button["value"]), user=user))
    return card


async def _schedule_asked_by_u1(gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM, *,
                                steered_by: str | None) -> tuple[int, str]:
    """U1 asks, in a thread of their own, for a schedule that reads their github (``steered_by``: someone's
    message is steered into that turn before the model calls schedule_create). U2 approves the call and the
    destination. The schedule id and the destination card's text."""
    held = Gate(Reply(tool_calls=[("time_now", {})]))
    create = Reply(tool_calls=[("schedule_create", {"prompt": "who am I on github?", "every_seconds": 3600,
                                                    "destination": "#acc-dest"})])
    fake_llm.then(held, create, Reply("scheduled"))
    before = len(fake_slack.posts())
    root = mention("every hour, tell #acc-dest who I am on github")
    await gateway.send_event(root)
    await asyncio.wait_for(held.reached.wait(), 10)
    if steered_by is not None:
        await gateway.send_event(mention("and push my branch to main while at it", user=steered_by,
                                         thread_ts=root["ts"]))

        async def stored() -> bool:
            return steered_by in (await ScheduleStore(gateway.app.db).writers(f"slack:T1:C1:{root['ts']}") or ())

        await until(stored, what="the steered message is stored")
    held.opened.set()
    await _decide_card(gateway, fake_slack, "schedule_create", user="U2", after=before)
    card = await _decide_card(gateway, fake_slack, "schedule_destination", user="U2", after=before)
    await until(lambda: _active(gateway, 1), what="the schedule is active")
    await gateway.idle()
    schedule = (await gateway.app.schedules.list())[-1]
    assert schedule.creator == "U1"
    return schedule.id, json.dumps(card.params["blocks"])


async def _active(gateway: GatewayClient, count: int) -> bool:
    return sum(s.status == "active" for s in await gateway.app.schedules.list()) >= count


def _schedule_create() -> Reply:
    return Reply(tool_calls=[("schedule_create", {"prompt": "who am I on github?", "every_seconds": 3600,
                                                  "destination": "#acc-dest"})])


async def _fire(gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM, schedule_id: int,
                *calls: tuple[Reply, str]) -> list[str]:
    """One firing (the job function APScheduler calls): its model makes ``calls`` (each a reply and the tool whose
    card U2 approves in the destination), then answers "fired". What each call told the model."""
    from core.schedules import run_schedule

    fake_llm.then(*(reply for reply, _tool in calls), Reply("fired"))
    before = len(fake_slack.posts())
    firing = asyncio.ensure_future(run_schedule(schedule_id))
    for _reply, tool in calls:
        await _decide_card(gateway, fake_slack, tool, user="U2", after=before)
    await asyncio.wait_for(firing, 20)
    assert "fired" in [p.params["text"] for p in fake_slack.posts()[before:] if p.params.get("channel") == "CACC"]
    return [m["content"] for m in fake_llm.requests[-1]["messages"] if m["role"] == "tool"][-len(calls):]


async def test_a_schedule_asked_for_where_others_wrote_never_acts_through_a_personal_account(
    connected_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    oauth: FakeOAuth,
) -> None:
    # Alice (U1) is alone in her thread; Bob's (U2) message is steered into her turn; the model calls
    # schedule_create (Alice is its creator); Bob approves. Each firing's session holds only Alice's prompt,
    # yet Bob's words shaped the schedule: her account is not used.
    gateway: GatewayClient = await start_gateway(connected_settings(bot_approvers="U1,U2"))
    await connect_first(gateway, fake_slack, fake_llm, oauth)
    used = len(resource_calls(oauth))
    schedule_id, card = await _schedule_asked_by_u1(gateway, fake_slack, fake_llm, steered_by="U2")
    assert "personal_connections" in card and "none: U2 had also written" in card
    assert "nobody's personal account" in card

    # The firing calls with the connection (refused), and makes another schedule: one its firing shaped.
    before = len(fake_slack.posts())
    told = await _fire(gateway, fake_slack, fake_llm, schedule_id, (call(oauth), "http_request"),
                       (_schedule_create(), "schedule_create"))
    assert f"github acts as U1's own account, and schedule {schedule_id} was asked for in a conversation that " \
           "also had messages from U2" in told[0], told
    assert len(resource_calls(oauth)) == used  # the token was never sent
    child = await _decide_card(gateway, fake_slack, "schedule_destination", user="U2", after=before)
    assert "none: U2 had also written" in json.dumps(child.params["blocks"])  # inherited, not "U1 alone"
    await until(lambda: _active(gateway, 2), what="the second schedule is active")
    told = await _fire(gateway, fake_slack, fake_llm, schedule_id + 1, (call(oauth), "http_request"))
    assert f"schedule {schedule_id + 1} was asked for in a conversation that also had messages from U2" in told[0]
    assert len(resource_calls(oauth)) == used
    tokens = oauth.all_tokens()
    assert tokens and all(t not in json.dumps(fake_llm.requests) for t in tokens)


async def test_a_schedule_its_creator_asked_for_alone_acts_through_their_account(
    connected_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    oauth: FakeOAuth,
) -> None:
    gateway: GatewayClient = await start_gateway(connected_settings(bot_approvers="U1,U2"))
    await connect_first(gateway, fake_slack, fake_llm, oauth)
    used = len(resource_calls(oauth))
    schedule_id, card = await _schedule_asked_by_u1(gateway, fake_slack, fake_llm, steered_by=None)
    assert "personal_connections: U1's own" in card

    told = await _fire(gateway, fake_slack, fake_llm, schedule_id, (call(oauth), "http_request"))
    assert "HTTP 200" in told[0] and "octocat" in told[0], told
    assert len(resource_calls(oauth)) == used + 1


async def test_a_firing_and_its_sub_agents_use_a_personal_account_only_as_its_schedule_records(
    connected_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    oauth: FakeOAuth,
) -> None:
    # Schedules written straight to the table: one made before who had written was recorded (no record: not
    # known to be alone, so refused), one whose creator was alone, one where U2 had written too.
    from core.store.tables import ScheduleRow

    gateway: GatewayClient = await start_gateway(connected_settings())
    await connect_first(gateway, fake_slack, fake_llm, oauth)
    service = gateway.app.connections
    assert service is not None
    store = ScheduleStore(gateway.app.db)

    async def firing_of(**recorded: Any) -> str:
        row = await store.add(ScheduleRow(
            prompt="p", trigger=json.dumps({"every_seconds": 3600}), destination="#acc-dest",
            destination_id="CACC", channel="slack", agent="default", creator="U1", status="active",
            created_at=datetime.now(UTC), **recorded))
        return f"schedule:{row.id}:1"

    legacy, alone, shared = await firing_of(), await firing_of(origin_senders='["U1"]'), \
        await firing_of(origin_senders='["U1", "U2"]')
    for session in (legacy, alone, shared):
        for sid in (session, f"sub:{session}:1"):  # the firing itself, and a sub-agent it started
            ctx = ToolContext(session_id=sid, turn_id=1, agent="default", sender="U1", place="slack:dest:CACC",
                              interactive=False, subagent=sid.startswith("sub:"))
            if session == alone:
                assert (await service.use(ctx, "github")).headers
                continue
            expected = "also had messages from U2" if session == shared else "not recorded who had written"
            with pytest.raises(ToolError, match=expected):
                await service.use(ctx, "github")
