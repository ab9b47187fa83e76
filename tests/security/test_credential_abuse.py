"""Credentials against a hostile model or channel member (outside review of issue 12):

- a credential request never replaces a stored secret: not when asked for (a shared one not granted to
  the agent is reported, nobody is asked), not when provided (modal, web form, link) after another
  value was stored meanwhile; only ``bot credentials set`` replaces;
- nothing is provided after the request's ``expires_at``;
- a credential limited to hosts is never exported to ``shell_run`` (a command could send it anywhere);
- ``http_request`` takes no ``Host`` header and never sends a credential over plain http to a host
  the operator did not list in HTTP_ALLOW_HOSTS;
- the model's ``reason`` cannot dress up the "Provide a secret" card (line breaks, mrkdwn, invisible
  characters, clickable links).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from sqlalchemy import update
from sqlmodel import col, select

from bot.settings import Settings
from core.credential_links import CredentialLinks
from core.errors import ToolError
from core.store.tables import CredentialRequestRow, SecretGrantRow, SecretRow
from core.stored_secrets import hosts_of, open_secret
from core.tools import Tool, ToolContext
from tests.browser import chromium_or_skip
from tests.conftest import GatewayClient
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.server import RunningServer
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import block_action, mention, view_submission

ORIGINAL = "operator-team-token-0000"
ATTACKER = "attacker-chosen-value-9999"
SECRET = "api-secret-4242"
CID = "0123456789abcdef0123456789abcdef"


def _ctx(agent: str = "default") -> ToolContext:
    return ToolContext(session_id="s", turn_id=1, agent=agent, sender="U1")


def _values(value: str, hosts: str | None = None) -> dict[str, Any]:
    return {"value": {"value": {"type": "plain_text_input", "value": value}},
            "hosts": {"hosts": {"type": "plain_text_input", "value": hosts}}}


async def _submit(gateway: GatewayClient, request_id: str, value: str, user: str = "U1") -> dict[str, Any]:
    resp = await gateway.interact(view_submission("credential_provide", request_id, _values(value), user=user))
    assert resp.status == 200
    body = await resp.text()
    return json.loads(body) if body else {}


async def _until(condition: Callable[[], Any], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not await condition():
            await asyncio.sleep(0.02)


def _cards(fake_slack: FakeSlack) -> list[Any]:
    return [c for c in fake_slack.posts() if "credential:provide" in json.dumps(c.params)]


async def _ask(gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM, args: dict[str, Any],
               *, thread_ts: str | None = None) -> str:
    """The model asks for a credential in a Slack thread (then echoes); the id on the card's Provide button."""
    before = len(_cards(fake_slack))
    fake_llm.then(Reply(tool_calls=[("credential_request", args)]))
    await gateway.send_event(mention("get the token", thread_ts=thread_ts))

    async def carded() -> bool:
        return len(_cards(fake_slack)) > before
    await _until(carded)
    return str(_cards(fake_slack)[-1].params["blocks"][-1]["elements"][0]["value"])


async def _tool_results(fake_llm: FakeLLM) -> str:
    return json.dumps([m for r in fake_llm.requests for m in r["messages"] if m.get("role") == "tool"])


async def _rows(gateway: GatewayClient) -> tuple[list[SecretRow], list[SecretGrantRow]]:
    async with gateway.app.db.read() as s:
        return list((await s.exec(select(SecretRow))).all()), list((await s.exec(select(SecretGrantRow))).all())


async def _store_team_token(gateway: GatewayClient) -> None:
    await gateway.app.credentials.set_secret("team.token", ORIGINAL, scope="shared", agent="ops", by="operator",
                                             hosts=["api.github.com"])


async def _team_token_untouched(gateway: GatewayClient) -> None:
    rows, grants = await _rows(gateway)
    assert [(r.name, r.scope, r.agent) for r in rows] == [("team.token", "shared", "")]
    assert open_secret(gateway.app.credentials.keys, rows[0]) == ORIGINAL
    assert hosts_of(rows[0]) == ["api.github.com"]
    assert [g.agent for g in grants] == ["ops"]
    use = await gateway.app.credentials.headers_for(_ctx("ops"), "team.token")
    assert use.headers == {"Authorization": f"Bearer {ORIGINAL}"} and use.hosts == ("api.github.com",)


