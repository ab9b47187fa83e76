"""Where ``http_request`` may connect: public addresses only, and never this bot's own listener (no
setting lifts that: HTTP_ALLOW_PRIVATE and HTTP_ALLOW_HOSTS open other local services, not the bot itself).

The rule is enforced where aiohttp connects, on the address actually used:
- a resolver drops refused addresses from every DNS answer (it knows the host name, for HTTP_ALLOW_HOSTS
  and for a clear message);
- a socket factory checks the exact address each socket is about to connect to (IP literals never reach
  the resolver). No second lookup happens between the two, so DNS rebinding gains nothing.
Proxies from the environment are never used (``trust_env=False``): they would connect for us.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp.abc import AbstractCookieJar, AbstractResolver, ResolveResult

from bot.errors import EgressRefused
from core.hosts import normalize_host

if TYPE_CHECKING:
    from bot.settings import Settings

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_V4_COMPATIBLE = ipaddress.ip_network("::/96")
_PRIVATE = tuple(ipaddress.ip_network(n) for n in
                 ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7", "fec0::/10"))
# Special-purpose space named here rather than left to ipaddress, whose answer depends on the Python release
# (before 3.11.10 / 3.12.4, 192.0.0.0/24 — including 192.0.0.9 and .10, anycast services — counted as global).
_SPECIAL = tuple(ipaddress.ip_network(n) for n in (
    "0.0.0.0/8", "192.0.0.0/24", "192.0.2.0/24", "198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24",
    "240.0.0.0/4", "100::/64", "2001::/23", "2001:db8::/32", "3fff::/20", "64:ff9b:1::/48", "5f00::/16"))
_METADATA = {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")}
# What inet_aton reads as an IPv4 address: 2130706433, 0x7f.1, 127.1, 017700000001.
_NUMERIC_HOST = re.compile(r"[0-9][0-9a-fA-FxX.]*")


def literal_address(host: str) -> Address | None:
    """The address a URL's host denotes without DNS, including the old numeric IPv4 spellings."""
    bare = host.strip("[]").rstrip(".")
    try:
        return ipaddress.ip_address(bare)
    except ValueError:
        pass
    if _NUMERIC_HOST.fullmatch(bare):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(bare))
        except OSError:
            return None
    return None


def embedded_ipv4(ip: Address) -> Address:
    """The IPv4 address an IPv6 form carries (mapped, compatible, NAT64, 6to4), else ``ip`` itself."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip.sixtofour is not None:
            return ip.sixtofour
        if ip in _NAT64 or (ip in _V4_COMPATIBLE and int(ip) > 1):  # ::, ::1 are IPv6's own
            return ipaddress.IPv4Address(int(ip) & 0xFFFF_FFFF)
    return ip


def non_public(ip: Address) -> str | None:
    """Why ``ip`` is not a public address ("a loopback address"), or None."""
    ip = embedded_ipv4(ip)
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_unspecified:
        return "an unspecified address (this machine)"
    if ip in _METADATA:
        return "a link-local address (cloud metadata)"
    if ip.is_link_local:
        return "a link-local address"
    if ip.is_multicast:
        return "a multicast address"
    if ip in _CGNAT:
        return "a shared address (carrier-grade NAT)"
    if any(ip in net for net in _PRIVATE):
        return "a private address"
    if any(ip in net for net in _SPECIAL):
        return "a special-purpose address (IANA)"
    if ip.is_private or ip.is_reserved or not ip.is_global:
        return "a non-public address"
    return None


def is_this_machine(ip: Address) -> bool:
    """Whether ``ip`` is one of this machine's addresses (a socket can be bound to it)."""
    ip = embedded_ipv4(ip)
    if ip.is_loopback or ip.is_unspecified:
        return True
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind((str(ip), 0))
    except OSError:
        return False
    return True


def _hint(host: str) -> str:
    listed = normalize_host(host)
    return f"[{listed}]" if ":" in listed else listed


