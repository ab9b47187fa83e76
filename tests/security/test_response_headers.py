"""Every response of the bot's server says it may not be framed, sniffed or referred from (SPEC §17).

The review's finding: no response carried X-Frame-Options or a Content-Security-Policy, so a page the
operator visits could frame the token-less web chat at http://127.0.0.1:<port>/ and trick them into
clicking Approve. Each request goes over real HTTP to the real server: pages, the API, the OAuth and
credential pages, the Slack install page, health and metrics, and the error answers (404, 405, 400, 401,
403, 503) that a handler, a middleware or aiohttp itself produces."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from bot.settings import Settings
from tests.conftest import GatewayClient

EXPECTED = {
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def _check(method: str, path: str, status: int, headers: Any) -> None:
    where = f"{method} {path} ({status})"
    for name, value in EXPECTED.items():
        assert headers.get(name) == value, f"{where}: {name} is {headers.get(name)!r}"
    policy = headers.get("Content-Security-Policy") or ""
    directives = {d.strip().split(" ", 1)[0]: d.strip() for d in policy.split(";") if d.strip()}
    assert directives.get("default-src") == "default-src 'self'", f"{where}: {policy!r}"
    assert directives.get("frame-ancestors") == "frame-ancestors 'none'", f"{where}: {policy!r}"


async def test_every_answer_of_the_server_forbids_framing(
    connected_settings: Callable[..., Settings], start_gateway: Any,
) -> None:
    gw: GatewayClient = await start_gateway(connected_settings())
    requests: list[tuple[str, str, dict[str, Any]]] = [
        ("GET", "/", {}),  # the web chat page
        ("GET", "/static/app.js", {}),
        ("GET", "/static/nothing.js", {}),  # 404 from a handler
        ("GET", "/c/0123456789abcdef0123456789abcdef", {}),
        ("GET", "/api/conversations", {}),
        ("POST", "/api/conversations/0123456789abcdef0123456789abcdef/messages", {"data": "x"}),  # refused write
        ("GET", "/healthz", {}),
        ("GET", "/readyz", {}),
        ("GET", "/metrics", {}),
        ("GET", "/oauth/start", {}),  # no state: an error page
        ("GET", "/oauth/callback?state=nope&code=x", {}),
        ("GET", "/credentials/not-a-token", {}),
        ("POST", "/slack/events", {"data": "{}"}),  # unsigned: 401 from bolt
        ("GET", "/no/such/route", {}),  # aiohttp's own 404
        ("DELETE", "/healthz", {}),  # aiohttp's own 405
    ]
    seen: set[int] = set()
    for method, path, extra in requests:
        async with gw.http.request(method, f"{gw.base}{path}", allow_redirects=False, **extra) as resp:
            await resp.read()
            seen.add(resp.status)
            _check(method, path, resp.status, resp.headers)
    assert {200, 401, 404, 405}.issubset(seen), seen
    # While the bot starts or stops, the middleware's 503 carries them too.
    gw.app.phase = "stopping"
    async with gw.http.get(f"{gw.base}/api/conversations") as resp:
        assert resp.status == 503
        _check("GET", "/api/conversations", resp.status, resp.headers)
    gw.app.phase = "ready"


async def test_the_slack_install_pages_carry_them_too(
    make_settings: Callable[..., Settings], start_gateway: Any, fake_slack: Any,
) -> None:
    gw: GatewayClient = await start_gateway(make_settings(
        slack_bot_token=None, slack_client_id=fake_slack.client_id, slack_client_secret=fake_slack.client_secret,
        slack_allowed_teams="T1"))
    async with gw.http.get(f"{gw.base}/slack/install", allow_redirects=False) as resp:
        body = await resp.text()
        assert resp.status == 200 and "Add to Slack" in body
        assert "style=" not in body  # the policy would block an inline style: the page has none
        _check("GET", "/slack/install", resp.status, resp.headers)
    async with gw.http.get(f"{gw.base}/slack/oauth_redirect?code=x&state=forged", allow_redirects=False) as resp:
        await resp.read()
        _check("GET", "/slack/oauth_redirect", resp.status, resp.headers)


@pytest.mark.parametrize("name", ["index.html", "app.js"])
def test_the_web_chat_has_no_inline_script_or_style(name: str) -> None:
    # default-src 'self' would block them: the page must keep working under the policy it is served with.
    from pathlib import Path

    import channels.web

    text = (Path(channels.web.__file__).parent / "static" / name).read_text(encoding="utf-8")
    assert re.search(r"<script>|<style|\bstyle=|\son[a-z]+=|javascript:", text, re.IGNORECASE) is None
    assert "eval(" not in text and "new Function" not in text
