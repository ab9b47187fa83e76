"""Whether a request comes from a program on this machine talking to us directly.

One rule for everything that trusts "this machine": the web chat without a token (auth.py), ``/metrics``
(bot/metrics.py) and the credential link page (credential_link.py). It holds when
- the TCP peer is a loopback address (from the socket, never from a header);
- no header says the request was relayed: a proxy on this host forwards clients from anywhere;
- the request line names a path, not a whole URL (``GET http://evil.example/ HTTP/1.1`` is spoken to
  proxies);
- ``Host`` is ``localhost``, ``127.0.0.1`` or ``[::1]`` with the port this connection reached (a DNS-rebinding
  page says ``Host: attacker.example``).
"""

from __future__ import annotations

import ipaddress

from aiohttp import web

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

# Headers proxies, load balancers and CDNs add, or that name another client or host. Generous on purpose:
# a local browser sends none of them.
_RELAY_NAMES = frozenset({"via", "client-ip", "x-client-ip", "true-client-ip", "cf-connecting-ip",
                          "x-cluster-client-ip", "x-host", "fastly-client-ip", "x-proxyuser-ip"})
_RELAY_PREFIXES = ("x-forwarded", "x-original", "x-real-ip", "forwarded")
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


def is_relay_header(name: str) -> bool:
    """A header a proxy adds (``X-Forwarded-For``, ``Via``, ``X-Original-Host``, ``CF-Connecting-IP``, ...)."""
    lower = name.strip().lower()
    return lower in _RELAY_NAMES or lower.startswith(_RELAY_PREFIXES)


def relayed(request: web.Request) -> bool:
    """Whether any header says a proxy relayed this request."""
    return any(is_relay_header(name) for name in request.headers)


def peer_address(request: web.Request) -> Address | None:
    """The TCP peer's address, from the socket (request.remote could be rewritten by a middleware)."""
    peer = request.transport.get_extra_info("peername") if request.transport is not None else None
    if not isinstance(peer, tuple) or not peer:
        return None  # a Unix socket, or the connection is gone
    try:
        ip = ipaddress.ip_address(str(peer[0]).split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped  # a dual-stack listener sees 127.0.0.1 as ::ffff:127.0.0.1
    return ip


def loopback_host(request: web.Request) -> str | None:
    """The Host header if it names this machine's loopback at the port this connection reached."""
    hosts = request.headers.getall("Host", [])
    sock = request.transport.get_extra_info("sockname") if request.transport is not None else None
    if len(hosts) != 1 or not isinstance(sock, tuple) or len(sock) < 2:
        return None
    port, host = int(sock[1]), hosts[0].lower()
    allowed = {f"{name}:{port}" for name in _LOOPBACK_NAMES}
    if port == 80:  # browsers leave the default port out
        allowed.update(_LOOPBACK_NAMES)
    return host if host in allowed else None


def origin_form(request: web.Request) -> bool:
    """The request line names a path (``GET /x``), not a whole URL, ``*`` or an authority."""
    return request.raw_path.startswith("/")


def local_problem(request: web.Request) -> str | None:
    """Why this request is not from a program on this machine talking to us directly, or None."""
    peer = peer_address(request)
    if peer is None or not peer.is_loopback:
        return "the request does not come from this machine"
    if relayed(request):
        return "the request was relayed by a proxy"
    if not origin_form(request):
        return "the request line names a whole URL, as a client does to a proxy"
    if loopback_host(request) is None:
        return "the Host header is not localhost, 127.0.0.1 or [::1] with this server's port"
    return None
