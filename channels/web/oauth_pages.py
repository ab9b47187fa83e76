"""``/oauth/start`` and ``/oauth/callback`` (SPEC §16): the browser's side of connecting an account.

``GET /oauth/start?state=…`` is the personal link a person got (in Slack, privately; in the web chat, from
their own page). It only shows what it connects and for whom, so a link checker's visit uses nothing and
someone handed another person's link can see it is not theirs; **Continue** (a POST) opens it once, sets
a cookie that binds this browser to the state and sends the browser to the provider. ``/oauth/callback``
comes back with the code; core checks the state and the cookie and says what happened. Like the
credential link page, these work only over HTTPS (or from this machine); nothing here builds a URL from
the request's ``Host``.
"""

from __future__ import annotations

import hashlib
import hmac
import html
import secrets
from collections.abc import Sequence

from aiohttp import web

from channels.web.credential_link import INSECURE, Network, html_page, safe_transport
from core.gateway import CallbackResult, Gateway

_STATE_MAX = 256
_FORM_COOKIE = "bot_oauth_form"


class OAuthPages:
    def __init__(self, gateway: Gateway, *, secure_cookie: bool, prefix: str = "",
                 trusted_proxies: Sequence[Network] = ()) -> None:
        self.gateway = gateway
        self.secure_cookie = secure_cookie
        # Where the browser sees these pages (BOT_PUBLIC_URL's path in front): the cookies' paths.
        self.cookie_path = f"{prefix}/oauth/callback"
        self.start_path = f"{prefix}/oauth/start"
        self.trusted_proxies = tuple(trusted_proxies)

    def routes(self) -> list[web.RouteDef]:
        return [web.get("/oauth/start", self._show), web.post("/oauth/start", self._start),
                web.get("/oauth/callback", self._callback)]

    async def _show(self, request: web.Request) -> web.Response:
        if not safe_transport(request, self.trusted_proxies):
            return html_page("Not over a safe connection", INSECURE, status=403)
        state = request.query.get("state", "")
        if not state or len(state) > _STATE_MAX:
            return html_page("Link not usable", "<p>This link is incomplete.</p>", status=400)
        preview = await self.gateway.preview_consent(state)
        if isinstance(preview, CallbackResult):
            return _result(preview)
        name, who = html.escape(preview.connection), html.escape(preview.principal)
        use = (f"It is shared: the agent acts as this account for everyone. The link was made for <code>{who}</code>."
               if preview.shared else
               f"The agent will act as you on {name} in conversations of <code>{who}</code>, the person this link "
               "was made for.")
        form_token = secrets.token_urlsafe(24)
        body = (f"<p>This connects <strong>your</strong> {name} account to the bot. {use}</p>"
                f"<p>Continue only if you are <code>{who}</code>. If someone sent you this link, close this page: "
                "whoever continues connects their own account in that person's place.</p>"
                f'<form method="post" action="start"><input type="hidden" name="state" value="{html.escape(state)}">'
                f'<input type="hidden" name="form" value="{form_token}">'
                f'<button type="submit">Continue to {name}</button></form>')
        page = html_page(f"Connect {preview.connection}", body)
        # Double submit: only this page can post the form (another site's auto-submitted form has no cookie).
        page.set_cookie(_FORM_COOKIE, form_token, max_age=900, path=self.start_path, httponly=True,
                        samesite="Strict", secure=self.secure_cookie)
        return page

    async def _start(self, request: web.Request) -> web.StreamResponse:
        if not safe_transport(request, self.trusted_proxies):
            return html_page("Not over a safe connection", INSECURE, status=403)
        form = await request.post()
        state = str(form.get("state", ""))
        if not state or len(state) > _STATE_MAX:
            return html_page("Link not usable", "<p>This link is incomplete.</p>", status=400)
        posted, kept = str(form.get("form", "")), request.cookies.get(_FORM_COOKIE, "")
        if (request.headers.get("Sec-Fetch-Site", "same-origin") not in ("same-origin", "none")
                or not posted or not hmac.compare_digest(posted, kept)):
            return html_page("Not connected", "<p>This form was not sent from the bot's own page. Open your "
                                              "Connect link again.</p>", status=403)
        opened = await self.gateway.open_consent(state)
        if isinstance(opened, CallbackResult):
            return _result(opened)
        response = web.HTTPSeeOther(opened.location, headers={"Cache-Control": "no-store",
                                                              "Referrer-Policy": "no-referrer"})
        response.set_cookie(_cookie(state), opened.binding, max_age=900, path=self.cookie_path, httponly=True,
                            samesite="Lax", secure=self.secure_cookie)
        raise response

    async def _callback(self, request: web.Request) -> web.Response:
        if not safe_transport(request, self.trusted_proxies):
            return html_page("Not over a safe connection", INSECURE, status=403)
        state = request.query.get("state", "")[:_STATE_MAX]
        binding = request.cookies.get(_cookie(state), "") if state else ""
        result = await self.gateway.finish_consent(state=state, code=request.query.get("code", ""),
                                                   error=request.query.get("error", "")[:100], binding=binding)
        response = _result(result)
        if state:
            response.del_cookie(_cookie(state), path=self.cookie_path)
        return response


def _cookie(state: str) -> str:
    """One cookie per link, so two links opened in one browser do not undo each other."""
    return "bot_oauth_" + hashlib.sha256(state.encode()).hexdigest()[:16]


def _result(result: CallbackResult) -> web.Response:
    return html_page(result.title, f"<p>{html.escape(result.message)}</p>", status=result.status)