@dataclass
class EgressPolicy:
    allow_private: bool = False
    allow_hosts: tuple[str, ...] = ()
    # The port this bot listens on (known once it listens: PORT=0 picks one); None: unknown.
    own_port: Callable[[], int | None] = field(default=lambda: None)

    @classmethod
    def from_settings(cls, settings: Settings, *, own_port: Callable[[], int | None] | None = None) -> EgressPolicy:
        """``own_port``: the port actually bound, asked at each request (PORT=0 picks one at start)."""
        return cls(allow_private=settings.http_allow_private, allow_hosts=settings.allowed_http_hosts,
                   own_port=own_port or (lambda: settings.port or None))

    def host_listed(self, host: str) -> bool:
        return normalize_host(host) in {normalize_host(h) for h in self.allow_hosts}

    def refusal(self, host: str, address: str, port: int) -> str | None:
        """Why connecting to ``address``:``port`` for ``host`` is refused, or None."""
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return f"http_request refused: {host} resolves to {address!r}, which is not an IP address"
        real = embedded_ipv4(ip)  # ::ffff:127.0.0.1 is 127.0.0.1
        where = f"{host} is" if normalize_host(host) == str(real) else f"{host} resolves to {real},"
        # First, and whatever the settings: the bot's own API trusts a caller on this machine (the web chat
        # without a token), so the model calling it could approve its own requests.
        if port == self.own_port() and is_this_machine(ip):
            return f"http_request refused: {where} this bot's own listener (port {port}); the bot never calls itself"
        if self.allow_private or self.host_listed(host):
            return None
        why = non_public(ip)
        if why is None:
            return None
        return f"http_request refused: {where} {why}; set HTTP_ALLOW_HOSTS={_hint(host)} to allow it"

    def check_literal(self, host: str, port: int) -> None:
        """Refuse an address written in the URL before connecting (the connect-time check would too)."""
        ip = literal_address(host)
        if ip is not None and (why := self.refusal(host, str(ip), port)) is not None:
            raise EgressRefused(why)

    def socket_factory(self, host: str) -> Callable[[Any], socket.socket]:
        """For aiohttp's connector: refuse, at the last moment, a socket to an address the rule forbids."""
        def make(addr_info: Any) -> socket.socket:
            family, type_, proto, _, sockaddr = addr_info
            why = self.refusal(host, str(sockaddr[0]), int(sockaddr[1]))
            if why is not None:
                raise EgressRefused(why)
            return socket.socket(family=family, type=type_, proto=proto)

        return make

    def session(self, host: str, *, timeout: aiohttp.ClientTimeout, ssl_context: ssl.SSLContext | None = None,
                cookie_jar: AbstractCookieJar | None = None) -> aiohttp.ClientSession:
        """A client session that can only reach what this policy allows, for requests to ``host``."""
        connector = aiohttp.TCPConnector(
            resolver=_CheckedResolver(self, aiohttp.ThreadedResolver()), use_dns_cache=False,
            socket_factory=self.socket_factory(host), ssl=ssl_context if ssl_context is not None else True,
        )
        return aiohttp.ClientSession(connector=connector, timeout=timeout, trust_env=False, cookie_jar=cookie_jar)


class _CheckedResolver(AbstractResolver):
    """Resolves as usual, then keeps only the addresses the policy allows for that name."""

    def __init__(self, policy: EgressPolicy, inner: AbstractResolver) -> None:
        self._policy = policy
        self._inner = inner

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        kept: list[ResolveResult] = []
        refused: list[str] = []
        for result in await self._inner.resolve(host, port, family):
            why = self._policy.refusal(host, result["host"], port)
            if why is None:
                kept.append(result)
            else:
                refused.append(why)
        if not kept:
            raise EgressRefused(refused[0] if refused else f"{host} did not resolve to any address")
        return kept

    async def close(self) -> None:
        await self._inner.close()