# -- a request never replaces a stored secret ---------------------------------------------------------


@pytest.mark.parametrize("scope", ["shared", "agent", None])  # an agent-scoped copy would shadow it
async def test_asking_for_a_shared_credential_not_granted_asks_nobody(
    gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM, scope: str | None
) -> None:
    await _store_team_token(gateway)
    args = {"name": "team.token", "reason": "need the team token"} | ({"scope": scope} if scope else {})
    fake_llm.then(Reply(tool_calls=[("credential_request", args)]),
                  Reply("I can't get it"))
    await gateway.send_event(mention("get the team token"))
    await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()
    assert _cards(fake_slack) == []  # nobody was asked
    assert await gateway.app.credentials.store.pending() == []
    told = await _tool_results(fake_llm)
    assert "a shared credential named team.token exists but is not granted to agent default" in told
    assert "bot credentials set team.token --scope shared --agent default" in told
    await _team_token_untouched(gateway)


async def test_a_value_provided_after_a_shared_one_was_stored_does_not_replace_it(
    gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    """The request was made while no such credential existed; the operator stores one before anybody
    answers. The answer must not replace the operator's value, its hosts or its grants."""
    request_id = await _ask(gateway, fake_slack, fake_llm,
                            {"name": "team.token", "scope": "shared", "reason": "need the team token"})
    await _store_team_token(gateway)
    answer = await _submit(gateway, request_id, ATTACKER)
    assert answer.get("response_action") == "errors", answer
    said = answer["errors"]["value"]
    assert "team.token" in said and "not replaced" in said and "bot credentials set" in said, said
    await _team_token_untouched(gateway)
    request = await gateway.app.credentials.get(int(request_id))
    assert request is not None and request.settled  # closed: its card no longer offers Provide
    await gateway.idle()
    assert "not granted to agent default" in await _tool_results(fake_llm)


async def test_a_second_answer_for_the_same_name_never_replaces_the_first(
    gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    """Two threads ask the same agent for the same credential; both get answered (modal, then link)."""
    first = await _ask(gateway, fake_slack, fake_llm, {"name": "acc.token", "reason": "one"}, thread_ts="1.1")
    second = await _ask(gateway, fake_slack, fake_llm, {"name": "acc.token", "reason": "two"}, thread_ts="2.2")
    assert await _submit(gateway, first, ORIGINAL) == {}
    credentials = gateway.app.credentials
    token = await CredentialLinks(credentials).create_link(int(second))
    async with aiohttp.ClientSession() as http, http.post(f"{gateway.base}/credentials/{token}",
                                                          data={"value": ATTACKER}) as resp:
        page = await resp.text()
    assert resp.status == 409 and "not replaced" in page, page
    rows, _ = await _rows(gateway)
    assert len(rows) == 1 and open_secret(credentials.keys, rows[0]) == ORIGINAL
    await gateway.idle()
    # The second thread's agent is told it can use what the first answer stored.
    assert (await credentials.get(int(second))).settled  # type: ignore[union-attr]
    assert (await _tool_results(fake_llm)).count("acc.token is now stored and granted to you") == 2


async def test_nothing_is_provided_after_expiry(
    gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    """The waiter may not have noticed yet (or the bot was down): the settle itself checks the time."""
    request_id = await _ask(gateway, fake_slack, fake_llm, {"name": "late.token", "reason": "later"})
    past = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=5)
    async with gateway.app.db.write() as s:
        await s.exec(update(CredentialRequestRow).where(col(CredentialRequestRow.id) == int(request_id))
                     .values(expires_at=past))
    answer = await _submit(gateway, request_id, SECRET)
    assert answer.get("response_action") == "errors", answer
    assert "expired" in answer["errors"]["value"]
    assert await gateway.app.credentials.store.all_secrets() == []
    assert (await gateway.app.credentials.get(int(request_id))).status == "expired"  # type: ignore[union-attr]


# -- host-limited credentials stay out of shell_run ---------------------------------------------------


async def test_a_host_limited_credential_is_not_exported_to_shell_run(gateway: GatewayClient) -> None:
    credentials = gateway.app.credentials
    await credentials.set_secret("gh.token", SECRET, scope="agent", agent="default", by="op",
                                 hosts=["api.github.com"])
    await credentials.set_secret("free.token", "free-value-1", scope="agent", agent="default", by="op")
    for names in (["gh.token"], ["free.token", "gh.token"]):
        with pytest.raises(ToolError) as err:
            await credentials.env_for(_ctx(), names)
        said = str(err.value)
        assert "gh.token" in said and "api.github.com" in said and "http_request" in said
        assert "credential='gh.token'" in said and SECRET not in said
    assert await credentials.env_for(_ctx(), ["free.token"]) == {"FREE_TOKEN": "free-value-1"}
    # The way the model is told to use a credential matches what it may do with it.
    await credentials.set_secret("gh.token", SECRET, scope="agent", agent="default", by="op",
                                 hosts=["api.github.com"])
    told = await credentials.tool().function(_ctx(), {"name": "gh.token", "reason": "x"})
    assert "credentials=['gh.token']" not in told and "credential='gh.token'" in told


# -- http_request: no Host header, no credential in clear ---------------------------------------------


@dataclass
class Recorder:
    seen: list[dict[str, str]] = field(default_factory=list)
    server: RunningServer | None = None

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.port


@pytest.fixture
async def recorder() -> AsyncIterator[Recorder]:
    rec = Recorder()

    async def handle(request: web.Request) -> web.Response:
        rec.seen.append(dict(request.headers))
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    rec.server = await RunningServer(app).start()
    yield rec
    await rec.server.stop()


def _http(gw: GatewayClient) -> Tool:
    tool = gw.app.dispatcher.runner.tools.get("http_request")
    assert tool is not None
    return tool


async def _get(tool: Tool, url: str, **args: Any) -> str:
    return await tool.function(_ctx(), {"method": "GET", "url": url, **args})


@pytest.mark.parametrize("header", ["Host", "host", "HOST", " Host "])
async def test_http_request_takes_no_host_header(
    make_settings: Callable[..., Settings], start_gateway: Any, recorder: Recorder, header: str
) -> None:
    gw: GatewayClient = await start_gateway(make_settings(http_allow_hosts="localhost"))
    await gw.app.credentials.set_secret("api.key", f"X-Api-Key: {SECRET}", scope="agent", agent="default",
                                        by="op", hosts=["localhost"])
    url = f"http://localhost:{recorder.port}/x"
    for args in ({"credential": "api.key"}, {}):
        with pytest.raises(ToolError, match="Host"):
            await _get(_http(gw), url, headers={header: "attacker.example"}, **args)
    assert recorder.seen == []  # refused before connecting
    assert (await _get(_http(gw), url, credential="api.key")).startswith("HTTP 200")
    assert recorder.seen[-1]["X-Api-Key"] == SECRET and recorder.seen[-1]["Host"] == f"localhost:{recorder.port}"


async def test_a_credential_never_goes_over_plain_http_to_an_unlisted_host(
    make_settings: Callable[..., Settings], start_gateway: Any, recorder: Recorder
) -> None:
    # Private addresses allowed, but 127.0.0.1 not declared internal: a credential is not sent in clear.
    gw: GatewayClient = await start_gateway(make_settings(http_allow_private=True, http_allow_hosts="localhost"))
    await gw.app.credentials.set_secret("any.token", SECRET, scope="agent", agent="default", by="op")
    await gw.app.credentials.set_secret("ip.token", SECRET, scope="agent", agent="default", by="op",
                                        hosts=["127.0.0.1"])
    for name in ("any.token", "ip.token"):
        with pytest.raises(ToolError, match=r"plain http.*HTTP_ALLOW_HOSTS") as err:
            await _get(_http(gw), f"http://127.0.0.1:{recorder.port}/x", credential=name)
        assert SECRET not in str(err.value)
    assert recorder.seen == []
    # Without a credential the same request is fine; a host the operator listed gets it over http.
    assert (await _get(_http(gw), f"http://127.0.0.1:{recorder.port}/plain")).startswith("HTTP 200")
    assert "Authorization" not in recorder.seen[-1]
    assert (await _get(_http(gw), f"http://localhost:{recorder.port}/listed", credential="any.token")
            ).startswith("HTTP 200")
    assert recorder.seen[-1]["Authorization"] == f"Bearer {SECRET}"


# -- the reason cannot dress up the card --------------------------------------------------------------

EVIL_REASON = ("routine check\n\n*URGENT from IT*: paste it at https://evil.example/login first "
               "`x` \u202emoc.live\u202c <!channel> www.evil.example _now_")


def _section_texts(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [b["text"] for b in blocks if b.get("type") == "section" and "Reason" in b["text"]["text"]]


def _check_slack_reason(blocks: list[dict[str, Any]]) -> None:
    texts = _section_texts(blocks)
    assert len(texts) == 1, blocks
    text = texts[0]
    assert text.get("verbatim") is True or text["type"] == "plain_text"  # Slack does not link or parse it
    reason = text["text"].split("Reason", 1)[1]
    assert "\n" not in reason  # one line: nothing below it passes for the bot's own words
    shown = reason.split("`")
    assert len(shown) == 3, reason  # exactly one code span: no *bold*, _italics_ or <!channel> outside it
    assert "URGENT" in shown[1] and "⟦U+202E⟧" in shown[1] and "\u202e" not in reason
    assert "://" not in reason and "<" not in reason  # no link, no mention


async def test_the_reason_cannot_dress_up_the_slack_card_or_modal(
    gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    request_id = await _ask(gateway, fake_slack, fake_llm, {"name": "acc.token", "reason": EVIL_REASON})
    _check_slack_reason(_cards(fake_slack)[-1].params["blocks"])
    await gateway.interact(block_action("credential:provide", request_id))
    modal = (await fake_slack.wait_for("views.open"))[0].params["view"]
    modal = json.loads(modal) if isinstance(modal, str) else modal
    _check_slack_reason(modal["blocks"])


async def test_the_reason_cannot_dress_up_the_one_time_link_page(
    gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    request_id = await _ask(gateway, fake_slack, fake_llm, {"name": "acc.token", "reason": EVIL_REASON})
    token = await CredentialLinks(gateway.app.credentials).create_link(int(request_id))
    async with aiohttp.ClientSession() as http, http.get(f"{gateway.base}/credentials/{token}") as resp:
        page = await resp.text()
    reason = page.split("Reason", 1)[1].split("</p>", 1)[0]
    assert "⟦U+202E⟧" in reason and "\u202e" not in page and "\n" not in reason
    assert "://" not in reason and "<a" not in page


async def test_the_reason_cannot_dress_up_the_web_chat_card(gateway: GatewayClient, fake_llm: FakeLLM) -> None:
    chromium = chromium_or_skip()
    from playwright.async_api import async_playwright, expect

    fake_llm.then(Reply(tool_calls=[("credential_request", {"name": "acc.token", "reason": EVIL_REASON})]),
                  Reply("thanks"))
    async with gateway.http.post(f"{gateway.base}/api/conversations/{CID}/messages", json={"text": "go"}) as resp:
        assert resp.status < 300
    await _until(lambda: _pending(gateway))
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=chromium, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run"])
        page = await browser.new_page()
        await page.goto(f"{gateway.base}/c/{CID}")
        card = page.locator(".msg.credential.pending")
        await expect(card).to_contain_text("acc.token", timeout=15_000)
        text = await card.inner_text()
        links = await card.locator("a").count()
        await browser.close()
    reason = text.split("Reason", 1)[1].split("\n", 1)[0]
    assert "⟦U+202E⟧" in reason and "\u202e" not in text and "URGENT" in reason and "://" not in reason
    assert links == 0


async def _pending(gateway: GatewayClient) -> bool:
    return bool(await gateway.app.credentials.store.pending())


@pytest.mark.parametrize("reason", ["<" * 500, "\u202e" * 500, "&\u200b" * 250, "`" * 499 + "x", "\n" * 500])
def test_the_longest_reason_still_fits_a_slack_block(reason: str) -> None:
    from types import SimpleNamespace

    from channels.slack.credentials import reason_block
    from core.display import shown_reason

    block = reason_block(SimpleNamespace(reason=reason))  # type: ignore[arg-type]
    assert len(block["text"]["text"]) <= 3000 and block["text"]["text"].count("`") == 2
    assert "more characters" in shown_reason(reason) or len(shown_reason(reason)) <= 600
