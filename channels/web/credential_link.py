"""``/credentials/<token>``: the one-time link page where no modal can be shown (SPEC §8).

Only over HTTPS or from this machine: the value typed here must not cross a network in clear.
"""

from __future__ import annotations

import html
import ipaddress

from aiohttp import web

from core.credentials import CredentialService
from core.model import CredentialRequestInfo


class CredentialLinkPage:
    def __init__(self, credentials: CredentialService) -> None:
        self.credentials = credentials

    def routes(self) -> list[web.RouteDef]:
        return [web.get("/credentials/{token}", self._show), web.post("/credentials/{token}", self._submit)]

    async def _show(self, request: web.Request) -> web.Response:
        if not _safe_transport(request):
            return _page("Not over a safe connection", _INSECURE, status=403)
        found, why = await self.credentials.check_link(request.match_info["token"])
        if found is None:
            return _page("Link not usable", f"<p>{html.escape(why)}</p>", status=410)
        return _page(f"Provide {found.name}", _form(found, ""))

    async def _submit(self, request: web.Request) -> web.Response:
        if not _safe_transport(request):
            return _page("Not over a safe connection", _INSECURE, status=403)
        form = await request.post()
        value = str(form.get("value", ""))
        result = await self.credentials.provide_via_link(request.match_info["token"], value)
        if result.stored:
            return _page("Stored", f"<p>{html.escape(result.message)} It will not be shown again. "
                                   "You can close this page.</p>")
        if result.field_error is not None and result.request is not None:
            return _page(f"Provide {result.request.name}", _form(result.request, result.field_error), status=400)
        return _page("Not stored", f"<p>{html.escape(result.message)}</p>", status=409)


def _safe_transport(request: web.Request) -> bool:
    if request.secure or request.headers.get("X-Forwarded-Proto", "").lower() == "https":
        return True
    host = (request.host or "").rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _form(request: CredentialRequestInfo, error: str) -> str:
    message = f'<p class="error">{html.escape(error)}</p>' if error else ""
    return (
        f"<p>The agent <strong>{html.escape(request.agent)}</strong> asks for "
        f"<code>{html.escape(request.name)}</code> ({html.escape(request.scope)} scope).</p>"
        f"<p>Reason: {html.escape(request.reason)}</p>"
        "<p>The value is visible while you type, then sealed: it is never shown again, never logged and "
        "never sent to the model.</p>"
        f'{message}<form method="post"><textarea name="value" rows="6" required aria-label="Value"></textarea>'
        '<button type="submit">Store</button></form>'
    )


def _page(title: str, body: str, *, status: int = 200) -> web.Response:
    text = (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><title>{html.escape(title)}</title>'
            f'<link rel="stylesheet" href="/static/app.css"></head><body class="login"><main class="card">'
            f"<h1>{html.escape(title)}</h1>{body}</main></body></html>")
    return web.Response(text=text, content_type="text/html", status=status,
                        headers={"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"})


_INSECURE = ("<p>This page only works over HTTPS or from the bot's own machine, so that the value never "
             "crosses a network in clear.</p>")
