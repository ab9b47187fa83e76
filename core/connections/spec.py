"""A ``[[connections]]`` entry (SPEC §16) as core uses it, and what the OAuth flow exchanges.

The settings layer (bot/config/connections.py) reads and checks the file; core only trusts these values.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol

from yarl import URL

from core.hosts import host_allowed

Owner = Literal["user", "shared"]


@dataclass(frozen=True)
class ConnectionSpec:
    name: str
    token_url: str
    client_id: str
    client_secret: str = field(repr=False)
    scopes: tuple[str, ...] = ()
    authorize_url: str | None = None  # None: nobody can be sent to consent, so a call never pauses
    revoke_url: str | None = None
    hosts: tuple[str, ...] = ()  # where its token may be sent
    owner: Owner = "user"
    hosts_defaulted: bool = False  # ``hosts`` not given: token_url's registrable domain and below

    def allows(self, host: str) -> bool:
        return host_allowed(host, self.hosts)

    def authorize_link(self, *, state: str, challenge: str, redirect_uri: str, scopes: tuple[str, ...]) -> str:
        """The provider's consent page for this state (PKCE S256)."""
        assert self.authorize_url is not None
        url = URL(self.authorize_url)
        query: dict[str, str] = dict(url.query)
        query.update({"response_type": "code", "client_id": self.client_id, "redirect_uri": redirect_uri,
                      "state": state, "code_challenge": challenge, "code_challenge_method": "S256"})
        if scopes:
            query["scope"] = " ".join(scopes)
        return str(url.with_query(query))


def pkce_verifier(key: bytes, state: str) -> str:
    """The code verifier of one state: derived with a key the database never holds (43 characters)."""
    digest = hmac.new(key, f"pkce|{state}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def pkce_challenge(verifier: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()


def state_hash(state: str) -> str:
    """What is stored of a state: a leaked table opens no consent link."""
    return hashlib.sha256(state.encode()).hexdigest()


@dataclass(frozen=True)
class TokenSet:
    """What a token endpoint answered. ``scopes`` None: it did not say (then what was asked is assumed)."""

    access_token: str = field(repr=False)
    refresh_token: str | None = field(default=None, repr=False)
    expires_at: datetime | None = None
    scopes: tuple[str, ...] | None = None
    token_type: str = "bearer"
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. a cloud id the provider disclosed


class OAuthClient(Protocol):
    """The provider's endpoints (bot/oauth_client.py speaks HTTP)."""

    async def exchange(self, spec: ConnectionSpec, *, code: str, verifier: str, redirect_uri: str,
                       scopes: tuple[str, ...]) -> TokenSet:
        """``scopes``: what the consent asked for (granted, when the answer does not say otherwise)."""
        ...
    async def refresh(self, spec: ConnectionSpec, refresh_token: str) -> TokenSet: ...
    async def revoke(self, spec: ConnectionSpec, token: str, hint: str) -> None: ...
