"""``/credentials/<token>``: the one-time link page where no modal can be shown (SPEC §8).

Only over HTTPS or from this machine: the value typed here must not cross a network in clear.
"HTTPS" is the connection's own TLS, or ``X-Forwarded-Proto: https`` from a configured proxy
(BOT_TRUSTED_PROXIES). "This machine" is the web chat's rule (channels/web/local.py): a loopback peer
asking for a loopback Host with our port, in a path-only request line, with no header a proxy adds (a
proxy on this machine forwards clients from elsewhere). The page builds no absolute URL, so
``X-Forwarded-Host`` is never needed.
"""

from __future__ import annotations

import html
import ipaddress
from collections.abc import Sequence

from aiohttp import web

from channels.web.local import local_problem, peer_address, relayed
from core.credential_links import CredentialLinks
from core.display import shown_reason
from core.model import CredentialRequestInfo

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class CredentialLinkPage:
    def __init__(self, links: CredentialLinks, *, trusted_proxies: Sequence[Network] = ()) -> None:
        self.links = links
        self.trusted_proxies = tuple(trusted_proxies)

    def routes(self) -> list[web.RouteDef]:
        return [web.get("/credentials/{token}", self._show), web.post("/credentials/{token}", self._submit)]

    async def _show(self, request: web.Request) -> web.Response:
        if not safe_transport(request, self.trusted_proxies):
            return html_page("Not over a safe connection", INSECURE, status=403)
        found, why = await self.links.check_link(request.match_info["token"])
        if found is None:
            return html_page("Link not usable", f"<p>{html.escape(why)}</p>", status=410)
        return html_page(f"Provide {found.name}", _form(found, ""))

    async def _submit(self, request: web.Request) -> web.Response:
        if not safe_transport(request, self.trusted_proxies):
            return html_page("Not over a safe connection", INSECURE, status=403)
        form = await request.post()
        value, hosts = str(form.get("value", "")), str(form.get("hosts", ""))
        result = await self.links.provide_via_link(request.match_info["token"], value, hosts=hosts)
        if result.stored:
            return html_page("Stored", f"<p>{html.escape(result.message)} It will not be shown again. "
                                   "You can close this page.</p>")
        if result.field_error is not None and result.request is not None:
            return html_page(f"Provide {result.request.name}", _form(result.request, result.field_error), status=400)
        return html_page("Not stored", f"<p>{html.escape(result.message)}</p>", status=409)


def safe_transport(request: web.Request, trusted_proxies: Sequence[Network]) -> bool:
    """The value typed into this request's page cannot have crossed a network in clear."""
    if request.secure:  # TLS on this very connection (aiohttp does not read forwarding headers for it)
        return True
    peer = peer_address(request)
    if peer is None:
        return False
    if relayed(request):  # the real client may be anywhere
        if not any(peer in network for network in trusted_proxies):
            return False  # not a proxy we know: its headers may be forged
        # The nearest proxy appends to the list: what a client sent ahead of it is not believed.
        # Several header lines count as one list, in order.
        proto = ",".join(request.headers.getall("X-Forwarded-Proto", [])).rsplit(",", 1)[-1].strip().lower()
        return proto == "https"
    return local_problem(request) is None


def _form(request: CredentialRequestInfo, error: str) -> str:
    message = f'<p class="error">{html.escape(error)}</p>' if error else ""
    return (
        f"<p>The agent <strong>{html.escape(request.agent)}</strong> asks for "
        f"<code>{html.escape(request.name)}</code> ({html.escape(request.scope)} scope).</p>"
        f"<p>Reason given by the agent: <code>{html.escape(shown_reason(request.reason))}</code></p>"
        "<p>The value is visible while you type, then sealed: it is never shown again, never logged and "
        "never sent to the model.</p>"
        f'{message}<form method="post"><textarea name="value" rows="6" required aria-label="Value"></textarea>'
        '<label>Allowed hosts (comma-separated, optional: where this credential may be sent)'
        '<input name="hosts" type="text" autocomplete="off" placeholder="api.example.com, *.example.com">'
        '</label>'
        '<button type="submit">Store</button></form>'
    )


def html_page(title: str, body: str, *, status: int = 200) -> web.Response:
    text = (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><title>{html.escape(title)}</title>'
            f'<link rel="stylesheet" href="/static/app.css"></head><body class="login"><main class="card">'
            f"<h1>{html.escape(title)}</h1>{body}</main></body></html>")
    return web.Response(text=text, content_type="text/html", status=status,
                        headers={"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"})


INSECURE = ("<p>This page only works over HTTPS or from the bot's own machine, so that the value never "
             "crosses a network in clear.</p>")
