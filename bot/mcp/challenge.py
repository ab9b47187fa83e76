"""Telling "this MCP server needs OAuth" (RFC 9728) from every other failure, without masking a cause.

A real requirement is a 401 whose ``WWW-Authenticate`` is a Bearer challenge carrying ``resource_metadata``
or the ``realm="OAuth"`` of the MCP auth spec. A plain ``Bearer error="invalid_token"`` is a token the
server refused; ``Basic`` is another scheme; a 5xx is the server failing; no answer is no answer. Each is
reported as what it is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PARAM = re.compile(r'([A-Za-z_][A-Za-z0-9_-]*)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]+))')


def _bearer_params(header: str) -> dict[str, str] | None:
    """The parameters of the Bearer challenge in a ``WWW-Authenticate`` value, or None if there is none."""
    found = re.search(r"(?:^|,)\s*bearer(?:\s+|$)", header, re.IGNORECASE)
    if found is None:
        return None
    rest = header[found.end():]
    following = re.search(r",\s*[A-Za-z][A-Za-z0-9_-]*\s+[A-Za-z_][A-Za-z0-9_-]*\s*=", rest)  # the next challenge
    if following is not None:
        rest = rest[:following.start()]
    return {m.group(1).lower(): m.group(2) if m.group(2) is not None else m.group(3) for m in _PARAM.finditer(rest)}


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

    @property
    def needs_oauth(self) -> bool:
        return self.kind == "oauth"


def diagnose(status: int | None, www_authenticate: str = "", error: BaseException | None = None,
             *, name: str = "the server") -> Diagnosis:
    """What a failed connection or call means: ``status`` and ``www_authenticate`` of the last HTTP answer
    (None: there was none), ``error`` what the client raised."""
    if status is None:
        why = f"{type(error).__name__}: {error}" if error is not None else "no answer"
        return Diagnosis("unreachable", f"{name} could not be reached ({why})")
    if status == 401:
        if is_oauth_challenge(www_authenticate):
            where = resource_metadata_url(www_authenticate)
            at = f" (resource metadata at {where})" if where else ""
            return Diagnosis("oauth", f"locked: needs OAuth authorization{at}; add a connection "
                                      "([[connections]] in bot.toml, then connection = \"…\" in its entry)")
        params = _bearer_params(www_authenticate)
        if params is not None and params.get("error") == "invalid_token":
            return Diagnosis("invalid_token", f"{name} refused the token it was sent (invalid_token): store a "
                                              "valid one, or reconnect")
        if re.match(r"\s*basic\b", www_authenticate or "", re.IGNORECASE):
            return Diagnosis("basic", f"{name} asks for Basic authentication (HTTP 401), which is not a "
                                      "bearer token; give it a credential holding the whole header")
        return Diagnosis("unauthorized", f"{name} answered HTTP 401 (not authorized) without an OAuth challenge")
    if status >= 500:
        return Diagnosis("server_error", f"{name} failed: HTTP {status}")
    if status >= 400:
        return Diagnosis("http_error", f"{name} refused the request: HTTP {status}")
    why = f"{type(error).__name__}: {error}" if error is not None else f"HTTP {status}"
    return Diagnosis("protocol", f"{name} did not speak MCP as expected ({why})")
