"""Who may use the web chat: a browser on this machine by default, logged-in token holders when it is exposed.

Without ``BOT_WEB_TOKEN`` the only guard is "this request comes from this machine", so it is checked
strictly (channels/web/local.py): a loopback peer, a loopback ``Host`` with our port (a DNS-rebinding page
says ``Host: attacker.example``), a path-only request line, and no header a proxy adds (a proxy on this
host relays other machines).
With a token, a login is a random id whose digest is kept in the database, so it can be revoked.
"""

from __future__ import annotations

import asyncio
import hmac
import re
import secrets
from collections.abc import Awaitable, Callable
from datetime import timedelta
from urllib.parse import urlsplit

from aiohttp import web

from channels.web.local import local_problem
from core.clock import Clock
from core.store import WebSessionStore

COOKIE = "bot_web"
LOGIN_TTL = timedelta(days=30)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_LOGIN_ID = re.compile(r"^[A-Za-z0-9_-]{43}$")  # secrets.token_urlsafe(32)
_WRONG_TOKEN_DELAY_S = 0.5


def bearer_matches(request: web.Request, token: str) -> bool:
    auth = request.headers.get("Authorization", "")
    return auth.startswith("Bearer ") and _same(auth[7:], token)


class WebAuth:
    def __init__(self, token: str | None, logins: WebSessionStore | None, clock: Clock, *,
                 secure_cookie: bool = False) -> None:
        if token is not None and logins is None:
            raise ValueError("a web token needs the login store")
        self.token = token
        self.logins = logins
        self.clock = clock
        self.secure_cookie = secure_cookie
        self.wrong_token_delay_s = _WRONG_TOKEN_DELAY_S
        self._wrong_token = asyncio.Lock()  # wrong guesses wait in line: at most a few per second

    def guard(self, handler: Handler, *, page: bool = False, public: bool = False) -> Handler:
        """Check where the request comes from (no token) or the login (token; not for ``public`` routes),
        then refuse other sites' writes (CSRF). ``page`` routes send a browser to the login page."""

        async def guarded(request: web.Request) -> web.StreamResponse:
            if self.token is None:
                problem = local_problem(request) or (None if page or public else _foreign_fetch(request))
                if problem is not None:
                    return _refused(problem, as_text=page or public)
            elif not public and not await self.logged_in(request):
                if page:
                    raise web.HTTPFound("/login")
                return web.json_response({"error": "log in first (BOT_WEB_TOKEN)"}, status=401)
            if request.method == "POST":
                problem = _foreign_origin(request, local=self.token is None)
                if problem is None and not public and request.content_type != "application/json":
                    problem = "send JSON (Content-Type: application/json)"
                if problem is not None:
                    return web.json_response({"error": problem}, status=403)
            return await handler(request)

        return guarded

    async def logged_in(self, request: web.Request) -> bool:
        """Bearer token (API clients) or a live login cookie, checked in the database on every request."""
        if self.token is None:
            return True
        if request.headers.get("Authorization", "").startswith("Bearer "):
            if bearer_matches(request, self.token):
                return True
            await self._slow_down()
        login_id = request.cookies.get(COOKIE, "")
        if not _LOGIN_ID.match(login_id):
            return False
        assert self.logins is not None
        return await self.logins.is_active(login_id, self.clock.now())

    async def login_page(self, request: web.Request) -> web.Response:
        if self.token is None:
            raise web.HTTPFound("/")
        failed = request.query.get("failed") == "1"
        return web.Response(text=_LOGIN_HTML.replace("{{error}}", "Wrong token." if failed else ""),
                            content_type="text/html")

    async def login(self, request: web.Request) -> web.Response:
        if self.token is None or self.logins is None:
            raise web.HTTPFound("/")
        form = await request.post()
        given = form.get("token")
        if not isinstance(given, str) or not _same(given, self.token):
            await self._slow_down()
            raise web.HTTPFound("/login?failed=1")
        login_id = secrets.token_urlsafe(32)
        await self.logins.create(login_id, self.clock.now(), LOGIN_TTL)
        response = web.HTTPFound("/")
        response.set_cookie(COOKIE, login_id, httponly=True, samesite="Strict", secure=self.secure_cookie,
                            path="/", max_age=int(LOGIN_TTL.total_seconds()))
        raise response

    async def logout(self, request: web.Request) -> web.Response:
        """Ends this browser's login (``bot web logout-all`` ends every one)."""
        if self.token is None or self.logins is None:
            raise web.HTTPFound("/")
        login_id = request.cookies.get(COOKIE, "")
        if _LOGIN_ID.match(login_id):
            await self.logins.revoke(login_id, self.clock.now())
        response = web.HTTPFound("/login")
        response.del_cookie(COOKIE, path="/")
        raise response

    async def _slow_down(self) -> None:
        async with self._wrong_token:
            await asyncio.sleep(self.wrong_token_delay_s)


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


def _foreign_origin(request: web.Request, *, local: bool) -> str | None:
    origin = request.headers.get("Origin")
    if origin is None:
        return None
    parts = urlsplit(origin)
    same = parts.netloc.lower() == request.host.lower() and (parts.scheme == "http" or not local)
    return None if same else "cross-site request refused"


def _foreign_fetch(request: web.Request) -> str | None:
    """An API call made by another site's page (the browser says so), for the no-token mode."""
    if request.headers.get("Sec-Fetch-Site", "same-origin") not in ("same-origin", "none"):
        return "cross-site request refused"
    referer = request.headers.get("Referer")
    if referer is not None:
        parts = urlsplit(referer)
        if parts.scheme != "http" or parts.netloc.lower() != request.host.lower():
            return "cross-site request refused"
    return _foreign_origin(request, local=True)


def _refused(problem: str, *, as_text: bool) -> web.Response:
    text = (f"Refused: {problem}. Without BOT_WEB_TOKEN the web chat only answers a browser on this machine "
            "at http://localhost:PORT/ or http://127.0.0.1:PORT/, not through a proxy or another name. "
            "To use it from elsewhere, set BOT_WEB_TOKEN.")
    if as_text:
        return web.Response(status=403, text=text)
    return web.json_response({"error": text}, status=403)


_LOGIN_HTML = """<!doctype html><html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1"><title>Log in · bot</title>
<link rel="stylesheet" href="/static/app.css"></head>
<body class="login"><form method="post" action="/login" class="card">
<h1>Chat-ops bot</h1><p>This web chat is reachable from other machines, so it asks for the login token
(<code>BOT_WEB_TOKEN</code>).</p><p class="error">{{error}}</p>
<input type="password" name="token" placeholder="Login token" autocomplete="current-password" autofocus required>
<button type="submit">Log in</button></form></body></html>"""
