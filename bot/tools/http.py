"""``http_request``: one HTTP call with a timeout and a size cap, under the egress policy (bot/egress.py).

Redirects are followed only on the same host, port and scheme (or an upgrade from http to https);
any other redirect is reported, not followed. So a credential is never re-sent to another host, nor in
clear text after an https → http redirect. A credential limited to some hosts is refused elsewhere.
A credential goes over plain http only to a host the operator listed in HTTP_ALLOW_HOSTS (declared
internal), and the model cannot set ``Host``: the URL's host is the one the server sees.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
from yarl import URL

from bot.egress import EgressPolicy
from bot.errors import EgressRefused
from core.connections.spec import ConnectionSpec
from core.errors import ToolError
from core.hosts import normalize_host
from core.stored_secrets import CredentialUse
from core.tools import Risk, Tool, ToolContext

METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"]
MAX_REDIRECTS = 5
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110 field-name
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # all but horizontal tab
# Opens a credential by name for this call only: the headers it adds and the hosts it may go to.
CredentialHeaders = Callable[[ToolContext, str], Awaitable[CredentialUse]]


class ConnectionAccess(Protocol):
    """core.connections.ConnectionService, as this tool uses it."""

    def spec(self, name: str) -> ConnectionSpec: ...
    async def use(self, ctx: ToolContext, name: str, *, need_scopes: tuple[str, ...] = (),
                  rejected: str | None = None) -> CredentialUse: ...


def header_problem(headers: dict[str, str], *, shown: bool = True) -> str | None:
    """Why these headers cannot be sent as given, or None. ``shown``: the values may be quoted (not a
    credential's)."""
    for name, value in headers.items():
        if not _TOKEN.fullmatch(name):
            quoted = repr(name) if shown else "its header name"
            return f"header name {quoted} is not a valid HTTP header name (letters, digits and !#$%&'*+-.^_`|~)"
        if name.lower() == "host":
            # Another Host would reach another site behind the same address (domain fronting), with
            # a credential limited to the URL's host, or past HTTP_ALLOW_HOSTS.
            return ("header Host is set from the URL; remove the Host header and put the host you mean in the "
                    "URL")
        if _CONTROL.search(value):
            # CR/LF would end the header and start another one (header injection).
            return f"header {name} holds a line break or another control character, which HTTP does not allow"
    return None


def redirect_refusal(current: URL, target: URL) -> str | None:
    """Why a redirect from ``current`` to ``target`` is not followed, or None to follow it."""
    if target.scheme not in ("http", "https") or not target.raw_host:
        return "redirected to a non-http URL"
    if normalize_host(target.raw_host) != normalize_host(current.raw_host or ""):
        return "redirected to another host"
    if current.scheme == "https" and target.scheme == "http":
        return "redirected from https to http (the request would travel in clear)"
    if target.port != current.port and not (current.scheme == "http" and target.scheme == "https"):
        return "redirected to another port"
    if target.raw_user is not None or target.raw_password is not None:
        return "redirected to a URL with a user name or password in it (it would be sent as Authorization)"
    return None


def http_request_tool(*, timeout_s: float = 30, max_bytes: int = 1_000_000,
                      credential_headers: CredentialHeaders | None = None, egress: EgressPolicy | None = None,
                      ssl_context: ssl.SSLContext | None = None, connections: ConnectionAccess | None = None,
                      connection_wait_s: float = 1800) -> Tool:
    """``egress``: where it may connect (default: public addresses only). ``ssl_context``: the https trust
    roots (default: the system's). ``connections``: OAuth connections' tokens (a gap pauses the call for up
    to ``connection_wait_s``, at most twice: a missing account, then a missing scope)."""
    policy = egress or EgressPolicy()

    async def http_request(ctx: ToolContext, args: dict[str, Any]) -> str:
        method = str(args["method"]).upper()
        try:
            url = URL(str(args["url"]))  # parsed once, as aiohttp would: the host checked is the host used
        except ValueError:
            raise ToolError("url is not a valid URL") from None
        if url.scheme not in ("http", "https") or not url.raw_host:
            raise ToolError("url must be an absolute http:// or https:// URL")
        if url.raw_user is not None or url.raw_password is not None:
            # aiohttp would send it as an Authorization header that no policy rule saw (core.policies: headers)
            raise ToolError("http_request refused: the url carries a user name or password (user:password@host); "
                            "name a stored credential with credential=NAME instead")
        headers = {str(k): str(v) for k, v in (args.get("headers") or {}).items()}
        if (problem := header_problem(headers)) is not None:
            raise ToolError(f"http_request refused: {problem}")
        name = str(args.get("credential") or "")
        connection = str(args.get("connection") or "")
        if name and connection:
            raise ToolError("give either credential or connection, not both")
        if connection and any(h.lower() == "authorization" for h in headers):
            raise ToolError("the connection sets the Authorization header; remove yours")
        credential: CredentialUse | None = None
        if name:
            if credential_headers is None:
                raise ToolError(f"credential {name!r} is not available: no credential store here")
            credential = await credential_headers(ctx, name)
            if (problem := header_problem(credential.headers, shown=False)) is not None:
                raise ToolError(f"http_request refused: credential {name}: {problem}; store it again "
                                "(bot credentials set)")
        elif connection:
            if connections is None:
                raise ToolError(f"connection {connection!r} is not available: no connections are configured")
            name = connection
            _check_destination(url, connection, connections.spec(connection).allows, "connection")
            credential = _checked(connection, await connections.use(ctx, connection))
        sent = Sent(method, url, headers, args.get("body"), name)
        status, challenge, text = await _send(sent, credential, policy, timeout_s, max_bytes, ssl_context)
        if connection and connections is not None and credential is not None:
            if status == 401:  # the token was refused: one refresh, one retry
                token = credential.headers.get("Authorization", "").removeprefix("Bearer ")
                credential = _checked(connection, await connections.use(ctx, connection, rejected=token))
                status, challenge, text = await _send(sent, credential, policy, timeout_s, max_bytes, ssl_context)
            elif status == 403 and (needed := insufficient_scope(challenge)) is not None:
                credential = _checked(connection, await connections.use(ctx, connection, need_scopes=needed))
                status, challenge, text = await _send(sent, credential, policy, timeout_s, max_bytes, ssl_context)
        return text

    return Tool(
        name="http_request",
        description=("Make one HTTP request and return the status, main headers and body. A person must "
                     "approve it. Only public addresses can be reached unless the operator allows more."),
        parameters={
            "type": "object",
            "properties": {
                "method": {"type": "string", "enum": METHODS},
                "url": {"type": "string", "description": "absolute http(s) URL"},
                "headers": {"type": "object", "additionalProperties": {"type": "string"}},
                "body": {"type": "string"},
                "credential": {"type": "string", "description": "name of a stored credential to authenticate with"},
                "connection": {"type": "string", "description": (
                    "name of an OAuth connection (bot.toml [[connections]]) whose token is sent as a Bearer "
                    "token; if it is not connected yet, the person is asked to connect it and the call waits")},
            },
            "required": ["method", "url"],
            "additionalProperties": False,
        },
        risk=Risk.GATED,
        function=http_request,
        # Up to three sends (the call, a retry after a refresh or a consent), and the consent waits: a pause
        # must end by its own expiry, never by this timeout (which would leave its request pending).
        timeout_s=(timeout_s * (MAX_REDIRECTS + 1) + 5) * (3 if connections else 1)
        + (2 * connection_wait_s + 60 if connections else 0),
        pattern_arg="url",
    )


@dataclass(frozen=True)
class Sent:
    method: str
    url: URL
    headers: dict[str, str]
    body: Any
    credential: str  # its name ("" for none)


async def _send(request: Sent, credential: CredentialUse | None, policy: EgressPolicy, timeout_s: float,
                max_bytes: int, ssl_context: ssl.SSLContext | None) -> tuple[int, str, str]:
    """One request and its same-host redirects: the status, the ``WWW-Authenticate`` header, the result text."""
    method, url, body, name = request.method, request.url, request.body, request.credential
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    jar = aiohttp.CookieJar()
    notes: list[str] = []
    for _hop in range(MAX_REDIRECTS + 1):
        host, port = url.raw_host or "", url.port or 0
        sent = dict(request.headers)
        if credential is not None:
            if not credential.allows(host):
                raise ToolError(f"http_request refused: credential {name} may only be sent to "
                                f"{', '.join(credential.hosts or ())}, not {host}")
            if url.scheme == "http" and not policy.host_listed(host):
                raise ToolError(f"http_request refused: credential {name} is not sent over plain http to "
                                f"{host} (anyone on the way could read it); use https, or the operator can "
                                f"declare {host} internal in HTTP_ALLOW_HOSTS")
            sent.update(credential.headers)
        try:
            policy.check_literal(host, port)
            async with (policy.session(host, timeout=timeout, ssl_context=ssl_context, cookie_jar=jar) as http,
                        http.request(method, url, headers=sent, data=body, allow_redirects=False) as resp):
                challenge = resp.headers.get("WWW-Authenticate", "")
                location = resp.headers.get("Location")
                if resp.status in (301, 302, 303, 307, 308) and location:
                    try:
                        target = url.join(URL(location))
                    except ValueError:
                        notes.append(f"redirected to an invalid URL, not followed: {location}")
                        return resp.status, challenge, _render(resp.status, resp.headers, b"", 0, notes)
                    why = redirect_refusal(url, target)
                    if why is not None:
                        notes.append(f"{why}, not followed: {target}")
                        return resp.status, challenge, _render(resp.status, resp.headers, b"", 0, notes)
                    notes.append(f"followed redirect to {target}")
                    if resp.status == 303 or (resp.status in (301, 302) and method == "POST"):
                        method, body = "GET", None
                    url = target
                    continue
                raw = await resp.content.read(max_bytes + 1)
                return resp.status, challenge, _render(resp.status, resp.headers, raw[:max_bytes], len(raw), notes)
        except EgressRefused as exc:
            raise ToolError(str(exc)) from None
        except TimeoutError:
            raise ToolError(f"{method} {url} timed out after {timeout_s:g} s") from None
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, EgressRefused):
                raise ToolError(str(exc.os_error)) from None
            raise ToolError(f"{method} {url} failed: {type(exc).__name__}: {exc}") from None
        except aiohttp.ClientError as exc:
            raise ToolError(f"{method} {url} failed: {type(exc).__name__}: {exc}") from None
    raise ToolError(f"more than {MAX_REDIRECTS} redirects")


