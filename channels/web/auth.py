"""Who may use the web chat: anyone on this machine by default, token holders when it is exposed."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from aiohttp import web

COOKIE = "bot_web"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class WebAuth:
    def __init__(self, token: str | None, *, secure_cookie: bool = False) -> None:
        self.token = token
        self.secure_cookie = secure_cookie
        # The cookie holds a digest of the token, so the token itself is never stored in the browser.
        self._cookie = hmac.new(token.encode(), b"bot-web-login", hashlib.sha256).hexdigest() if token else None

    def allowed(self, request: web.Request) -> bool:
        if self.token is None or self._cookie is None:
            return True
        auth = request.headers.get("Authorization", "")
        if auth.startswith("Bearer ") and hmac.compare_digest(auth[7:].encode(), self.token.encode()):
            return True
        cookie = request.cookies.get(COOKIE, "")
        return hmac.compare_digest(cookie.encode(), self._cookie.encode())

    def guard(self, handler: Handler, *, page: bool = False) -> Handler:
        """Refuse requests without a login; for writes, also refuse other sites' forms (CSRF)."""

        async def guarded(request: web.Request) -> web.StreamResponse:
            if not self.allowed(request):
                if page:
                    raise web.HTTPFound("/login")
                return web.json_response({"error": "log in first (BOT_WEB_TOKEN)"}, status=401)
            if request.method == "POST":
                problem = _cross_site_problem(request)
                if problem:
                    return web.json_response({"error": problem}, status=403)
            return await handler(request)

        return guarded

    async def login_page(self, request: web.Request) -> web.Response:
        if self.token is None:
            raise web.HTTPFound("/")
        failed = request.query.get("failed") == "1"
        return web.Response(text=_LOGIN_HTML.replace("{{error}}", "Wrong token." if failed else ""),
                            content_type="text/html")

    async def login(self, request: web.Request) -> web.Response:
        if self.token is None or self._cookie is None:
            raise web.HTTPFound("/")
        form = await request.post()
        given = str(form.get("token", ""))
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            raise web.HTTPFound("/login?failed=1")
        response = web.HTTPFound("/")
        response.set_cookie(COOKIE, self._cookie, httponly=True, samesite="Strict", secure=self.secure_cookie,
                            max_age=30 * 24 * 3600)
        raise response


def _cross_site_problem(request: web.Request) -> str | None:
    if request.content_type != "application/json":
        return "send JSON (Content-Type: application/json)"
    origin = request.headers.get("Origin")
    if origin and urlsplit(origin).netloc != request.host:
        return "cross-site request refused"
    return None


_LOGIN_HTML = """<!doctype html><html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1"><title>Log in · bot</title>
<link rel="stylesheet" href="/static/app.css"></head>
<body class="login"><form method="post" action="/login" class="card">
<h1>Chat-ops bot</h1><p>This web chat is reachable from other machines, so it asks for the login token
(<code>BOT_WEB_TOKEN</code>).</p><p class="error">{{error}}</p>
<input type="password" name="token" placeholder="Login token" autocomplete="current-password" autofocus required>
<button type="submit">Log in</button></form></body></html>"""
