"""Point 6: the web chat checks where requests come from; logins live in the database; /metrics is guarded.

Every request here goes over real HTTP to the real server. The Host header, the forwarding headers and
the peer address are what an attacker controls (DNS rebinding, a proxy on the same host, another machine).
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import json
import socket
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from sqlalchemy import update
from sqlmodel import select

from bot.settings import Settings
from core.store import WebSessionStore
from core.store.tables import AuditRow, WebSessionRow
from tests.bot_process import run_cli
from tests.conftest import GatewayClient
from tests.fakes.llm import FakeLLM, Reply

CID = "0123456789abcdef0123456789abcdef"
TOKEN = "a-very-long-login-token-for-tests"
FORWARDING = ("Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "X-Real-IP", "Via")


def _port(gw: GatewayClient) -> int:
    return gw.app.bound_port


def _outside_address() -> str | None:
    """A non-loopback address of this machine, so a test can be a peer that is not 127.0.0.1."""
    candidates: list[str] = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent; this only picks the outgoing address
            candidates.append(s.getsockname()[0])
        except OSError:
            pass
    try:
        candidates.append(socket.gethostbyname(socket.gethostname()))
    except OSError:
        pass
    for address in candidates:
        ip = ipaddress.ip_address(address)
        if not ip.is_loopback and not ip.is_unspecified:
            return address
    return None


async def _fetch(method: str, url: str, *, headers: dict[str, str] | None = None, body: Any = None,
                 data: Any = None) -> tuple[int, str, aiohttp.ClientResponse]:
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
        if body is not None:
            data = json.dumps(body)
            headers = {"Content-Type": "application/json", **(headers or {})}
        async with http.request(method, url, headers=headers, data=data, allow_redirects=False) as resp:
            if resp.headers.get("Content-Type", "").startswith("text/event-stream"):
                return resp.status, "", resp
            return resp.status, await resp.text(), resp


async def _park_approval(gw: GatewayClient, fake_llm: FakeLLM) -> int:
    """A real parked approval: the model asks for a gated tool in a web conversation."""
    fake_llm.then(Reply(tool_calls=[("http_request", {"method": "GET", "url": "http://example.invalid/"})]))
    status, _, _ = await _fetch("POST", f"{gw.base}/api/conversations/{CID}/messages", body={"text": "fetch it"})
    assert status == 200
    for _ in range(500):
        pending = await gw.app.approvals.pending()
        if pending:
            return pending[0].id
        await asyncio.sleep(0.01)
    raise AssertionError("no approval was parked")


# -- without a token: loopback, a loopback Host, no proxy ------------------------------------------


async def test_without_token_a_foreign_host_is_refused_on_every_route(gateway: GatewayClient,
                                                                      fake_llm: FakeLLM) -> None:
    """DNS rebinding: the browser talks to 127.0.0.1 but says Host: attacker.example."""
    port = _port(gateway)
    for host in (f"attacker.example:{port}", "attacker.example", f"127.0.0.1.nip.io:{port}",
                 f"localhost:{port + 1}", "localhost", f"127.0.0.1:{port}.attacker.example", ""):
        headers = {"Host": host}
        for path in ("/", f"/c/{CID}", "/static/app.js", "/static/app.css", "/login", "/api/conversations",
                     f"/api/conversations/{CID}", f"/api/conversations/{CID}/events", "/api/schedules"):
            status, text, _ = await _fetch("GET", gateway.base + path, headers=headers)
            assert status == 403, (host, path, status)
            assert "BOT_WEB_TOKEN" in text, text
        status, _, _ = await _fetch("POST", f"{gateway.base}/api/conversations/{CID}/messages",
                                    headers=headers, body={"text": "rm -rf ~"})
        assert status == 403, host
        status, _, _ = await _fetch("POST", f"{gateway.base}/api/conversations/{CID}/stop", headers=headers, body={})
        assert status == 403, host
    await gateway.idle()
    assert fake_llm.requests == []
    # /healthz and /readyz stay open for probes.
    for path in ("/healthz", "/readyz"):
        status, _, _ = await _fetch("GET", gateway.base + path, headers={"Host": "attacker.example"})
        assert status == 200, path


async def test_without_token_forwarded_requests_are_refused(gateway: GatewayClient, fake_llm: FakeLLM) -> None:
    """nginx on the same host in front of 127.0.0.1: the peer is loopback, but the request came from outside."""
    port = _port(gateway)
    for name in FORWARDING:
        headers = {"Host": f"127.0.0.1:{port}", name: "203.0.113.9"}
        for path in ("/", "/api/conversations", f"/api/conversations/{CID}/events"):
            status, _, _ = await _fetch("GET", gateway.base + path, headers=headers)
            assert status == 403, (name, path)
        status, _, _ = await _fetch("POST", f"{gateway.base}/api/conversations/{CID}/messages",
                                    headers=headers, body={"text": "hi"})
        assert status == 403, name
    await gateway.idle()
    assert fake_llm.requests == []


async def test_without_token_nobody_outside_can_approve(gateway: GatewayClient, fake_llm: FakeLLM) -> None:
    approval_id = await _park_approval(gateway, fake_llm)
    port = _port(gateway)
    url = f"{gateway.base}/api/approvals/{approval_id}"
    for headers in ({"Host": f"attacker.example:{port}"},
                    {"Host": f"attacker.example:{port}", "Origin": f"http://attacker.example:{port}"},
                    {"Host": f"127.0.0.1:{port}", "X-Forwarded-For": "203.0.113.9"},
                    {"Host": f"127.0.0.1:{port}", "Origin": "http://attacker.example"},
                    {"Host": f"127.0.0.1:{port}", "Origin": "null"},
                    {"Host": f"127.0.0.1:{port}", "Origin": f"http://localhost:{port + 1}"}):
        for verdict in ("approve", "always"):
            status, _, _ = await _fetch("POST", url, headers=headers, body={"verdict": verdict})
            assert status == 403, headers
    info = await gateway.app.approvals.get(approval_id)
    assert info is not None and info.status == "pending"
    # The same request from this machine's own page is accepted (so the refusals above are about origin).
    fake_llm.then(Reply("ok"))
    status, _, _ = await _fetch("POST", url, headers={"Host": f"127.0.0.1:{port}",
                                                      "Origin": f"http://127.0.0.1:{port}"},
                                body={"verdict": "deny"})
    assert status == 200
    await gateway.idle()


async def test_without_token_loopback_hosts_are_served(gateway: GatewayClient, make_settings: Callable[..., Settings],
                                                       start_gateway: Any) -> None:
    port = _port(gateway)
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}", f"[::1]:{port}"):
        for path in ("/", "/static/app.js", "/api/conversations"):
            status, _, _ = await _fetch("GET", gateway.base + path, headers={"Host": host})
            assert status == 200, (host, path)
        status, _, _ = await _fetch("POST", f"{gateway.base}/api/conversations/{CID}/stop",
                                    headers={"Host": host, "Origin": f"http://{host}"}, body={})
        assert status == 200, host
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        pytest.skip("this machine cannot bind ::1")
    v6: GatewayClient = await start_gateway(make_settings(host="::1"))
    status, _, _ = await _fetch("GET", f"http://[::1]:{v6.app.bound_port}/api/conversations")
    assert status == 200


async def test_without_token_a_peer_from_another_machine_is_refused(gateway: GatewayClient) -> None:
    """Even with a perfect Host header, a non-loopback peer is not 'this machine'."""
    outside = _outside_address()
    if outside is None:
        pytest.skip("this machine has no non-loopback address")
    # The settings refuse a public HOST without a token, so add a listener on all addresses to the same
    # server: that is what a misconfiguration or a future change would expose.
    runner = gateway.app._runner
    assert runner is not None
    site = web.TCPSite(runner, "0.0.0.0", 0)
    await site.start()
    port = next(int(a[1]) for a in runner.addresses if isinstance(a, tuple) and int(a[1]) != _port(gateway))
    for path in ("/", "/api/conversations"):
        status, _, _ = await _fetch("GET", f"http://{outside}:{port}{path}", headers={"Host": f"127.0.0.1:{port}"})
        assert status == 403, path
    status, _, _ = await _fetch("GET", f"http://127.0.0.1:{port}/api/conversations")
    assert status == 200  # the same listener from loopback is served


# -- with a token: server-side logins ------------------------------------------------------------


def _cookie(resp: aiohttp.ClientResponse) -> tuple[str, str]:
    raw = resp.headers["Set-Cookie"]
    morsel = resp.cookies["bot_web"]
    return morsel.value, raw


async def _login(gw: GatewayClient, token: str = TOKEN) -> tuple[int, str, str]:
    status, _, resp = await _fetch("POST", f"{gw.base}/login", data={"token": token})
    if "bot_web" not in resp.cookies:
        return status, "", resp.headers.get("Location", "")
    value, raw = _cookie(resp)
    return status, value, raw


async def _with_cookie(gw: GatewayClient, path: str, cookie: str) -> int:
    status, _, _ = await _fetch("GET", gw.base + path, headers={"Cookie": f"bot_web={cookie}"})
    return status


async def test_login_is_a_random_server_side_session(make_settings: Callable[..., Settings], start_gateway: Any,
                                                     tmp_path: Path, database_url: str | None) -> None:
    gw: GatewayClient = await start_gateway(make_settings(bot_web_token=TOKEN))
    status, first, raw = await _login(gw)
    assert status == 302 and first
    _, second, _ = await _login(gw)
    assert first != second  # not derived from the token
    assert TOKEN not in raw and TOKEN not in first
    assert "HttpOnly" in raw and "SameSite=Strict" in raw and "Path=/" in raw and "Secure" not in raw
    for cookie in (first, second):
        assert await _with_cookie(gw, "/api/conversations", cookie) == 200
        assert await _with_cookie(gw, "/", cookie) == 200
    # Only digests are stored.
    async with gw.app.db.read() as s:
        rows = (await s.exec(select(WebSessionRow))).all()
    assert {r.id_digest for r in rows} == {hashlib.sha256(c.encode()).hexdigest() for c in (first, second)}
    assert all(r.expires_at - r.created_at == timedelta(days=30) for r in rows)
    # A made-up cookie, or the old HMAC-of-the-token cookie, is not a login.
    assert await _with_cookie(gw, "/api/conversations", "x" * 43) == 401
    status, _, resp = await _fetch("GET", gw.base + "/", headers={"Cookie": "bot_web=" + "y" * 43})
    assert (status, resp.headers.get("Location")) == (302, "/login")
    status, _, _ = await _fetch("POST", f"{gw.base}/login", data={"token": "wrong-token-wrong-token"})
    assert status == 302

    # The operator revokes every login with the real CLI, against the same database.
    env = {"BOT_HOME": str(tmp_path / "home")}
    if database_url:
        env["DATABASE_URL"] = database_url
    code, out = await run_cli(tmp_path, env, "web", "logout-all")
    assert code == 0, out
    assert "2" in out, out
    for cookie in (first, second):
        assert await _with_cookie(gw, "/api/conversations", cookie) == 401
        status, _, resp = await _fetch("GET", gw.base + "/", headers={"Cookie": f"bot_web={cookie}"})
        assert (status, resp.headers.get("Location")) == (302, "/login")
    async with gw.app.db.read() as s:
        audit = (await s.exec(select(AuditRow).where(AuditRow.action == "web.logout_all"))).all()
    assert len(audit) == 1 and json.loads(audit[0].detail or "{}") == {"revoked": 2}
    # API clients with the token are not affected; a new login works again.
    status, _, _ = await _fetch("GET", gw.base + "/api/conversations", headers={"Authorization": f"Bearer {TOKEN}"})
    assert status == 200
    _, third, _ = await _login(gw)
    assert await _with_cookie(gw, "/api/conversations", third) == 200


async def test_logout_and_expiry_end_a_login(make_settings: Callable[..., Settings], start_gateway: Any) -> None:
    gw: GatewayClient = await start_gateway(make_settings(bot_web_token=TOKEN))
    _, mine, _ = await _login(gw)
    _, other, _ = await _login(gw)
    # Logging out from another site's form does nothing (no cookie is sent cross-site, and Origin is checked).
    status, _, _ = await _fetch("POST", f"{gw.base}/logout",
                                headers={"Cookie": f"bot_web={mine}", "Origin": "http://attacker.example"})
    assert status == 403
    assert await _with_cookie(gw, "/api/conversations", mine) == 200
    status, _, resp = await _fetch("POST", f"{gw.base}/logout", headers={"Cookie": f"bot_web={mine}"})
    assert (status, resp.headers.get("Location")) == (302, "/login")
    assert await _with_cookie(gw, "/api/conversations", mine) == 401
    assert await _with_cookie(gw, "/api/conversations", other) == 200  # only the current login ended
    # An expired login is refused even though its row is not revoked.
    async with gw.app.db.write() as s:
        await s.exec(update(WebSessionRow).values(expires_at=datetime.now(UTC) - timedelta(seconds=1)))
    assert await _with_cookie(gw, "/api/conversations", other) == 401


async def test_an_open_event_stream_ends_when_its_login_is_revoked(make_settings: Callable[..., Settings],
                                                                   start_gateway: Any,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("channels.web.adapter._KEEPALIVE_S", 0.05)  # the stream re-checks its login this often
    gw: GatewayClient = await start_gateway(make_settings(bot_web_token=TOKEN))
    _, cookie, _ = await _login(gw)
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http, \
            http.get(f"{gw.base}/api/conversations/{CID}/events", headers={"Cookie": f"bot_web={cookie}"}) as resp:
        assert resp.status == 200
        assert (await resp.content.readline()).startswith(b": connected")
        assert await WebSessionStore(gw.app.db).revoke_all("test", datetime.now(UTC)) == 1
        async with asyncio.timeout(5):
            rest = await resp.content.read()  # returns when the server ends the stream
    assert b"data:" not in rest


async def test_wrong_tokens_wait_in_line(make_settings: Callable[..., Settings], start_gateway: Any) -> None:
    """Guessing in parallel does not go faster; the right token is not slowed down."""
    gw: GatewayClient = await start_gateway(make_settings(bot_web_token=TOKEN))
    web_channel = next(c for c in gw.app.channels if c.name == "web")
    web_channel.auth.wrong_token_delay_s = 0.2  # type: ignore[attr-defined]
    loop = asyncio.get_running_loop()
    started = loop.time()
    guesses = [_login(gw, f"guess-number-{i}-of-many") for i in range(3)]
    bearer = _fetch("GET", gw.base + "/api/conversations", headers={"Authorization": "Bearer guess-of-some-length"})
    right = _login(gw)
    results = await asyncio.gather(*guesses, bearer, right)
    assert [r[0] for r in results] == [302, 302, 302, 401, 302]
    assert results[-1][1]  # the right token got a login
    assert loop.time() - started >= 4 * 0.2


async def test_cookie_is_secure_when_the_public_url_is_https(make_settings: Callable[..., Settings],
                                                             start_gateway: Any) -> None:
    https: GatewayClient = await start_gateway(make_settings(bot_web_token=TOKEN,
                                                             bot_public_url="https://bot.example.com"))
    _, _, raw = await _login(https)
    assert "Secure" in raw
    plain: GatewayClient = await start_gateway(make_settings(bot_web_token=TOKEN,
                                                             bot_public_url="http://bot.example.com"))
    _, _, raw = await _login(plain)
    assert raw and "Secure" not in raw


async def test_with_token_cross_site_writes_are_refused(make_settings: Callable[..., Settings],
                                                        start_gateway: Any, fake_llm: FakeLLM) -> None:
    gw: GatewayClient = await start_gateway(make_settings(bot_web_token=TOKEN))
    _, cookie, _ = await _login(gw)
    status, _, _ = await _fetch("POST", f"{gw.base}/api/conversations/{CID}/messages",
                                headers={"Cookie": f"bot_web={cookie}", "Origin": "http://attacker.example"},
                                body={"text": "hi"})
    assert status == 403
    status, _, _ = await _fetch("POST", f"{gw.base}/api/conversations/{CID}/messages",
                                headers={"Authorization": "Bearer wrong-token-of-some-length"}, body={"text": "hi"})
    assert status == 401
    await gw.idle()
    assert fake_llm.requests == []


# -- /metrics -----------------------------------------------------------------------------------


async def test_metrics_need_loopback_or_the_token(make_settings: Callable[..., Settings], start_gateway: Any) -> None:
    # Slack HTTP mode on a public HOST with no web token (the web chat is off, as the settings require).
    gw: GatewayClient = await start_gateway(make_settings(host="0.0.0.0", bot_web_chat=False))
    port = _port(gw)
    status, text, _ = await _fetch("GET", f"http://127.0.0.1:{port}/metrics")
    assert status == 200 and "chatops_turns_started" in text
    for name in FORWARDING:  # a proxy on this host forwarding an outside request
        status, _, _ = await _fetch("GET", f"http://127.0.0.1:{port}/metrics", headers={name: "203.0.113.9"})
        assert status == 403, name
    status, _, _ = await _fetch("GET", f"http://127.0.0.1:{port}/metrics", headers={"Host": "attacker.example"})
    assert status == 403
    outside = _outside_address()
    if outside is None:
        pytest.skip("this machine has no non-loopback address to be another peer")
    status, _, _ = await _fetch("GET", f"http://{outside}:{port}/metrics", headers={"Host": f"127.0.0.1:{port}"})
    assert status == 403
    status, _, _ = await _fetch("GET", f"http://{outside}:{port}/healthz")
    assert status == 200  # probes stay open

    tokened: GatewayClient = await start_gateway(make_settings(host="0.0.0.0", bot_web_token=TOKEN))
    port = _port(tokened)
    status, _, _ = await _fetch("GET", f"http://{outside}:{port}/metrics")
    assert status == 403
    status, _, _ = await _fetch("GET", f"http://{outside}:{port}/metrics",
                                headers={"Authorization": "Bearer not-the-token-at-all"})
    assert status == 403
    status, text, _ = await _fetch("GET", f"http://{outside}:{port}/metrics",
                                   headers={"Authorization": f"Bearer {TOKEN}"})
    assert status == 200 and "chatops_turns_started" in text
    # A web chat login cookie is not a metrics credential from outside, and the chat itself needs a login.
    status, _, _ = await _fetch("GET", f"http://{outside}:{port}/api/conversations")
    assert status == 401


# -- every kind of relay header, and requests aimed at another site -----------------------------------

# Headers proxies and CDNs add (or that name another client or host): one list for the web chat, /metrics
# and the credential link page (channels/web/local.py).
RELAY_HEADERS = ("Via", "X-Client-IP", "True-Client-IP", "CF-Connecting-IP", "X-Cluster-Client-IP", "Client-IP",
                 "X-Original-Forwarded-For", "X-Original-Host", "X-Original-URL", "X-Host", "X-Forwarded",
                 "X-Forwarded-Port", "x-forwarded-server", "Forwarded-For", "Fastly-Client-IP", "X-ProxyUser-Ip",
                 "X-Real-IP")


async def _raw(port: int, request: str) -> tuple[int, bytes]:
    """Sends ``request`` as written (aiohttp's client always writes an origin-form target)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request.encode())
        await writer.drain()
        async with asyncio.timeout(5):
            data = await reader.read()
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


async def test_without_token_any_relay_header_is_refused(gateway: GatewayClient, fake_llm: FakeLLM) -> None:
    port = _port(gateway)
    for name in RELAY_HEADERS:
        headers = {"Host": f"127.0.0.1:{port}", name: "203.0.113.9"}
        for path in ("/", "/api/conversations"):
            status, _, _ = await _fetch("GET", gateway.base + path, headers=headers)
            assert status == 403, (name, path)
        status, _, _ = await _fetch("POST", f"{gateway.base}/api/conversations/{CID}/messages",
                                    headers=headers, body={"text": "hi"})
        assert status == 403, name
    status, _, _ = await _fetch("GET", f"{gateway.base}/metrics", headers={"Via": "1.1 proxy"})
    assert status == 403
    await gateway.idle()
    assert fake_llm.requests == []


async def test_without_token_an_absolute_form_request_target_is_refused(gateway: GatewayClient,
                                                                        fake_llm: FakeLLM) -> None:
    """``GET http://evil.example/... HTTP/1.1`` is how a client talks to a proxy: not a local browser's request."""
    port = _port(gateway)
    for target in ("http://evil.example/api/conversations", f"http://127.0.0.1:{port}/api/conversations",
                   "HTTP://evil.example/", f"https://localhost:{port}/"):
        status, body = await _raw(port, f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                                        "Connection: close\r\n\r\n")
        assert status == 403, (target, body)
    for path, body in ((f"/api/conversations/{CID}/messages", '{"text": "x"}'),
                       ("/api/approvals/1", '{"verdict": "approve"}')):
        status, _ = await _raw(port, f"POST http://evil.example{path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                                     f"Origin: http://evil.example\r\nContent-Type: application/json\r\n"
                                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}")
        assert status == 403, path
    # The usual origin-form request is served (so the refusals above are about the target).
    status, _ = await _raw(port, f"GET /api/conversations HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                                 "Connection: close\r\n\r\n")
    assert status == 200
    await gateway.idle()
    assert fake_llm.requests == []
