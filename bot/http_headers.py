"""The headers every response of the bot's server carries (SPEC §17): no other site may frame a page of
the bot (the token-less web chat trusts this machine's browser, so a framed Approve button is a click
away from being approved by a page the operator happens to visit), nothing is sniffed into a script,
and no address leaks through a Referer. The policy is strict (``default-src 'self'``): the web chat
has no inline script or style."""

from __future__ import annotations

from collections.abc import Iterable

from aiohttp import web
from aiohttp.typedefs import Middleware

CONTENT_SECURITY_POLICY = ("default-src 'self'; frame-ancestors 'none'; base-uri 'none'; object-src 'none'")
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


async def _add_security_headers(_request: web.Request, response: web.StreamResponse) -> None:
    # On the response as it is sent: handlers, middlewares' refusals, raised HTTP errors and aiohttp's
    # own 404/405/500 pages alike. A handler's own stricter value is not replaced.
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)


def server_app(middlewares: Iterable[Middleware] = ()) -> web.Application:
    """The bot's aiohttp application, with the security headers on every response it sends."""
    app = web.Application(middlewares=list(middlewares))
    app.on_response_prepare.append(_add_security_headers)
    return app
