"""A fake OAuth 2.0 authorization server and protected resource, served by aiohttp.

Authorization code grant (RFC 6749) with PKCE S256 (RFC 7636), token revocation (RFC 7009)
and bearer-token errors on the resource (RFC 6750). Tokens look like GitHub's (gho_/ghr_).
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from yarl import URL


@dataclass
class _Code:
    redirect_uri: str
    challenge: str
    scopes: list[str]
    used: bool = False


@dataclass
class _Token:
    kind: str  # "access" or "refresh"
    scopes: list[str]
    refresh: str | None = None  # an access token's refresh token (revoking it revokes this one)
    live: bool = True  # False once revoked or superseded by a refresh
    expires_at: float | None = None


def _error(error: str, status: int = 400) -> web.Response:
    return web.json_response({"error": error}, status=status)


def pkce_challenge(verifier: str) -> str:
    """The S256 code challenge for a verifier: base64url, no padding, of its SHA-256."""
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()


@dataclass
class FakeOAuth:
    client_id: str = "client-123"
    client_secret: str = "secret-456"
    expires_in: int | None = 3600  # None: token responses carry no expires_in
    grant_scopes: list[str] | None = None  # None: grant exactly what was asked
    rotate_refresh: bool = True  # a refresh issues a new refresh token and kills the old one
    refresh_fails: bool = False  # every refresh grant answers 400 invalid_grant
    revoke_status: int = 200  # e.g. 503: a revocation endpoint that is down
    deny: bool = False  # the user clicks "deny" at /authorize
    required_scopes: dict[str, list[str]] = field(default_factory=lambda: {"/api/admin": ["admin"]})
    account: str = "octocat"
    echo_scope: bool = True  # False: token answers leave scope out (RFC 6749 §5.1: then it is what was asked)
    requests: list[dict[str, Any]] = field(default_factory=list)
    revoked: list[str] = field(default_factory=list)  # tokens a client asked to revoke (and that were known)
    reused_codes: list[str] = field(default_factory=list)  # codes presented a second time
    refreshes: int = 0  # refresh-grant requests received (including failed ones)
    codes: dict[str, _Code] = field(default_factory=dict)
    tokens: dict[str, _Token] = field(default_factory=dict)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._record])
        app.router.add_get("/authorize", self._authorize)
        app.router.add_post("/token", self._token)
        app.router.add_post("/revoke", self._revoke)
        app.router.add_get("/api/{tail:.*}", self._resource)
        app.router.add_post("/api/{tail:.*}", self._resource)
        return app

    # --- test controls ---

    def expire_access_tokens(self) -> None:
        for token in self.tokens.values():
            if token.kind == "access":
                token.expires_at = 0.0  # long past: the resource now answers invalid_token

    def valid_access_tokens(self) -> list[str]:
        return [value for value, token in self.tokens.items() if token.kind == "access" and self._usable(token)]

    def all_tokens(self) -> list[str]:
        return list(self.tokens)

    # --- helpers ---

    @web.middleware
    async def _record(self, request: web.Request, handler: Any) -> web.StreamResponse:
        form = dict(await request.post()) if request.method == "POST" else {}  # cached: handlers read it again
        self.requests.append(
            {
                "method": request.method,
                "path": request.path,
                "query": dict(request.query),
                "form": {k: str(v) for k, v in form.items()},
                "headers": dict(request.headers),
            }
        )
        response: web.StreamResponse = await handler(request)
        return response

    @staticmethod
    def _usable(token: _Token) -> bool:
        return token.live and (token.expires_at is None or time.time() < token.expires_at)

    def _client_ok(self, request: web.Request, form: dict[str, str]) -> bool:
        client_id, secret = form.get("client_id"), form.get("client_secret")
        header = request.headers.get("Authorization", "")
        if header.lower().startswith("basic "):
            try:  # RFC 6749 section 2.3.1: id and secret are form-encoded, then base64'd
                pair = base64.b64decode(header[6:].strip(), validate=True).decode()
            except ValueError:
                return False
            client_id, _, secret = (urllib.parse.unquote_plus(part) for part in pair.partition(":"))
        return client_id == self.client_id and secret == self.client_secret

    def _issue(self, scopes: list[str], refresh: str | None = None) -> dict[str, Any]:
        refresh = refresh or "ghr_" + secrets.token_urlsafe(24)
        self.tokens.setdefault(refresh, _Token("refresh", scopes))
        access = "gho_" + secrets.token_urlsafe(24)
        expires_at = None if self.expires_in is None else time.time() + self.expires_in
        self.tokens[access] = _Token("access", scopes, refresh=refresh, expires_at=expires_at)
        body: dict[str, Any] = {"access_token": access, "token_type": "bearer"}
        if self.expires_in is not None:
            body["expires_in"] = self.expires_in
        body.update(refresh_token=refresh)
        if self.echo_scope:
            body["scope"] = " ".join(scopes)
        return body

    def _kill_access_of(self, refresh: str) -> None:
        for token in self.tokens.values():
            if token.kind == "access" and token.refresh == refresh:
                token.live = False

    # --- routes ---

    async def _authorize(self, request: web.Request) -> web.Response:
        q = request.query
        if q.get("client_id") != self.client_id:
            return web.Response(status=400, text="unknown client_id")
        if q.get("response_type") != "code":
            return web.Response(status=400, text="response_type must be code")
        if not q.get("code_challenge") or q.get("code_challenge_method") != "S256":
            return web.Response(status=400, text="PKCE S256 code_challenge required")
        if not q.get("redirect_uri"):
            return web.Response(status=400, text="redirect_uri required")
        state = {"state": q["state"]} if "state" in q else {}
        if self.deny:
            location = URL(q["redirect_uri"]).update_query(error="access_denied", **state)
            raise web.HTTPFound(location)
        requested = q.get("scope", "").split()
        code = secrets.token_urlsafe(16)
        scopes = list(self.grant_scopes) if self.grant_scopes is not None else requested
        self.codes[code] = _Code(q["redirect_uri"], q["code_challenge"], scopes)
        raise web.HTTPFound(URL(q["redirect_uri"]).update_query(code=code, **state))  # keeps any existing query

    async def _token(self, request: web.Request) -> web.Response:
        form = {k: str(v) for k, v in (await request.post()).items()}
        if not self._client_ok(request, form):
            return _error("invalid_client", 401)
        grant = form.get("grant_type")
        if grant == "authorization_code":
            code = self.codes.get(form.get("code", ""))
            if code is None:
                return _error("invalid_grant")
            if code.used:
                self.reused_codes.append(form["code"])
                return _error("invalid_grant")
            code.used = True  # single use, even when the rest of the request is wrong
            if form.get("redirect_uri") != code.redirect_uri:
                return _error("invalid_grant")
            if not secrets.compare_digest(pkce_challenge(form.get("code_verifier", "")), code.challenge):
                return _error("invalid_grant")
            return web.json_response(self._issue(code.scopes), headers={"Cache-Control": "no-store"})
        if grant == "refresh_token":
            self.refreshes += 1
            old = form.get("refresh_token", "")
            token = self.tokens.get(old)
            if token is None or token.kind != "refresh" or not token.live or self.refresh_fails:
                return _error("invalid_grant")
            self._kill_access_of(old)  # the old access token stops working
            if self.rotate_refresh:
                token.live = False
                body = self._issue(token.scopes)
            else:
                body = self._issue(token.scopes, refresh=old)
            return web.json_response(body, headers={"Cache-Control": "no-store"})
        return _error("unsupported_grant_type")

    async def _revoke(self, request: web.Request) -> web.Response:
        form = {k: str(v) for k, v in (await request.post()).items()}
        if not self._client_ok(request, form):
            return _error("invalid_client", 401)
        if self.revoke_status != 200:
            return _error("temporarily_unavailable", self.revoke_status)
        value = form.get("token")
        if not value:
            return _error("invalid_request")
        token = self.tokens.get(value)
        if token is not None:  # unknown tokens also get 200 (RFC 7009 section 2.2)
            token.live = False
            if token.kind == "refresh":
                self._kill_access_of(value)
            self.revoked.append(value)
        return web.Response(status=200)

    async def _resource(self, request: web.Request) -> web.Response:
        header = request.headers.get("Authorization", "")
        if not header.lower().startswith("bearer "):
            return web.Response(status=401, headers={"WWW-Authenticate": 'Bearer realm="fake"'})
        token = self.tokens.get(header[7:].strip())
        if token is None or token.kind != "access" or not self._usable(token):
            return web.Response(status=401, headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})
        needed = self.required_scopes.get(request.path, [])
        if any(scope not in token.scopes for scope in needed):
            challenge = f'Bearer error="insufficient_scope", scope="{" ".join(needed)}"'
            return web.Response(status=403, headers={"WWW-Authenticate": challenge})
        if request.path == "/api/echo":  # a careless API that shows the caller its own credentials
            return web.json_response({"ok": True, "you_sent": header})
        return web.json_response({"ok": True, "account": self.account, "path": request.path, "scopes": token.scopes})
