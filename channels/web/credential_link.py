"""``/credentials/<token>``: the one-time link page where no modal can be shown (SPEC §8).

Only over HTTPS or from this machine: the value typed here must not cross a network in clear.
"HTTPS" is the connection's own TLS, or ``X-Forwarded-Proto: https`` from a configured proxy
(BOT_TRUSTED_PROXIES). "This machine" is a loopback peer asking for a loopback Host, with no
forwarding headers: a proxy on this machine forwards clients from elsewhere. The page builds no
absolute URL, so ``X-Forwarded-Host`` is never needed.
"""

from __future__ import annotations

import html
import ipaddress
from collections.abc import Sequence

from aiohttp import web

from core.credentials import CredentialService, shown_reason
from core.model import CredentialRequestInfo

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_FORWARDING = ("Forwarded", "X-Forwarded-For", "X-Forwarded-Proto", "X-Forwarded-Host", "X-Real-IP")


class CredentialLinkPage:
    def __init__(self, credentials: CredentialService, *, trusted_proxies: Sequence[Network] = ()) -> None:
        self.credentials = credentials
        self.trusted_proxies = tuple(trusted_proxies)

    def routes(self) -> list[web.RouteDef]:
        return [web.get("/credentials/{token}", self._show), web.post("/credentials/{token}", self._submit)]

    async def _show(self, request: web.Request) -> web.Response:
        if not safe_transport(request, self.trusted_proxies):
            return _page("Not over a safe connection", _INSECURE, status=403)
        found, why = await self.credentials.check_link(request.match_info["token"])
        if found is None:
            return _page("Link not usable", f"<p>{html.escape(why)}</p>", status=410)
        return _page(f"Provide {found.name}", _form(found, ""))

    async def _submit(self, request: web.Request) -> web.Response:
        if not safe_transport(request, self.trusted_proxies):
            return _page("Not over a safe connection", _INSECURE, status=403)
        form = await request.post()
        value, hosts = str(form.get("value", "")), str(form.get("hosts", ""))
        result = await self.credentials.provide_via_link(request.match_info["token"], value, hosts=hosts)
        if result.stored:
            return _page("Stored", f"<p>{html.escape(result.message)} It will not be shown again. "
                                   "You can close this page.</p>")
        if result.field_error is not None and result.request is not None:
            return _page(f"Provide {result.request.name}", _form(result.request, result.field_error), status=400)
        return _page("Not stored", f"<p>{html.escape(result.message)}</p>", status=409)


def safe_transport(request: web.Request, trusted_proxies: Sequence[Network]) -> bool:
    """The value typed into this request's page cannot have crossed a network in clear."""
    if request.secure:  # TLS on this very connection (aiohttp does not read forwarding headers for it)
        return True
    peer = _peer(request)
    if peer is None:
        return False
    if any(name in request.headers for name in _FORWARDING):  # relayed: the real client may be anywhere
        if not any(peer in network for network in trusted_proxies):
            return False  # not a proxy we know: its headers may be forged
        # The nearest proxy appends to the list: what a client sent ahead of it is not believed.
        # Several header lines count as one list, in order.
        proto = ",".join(request.headers.getall("X-Forwarded-Proto", [])).rsplit(",", 1)[-1].strip().lower()
        return proto == "https"
    return peer.is_loopback and _is_loopback_host(request.headers.get("Host", ""))


def _peer(request: web.Request) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The TCP peer's address, from the socket (never from a header)."""
    peername = request.transport.get_extra_info("peername") if request.transport is not None else None
    if not isinstance(peername, tuple) or not peername:
        return None  # a Unix socket, or the connection is gone
    try:
        address = ipaddress.ip_address(str(peername[0]).split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _is_loopback_host(header: str) -> bool:
    """``localhost``, ``127.x.x.x`` or ``[::1]``, with or without a port."""
    host = header.strip().lower()
    if host.startswith("["):
        host = host[1:].partition("]")[0]
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    if host in ("localhost", "localhost."):
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
        f"<p>Reason given by the agent: <code>{html.escape(shown_reason(request.reason))}</code></p>"
        "<p>The value is visible while you type, then sealed: it is never shown again, never logged and "
        "never sent to the model.</p>"
        f'{message}<form method="post"><textarea name="value" rows="6" required aria-label="Value"></textarea>'
        '<label>Allowed hosts (comma-separated, optional: where this credential may be sent)'
        '<input name="hosts" type="text" autocomplete="off" placeholder="api.example.com, *.example.com">'
        '</label>'
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
