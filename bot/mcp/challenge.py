"""Telling "this MCP server needs OAuth" (RFC 9728) from every other failure, without masking a cause.

A real requirement is a 401 whose ``WWW-Authenticate`` is a Bearer challenge carrying ``resource_metadata``
or the ``realm="OAuth"`` of the MCP auth spec. A plain ``Bearer error="invalid_token"`` is a token the
server refused; ``Basic`` is another scheme; a 5xx is the server failing; no answer is no answer. Each is
reported as what it is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TOKEN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_PARAM = re.compile(rf'({_TOKEN})\s*=\s*(?:"((?:[^"\\]|\\.)*)"|({_TOKEN}))', re.DOTALL)
_SCHEME = re.compile(rf"({_TOKEN})(?:\s+(.*))?", re.DOTALL)


def _elements(header: str) -> list[str]:
    """The comma-separated elements of a header value, commas inside quoted strings kept (RFC 7230 §7)."""
    parts: list[str] = []
    current: list[str] = []
    quoted = escaped = False
    for ch in header:
        if escaped:
            escaped = False
        elif quoted and ch == "\\":
            escaped = True
        elif ch == '"':
            quoted = not quoted
        elif ch == "," and not quoted:
            parts.append("".join(current).strip())
            current = []
            continue
        current.append(ch)
    parts.append("".join(current).strip())
    return [part for part in parts if part]


def _param(text: str) -> tuple[str, str] | None:
    found = _PARAM.fullmatch(text)
    if found is None:
        return None
    value = found.group(3) if found.group(2) is None else re.sub(r"\\(.)", r"\1", found.group(2), flags=re.DOTALL)
    return found.group(1).lower(), value


def challenges(header: str) -> list[tuple[str, dict[str, str]]]:
    """A ``WWW-Authenticate`` value as its challenges (RFC 7235 §4.1): (scheme lower-cased, parameters with
    lower-cased names; a token68 is not kept). A comma or scheme name inside a quoted string is text."""
    found: list[tuple[str, dict[str, str]]] = []
    for element in _elements(header):
        param = _param(element)
        if param is not None:  # the next parameter of the challenge before it
            if found:
                found[-1][1].setdefault(*param)
            continue
        scheme = _SCHEME.fullmatch(element)
        if scheme is None:
            continue
        params: dict[str, str] = {}
        first = _param((scheme.group(2) or "").strip())
        if first is not None:
            params[first[0]] = first[1]
        found.append((scheme.group(1).lower(), params))
    return found


def _bearer_params(header: str) -> dict[str, str] | None:
    """The parameters of the Bearer challenge in a ``WWW-Authenticate`` value, or None if there is none."""
    return next((params for scheme, params in challenges(header) if scheme == "bearer"), None)


def is_oauth_challenge(header: str) -> bool:
    params = _bearer_params(header or "")
    if params is None:
        return False
    return "resource_metadata" in params or params.get("realm", "").lower() == "oauth"


def resource_metadata_url(header: str) -> str | None:
    params = _bearer_params(header or "") or {}
    return params.get("resource_metadata")


@dataclass(frozen=True)
class Diagnosis:
    """Why a server could not be used. ``kind``: oauth, invalid_token, basic, unauthorized, server_error,
    http_error, unreachable, protocol."""

    kind: str
    message: str


def diagnose(status: int | None, www_authenticate: str = "", error: BaseException | None = None,
             *, name: str = "the server") -> Diagnosis:
    """What a failed connection or call means: ``status`` and ``www_authenticate`` of the last HTTP answer
    (None: there was none), ``error`` what the client raised."""
    if status is None:
        why = f"{type(error).__name__}: {error}" if error is not None else "no answer"
        return Diagnosis("unreachable", f"{name} could not be reached ({why})")
    if status == 401:
        params = _bearer_params(www_authenticate)
        # A refused token first: spec-following servers send resource_metadata with it too.
        if params is not None and params.get("error") == "invalid_token":
            return Diagnosis("invalid_token", f"{name} refused the token it was sent (invalid_token): store a "
                                              "valid one, or reconnect")
        if is_oauth_challenge(www_authenticate):
            where = resource_metadata_url(www_authenticate)
            at = f" (resource metadata at {where})" if where else ""
            return Diagnosis("oauth", f"locked: needs OAuth authorization{at}; add a connection "
                                      "([[connections]] in bot.toml, then connection = \"…\" in its entry)")
        if (challenges(www_authenticate or "") or [("", {})])[0][0] == "basic":
            return Diagnosis("basic", f"{name} asks for Basic authentication (HTTP 401), which is not a "
                                      "bearer token; give it a credential holding the whole header")
        return Diagnosis("unauthorized", f"{name} answered HTTP 401 (not authorized) without an OAuth challenge")
    if status >= 500:
        return Diagnosis("server_error", f"{name} failed: HTTP {status}")
    if status >= 400:
        return Diagnosis("http_error", f"{name} refused the request: HTTP {status}")
    why = f"{type(error).__name__}: {error}" if error is not None else f"HTTP {status}"
    return Diagnosis("protocol", f"{name} did not speak MCP as expected ({why})")