def _check_destination(url: URL, name: str, allows: Callable[[str], bool], what: str) -> None:
    """Refused before anything is asked (no consent for a call that could never send the token)."""
    if not allows(url.raw_host or ""):
        raise ToolError(f"http_request refused: {what} {name}'s token may not be sent to {url.raw_host} (see its "
                        "hosts in bot.toml)")


def _checked(name: str, use: CredentialUse) -> CredentialUse:
    if (problem := header_problem(use.headers, shown=False)) is not None:
        raise ToolError(f"http_request refused: connection {name}: {problem}; reconnect it")
    return use


_SCOPE_PARAM = re.compile(r'scope="([^"]*)"')
_SCOPE_TOKEN = re.compile(r"[\x21\x23-\x5b\x5d-\x7e]{1,100}")  # RFC 6749 §3.3 scope-token
MAX_SCOPES = 10


def insufficient_scope(challenge: str) -> tuple[str, ...] | None:
    """The scopes a ``Bearer error="insufficient_scope"`` challenge names (RFC 6750 §3.1), else None. A
    resource's words go into a message, a consent URL and the database: anything but a short list of
    proper scope tokens is not taken as a request for consent (the 403 is reported as it is)."""
    if not challenge.lower().lstrip().startswith("bearer") or 'error="insufficient_scope"' not in challenge:
        return None
    found = _SCOPE_PARAM.search(challenge)
    scopes = tuple(found.group(1).split()) if found else ()
    if len(scopes) > MAX_SCOPES or not all(_SCOPE_TOKEN.fullmatch(scope) for scope in scopes):
        return None
    return scopes


def _render(status: int, headers: Any, body: bytes, total: int, notes: list[str]) -> str:
    lines = [f"HTTP {status}"]
    for name in ("Content-Type", "Content-Length", "Location"):
        if name in headers:
            lines.append(f"{name}: {headers[name]}")
    lines += [f"({note})" for note in notes]
    text = body.decode("utf-8", errors="replace")
    if total > len(body):
        text += f"\n[body truncated at {len(body)} bytes]"
    return "\n".join(lines) + ("\n\n" + text if text else "")
