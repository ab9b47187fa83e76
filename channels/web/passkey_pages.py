"""``/passkeys/enrol/<token>`` and ``/passkeys/step-up/<token>``: the bot's own passkey pages (SPEC §17 ``step_up``).

``GET`` shows what the link is for and sets a cookie holding a random form token that the page also carries; the
page's script (``/passkeys/passkeys.js``: the CSP allows no inline script) posts JSON to ``…/options`` and
``…/finish`` with that token, so only this page can use the link (a double submit: another site's request has no
cookie, and ``Sec-Fetch-Site`` must say same-origin). Core makes and keeps the challenge, checks the origin and RP
id, and uses the link once. Like the credential link page, these work only over HTTPS or from this machine; the
token is in the path, never logged (the server keeps no access log, and core logs no token).
"""

from __future__ import annotations

import hashlib
import hmac
import html
import json
import secrets
from collections.abc import Sequence
from importlib import resources

from aiohttp import web

from channels.web.credential_link import INSECURE, Network, html_page, safe_transport
from core.passkeys import ENROL, STEP_UP
from core.step_up import LinkPage, StepUps

_KINDS = {"enrol": ENROL, "step-up": STEP_UP}
_TOKEN_MAX = 128
_BODY_MAX = 64 * 1024  # a WebAuthn answer is a few kilobytes


class PasskeyPages:
    def __init__(self, step_ups: StepUps, *, secure_cookie: bool, prefix: str = "",
                 trusted_proxies: Sequence[Network] = ()) -> None:
        self.step_ups = step_ups
        self.secure_cookie = secure_cookie
        self.cookie_path = f"{prefix}/passkeys/"  # where the browser sees these pages (BOT_PUBLIC_URL's path)
        self.trusted_proxies = tuple(trusted_proxies)

    def routes(self) -> list[web.RouteDef]:
        return [web.get("/passkeys/passkeys.js", self._script),
                web.get("/passkeys/{kind}/{token}", self._show),
                web.post("/passkeys/{kind}/{token}/options", self._options),
                web.post("/passkeys/{kind}/{token}/finish", self._finish)]

    async def _script(self, _request: web.Request) -> web.Response:
        text = resources.files("channels.web").joinpath("static", "passkeys.js").read_text(encoding="utf-8")
        return web.Response(text=text, content_type="text/javascript", headers={"Cache-Control": "no-cache"})

    async def _show(self, request: web.Request) -> web.Response:
        if not safe_transport(request, self.trusted_proxies):
            return html_page("Not over a safe connection", INSECURE, status=403)
        kind, token = _link(request)
        if kind is None:
            return html_page("Link not usable", "<p>This link is not valid.</p>", status=404)
        found = await self.step_ups.page(token, kind)
        if isinstance(found, str):
            return html_page("Link not usable", f"<p>{html.escape(found)}</p>", status=410)
        form = secrets.token_urlsafe(24)
        page = html_page(found.title, _body(found, request.match_info["kind"], form))
        page.set_cookie(_cookie(token), form, max_age=900, path=self.cookie_path, httponly=True,
                        samesite="Strict", secure=self.secure_cookie)
        return page

    async def _options(self, request: web.Request) -> web.Response:
        checked = await self._checked(request)
        if isinstance(checked, web.Response):
            return checked
        kind, token, _body_json = checked
        options = await self.step_ups.options(token, kind)
        if isinstance(options, str):
            return _json(410, message=options)
        return _json(200, options=options)

    async def _finish(self, request: web.Request) -> web.Response:
        checked = await self._checked(request)
        if isinstance(checked, web.Response):
            return checked
        kind, token, body = checked
        credential = body.get("credential")
        if not isinstance(credential, dict):
            return _json(400, message="No passkey answer was sent.")
        finished = await self.step_ups.finish(token, kind, credential)
        response = _json(200 if finished.ok else 410 if finished.gone else 409, message=finished.message)
        response.del_cookie(_cookie(token), path=self.cookie_path)
        return response

    async def _checked(self, request: web.Request) -> tuple[str, str, dict[str, object]] | web.Response:
        """A post from this link's own page: safe transport, same origin, JSON, the page's form token."""
        if not safe_transport(request, self.trusted_proxies):
            return _json(403, message="Only over HTTPS or from the bot's own machine.")
        kind, token = _link(request)
        if kind is None:
            return _json(404, message="This link is not valid.")
        if request.headers.get("Sec-Fetch-Site", "same-origin") != "same-origin" \
                or request.content_type != "application/json":
            return _json(403, message="This was not sent from the bot's own page.")
        raw = await request.content.read(_BODY_MAX + 1)
        if len(raw) > _BODY_MAX:
            return _json(413, message="Too large.")
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return _json(400, message="Not a JSON object.")
        posted, kept = body.get("form"), request.cookies.get(_cookie(token), "")
        if not isinstance(posted, str) or not posted or not kept or not hmac.compare_digest(posted, kept):
            return _json(403, message="This was not sent from the bot's own page: open your link again.")
        return kind, token, body


def _link(request: web.Request) -> tuple[str | None, str]:
    token = request.match_info["token"]
    kind = _KINDS.get(request.match_info["kind"])
    if not token or len(token) > _TOKEN_MAX:
        return None, token
    return kind, token


def _cookie(token: str) -> str:
    """One cookie per link, so two links open in one browser do not undo each other."""
    return "bot_passkey_" + hashlib.sha256(token.encode()).hexdigest()[:16]


def _json(status: int, **body: object) -> web.Response:
    return web.json_response(body, status=status, headers={"Cache-Control": "no-store"})


def _body(found: LinkPage, kind: str, form: str) -> str:
    call = (f"<p>The call in full:</p><pre><code>{html.escape(found.call)}</code></pre>"
            if found.call is not None else "")
    action = "Enrol a passkey" if found.kind == ENROL else "Confirm with my passkey"
    return (f'<div id="passkey" data-kind="{html.escape(kind)}" data-form="{html.escape(form)}">'
            f"<p>{html.escape(found.text)}</p>{call}"
            f'<button type="button" id="passkey-go">{action}</button>'
            '<p id="passkey-status" role="status"></p></div>'
            '<script src="../../passkeys/passkeys.js" defer></script>')
