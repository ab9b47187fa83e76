"""The provider's OAuth endpoints over HTTP (RFC 6749 token and refresh grants, RFC 7009 revocation).

The endpoints come from ``bot.toml`` (an operator's file), not from a model, and the client secret goes
only to them: redirects are not followed (a redirected token request would carry the secret elsewhere).
Errors name the provider's ``error`` code and description, never a token or the secret.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import parse_qsl

import aiohttp

from core.connections.spec import ConnectionSpec, TokenSet
from core.errors import OAuthError
from core.text import clean_text

_TEN_YEARS_S = 10 * 365 * 86_400  # a longer lifetime is a provider's slip, not a reason to crash
_KNOWN = {"access_token", "refresh_token", "expires_in", "scope", "token_type"}


class HttpOAuthClient:
    def __init__(self, now: Callable[[], datetime], *, timeout_s: float = 15.0) -> None:
        self.now = now
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def exchange(self, spec: ConnectionSpec, *, code: str, verifier: str, redirect_uri: str,
                       scopes: tuple[str, ...]) -> TokenSet:
        return _tokens(await self._post(spec, spec.token_url, {
            "grant_type": "authorization_code", "code": code, "redirect_uri": redirect_uri,
            "code_verifier": verifier}), self.now(), requested=scopes)

    async def refresh(self, spec: ConnectionSpec, refresh_token: str) -> TokenSet:
        return _tokens(await self._post(spec, spec.token_url, {
            "grant_type": "refresh_token", "refresh_token": refresh_token}), self.now(), requested=None)

    async def revoke(self, spec: ConnectionSpec, token: str, hint: str) -> None:
        assert spec.revoke_url is not None
        await self._post(spec, spec.revoke_url, {"token": token, "token_type_hint": hint}, expect_json=False)

    async def _post(self, spec: ConnectionSpec, url: str, form: dict[str, str], *,
                    expect_json: bool = True) -> dict[str, Any]:
        body = form | {"client_id": spec.client_id}
        if spec.client_secret:
            body["client_secret"] = spec.client_secret
        try:
            async with aiohttp.ClientSession(timeout=self.timeout) as http, http.post(
                    url, data=body, allow_redirects=False, headers={"Accept": "application/json"}) as resp:
                raw = await resp.content.read(65_536)
                status = resp.status
                content_type = resp.headers.get("Content-Type", "")
        except TimeoutError:
            raise OAuthError(f"{spec.name}: {url} did not answer in time") from None
        except aiohttp.ClientError as exc:
            raise OAuthError(f"{spec.name}: {url} could not be reached ({type(exc).__name__})") from None
        answer = _parse(raw, content_type)
        if status >= 400 or "error" in answer:
            code = str(answer.get("error") or f"HTTP {status}")
            about = str(answer.get("error_description") or "")[:200]
            raise OAuthError(clean_text(f"{spec.name}: {code}" + (f" ({about})" if about else "")),
                             invalid_grant=code in ("invalid_grant", "bad_refresh_token"))
        if expect_json and not answer.get("access_token"):
            raise OAuthError(f"{spec.name}: the token endpoint answered without an access token (HTTP {status})")
        return answer


def _parse(raw: bytes, content_type: str) -> dict[str, Any]:
    text = raw.decode("utf-8", errors="replace")
    if "json" in content_type or text.lstrip().startswith("{"):
        try:
            parsed = json.loads(text)
        except ValueError:
            return {}
        return parsed if isinstance(parsed, dict) else {}
    return dict(parse_qsl(text))  # GitHub answers form-encoded unless asked for JSON


def _tokens(answer: dict[str, Any], now: datetime, *, requested: tuple[str, ...] | None) -> TokenSet:
    expires_at = None
    try:
        if answer.get("expires_in") is not None:
            lifetime = float(answer["expires_in"])
            if math.isfinite(lifetime):
                expires_at = now + timedelta(seconds=min(max(0.0, lifetime), _TEN_YEARS_S))
    except (TypeError, ValueError, OverflowError):
        expires_at = None
    scope = answer.get("scope")
    if isinstance(scope, str):
        scopes: tuple[str, ...] | None = tuple(s for s in scope.replace(",", " ").split() if s)
    elif isinstance(scope, list):
        scopes = tuple(str(s) for s in scope)
    else:
        scopes = requested  # RFC 6749 §5.1: no scope in the answer means the one requested
    extra = {k: v for k, v in answer.items() if k not in _KNOWN and isinstance(v, str | int | bool) and
             "token" not in k.lower() and "secret" not in k.lower()}
    return TokenSet(access_token=str(answer["access_token"]),
                    refresh_token=str(answer["refresh_token"]) if answer.get("refresh_token") else None,
                    expires_at=expires_at, scopes=scopes, token_type=str(answer.get("token_type") or "bearer"),
                    extra=extra)
