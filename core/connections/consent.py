"""Consent (SPEC §16): personal, single-use links to a provider's consent page, and its callback.

A link is minted only for the person who may complete the request (its principal; for a shared
connection, an admin). It opens once (``/oauth/start``): that sets a cookie binding this browser to the
state, then sends the browser to the provider with PKCE S256. The callback (``/oauth/callback``) needs
the same state, unused and unexpired, *and* that browser's cookie: a stranger holding a leaked provider
URL has the state but not the cookie, so they cannot attach their account to someone else's request.
The state is used once (a retried callback, a prefetch or a double click resumes nothing more); only
its hash is stored, and the PKCE verifier is derived from it with a key the database never holds.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from core.connections.service import ConnectionService, seal_context
from core.connections.spec import ConnectionSpec, TokenSet, pkce_challenge, pkce_verifier, state_hash
from core.errors import NotFound, OAuthError
from core.model import ConnectionRequestInfo, ConnectionStatus
from core.store.connection_tables import ConnectionRow, OAuthStateRow

log = logging.getLogger(__name__)
NOT_YOURS = "There is no open connection request of yours with that id."  # absent and not-yours alike
_RETRY = "Click Connect in the conversation again for a new link."


@dataclass(frozen=True)
class CallbackResult:
    ok: bool
    title: str
    message: str
    status: int = 200


@dataclass(frozen=True)
class Preview:
    """What a personal link connects, shown before anything is used: whose turn it serves."""

    connection: str
    principal: str  # who it was minted for
    shared: bool  # connected once, for everyone


@dataclass(frozen=True)
class Opened:
    """Where ``/oauth/start`` sends the browser, and the cookie value that binds it."""

    location: str
    binding: str


class Consent:
    def __init__(self, service: ConnectionService, *, base_url: Callable[[], str], link_ttl_s: float = 600) -> None:
        self.service = service
        self.base_url = base_url  # BOT_PUBLIC_URL, or this machine's address (read when used: PORT=0)
        self.link_ttl = timedelta(seconds=link_ttl_s)
        self._key = service.keys.derive("oauth-consent")

    async def link(self, request_id: int, by: str, channel: str) -> str:
        """A personal link (under the bot's own address) for ``by`` to complete the request."""
        service = self.service
        request = await service.get(request_id)
        if request is None or request.status != ConnectionStatus.PENDING:
            raise NotFound(NOT_YOURS)
        spec = service.specs.get(request.connection)
        if spec is None or spec.authorize_url is None or not await self.may_complete(by, request.principal, channel):
            raise NotFound(NOT_YOURS)
        now = service.clock.now()
        if request.expires_at <= now:
            raise NotFound(NOT_YOURS)
        await service.store.prune_states(now - timedelta(days=1))  # used and expired ones: kept a day for audit
        state = secrets.token_urlsafe(32)
        await service.store.add_state(OAuthStateRow(
            state_hash=state_hash(state), connection=spec.name, principal=by, request_id=request.id,
            channel=channel, created_at=now, expires_at=min(now + self.link_ttl, request.expires_at)))
        return f"{self.base_url().rstrip('/')}/oauth/start?state={state}"

    async def may_complete(self, by: str, principal: str, channel: str) -> bool:
        """Whether ``by`` (of ``channel``, where the request was asked: the gateway gives links only there)
        may complete a request for ``principal``."""
        if not by:
            return False
        if principal:
            return hmac.compare_digest(by, principal)
        # A shared connection: an admin connects it for everyone.
        return self.service.policy.is_admin(by, channel=channel)

    async def preview(self, state: str) -> Preview | CallbackResult:
        """What opening this link would connect (nothing is used yet: a link checker's visit burns nothing)."""
        service = self.service
        row = await service.store.state(state_hash(state))
        now = service.clock.now()
        spec = service.specs.get(row.connection) if row is not None else None
        if row is None or spec is None or row.opened_at is not None or row.used_at is not None or row.expires_at <= now:
            return CallbackResult(False, "Link not usable", f"This link was already used or has expired. {_RETRY}",
                                  410)
        return Preview(spec.name, row.principal, spec.owner == "shared")

    async def open(self, state: str) -> Opened | CallbackResult:
        """The first opening of a personal link: the provider's consent URL and this browser's binding."""
        service = self.service
        hashed = state_hash(state)
        row, problem = await service.store.open_state(hashed, service.clock.now())
        if row is None or problem is not None:
            await self._failed(None, problem or "unknown", "opened a consent link")
            return CallbackResult(False, "Link not usable", f"This link was already used or has expired. {_RETRY}",
                                  410)
        spec = service.specs.get(row.connection)
        request = await service.get(row.request_id) if row.request_id is not None else None
        if spec is None or spec.authorize_url is None:
            return CallbackResult(False, "Link not usable", "That connection is no longer configured.", 410)
        scopes = _asked(spec, request)
        verifier = pkce_verifier(self._key, state)
        location = spec.authorize_link(state=state, challenge=pkce_challenge(verifier),
                                       redirect_uri=self.redirect_uri(), scopes=scopes)
        return Opened(location, self._binding(state))

    async def callback(self, *, state: str, code: str, error: str, binding: str) -> CallbackResult:
        """The provider sent the browser back: exchange the code, store the tokens, resume the parked call."""
        service = self.service
        if not state:
            await self._failed(None, "no state", "callback")
            return CallbackResult(False, "Not connected", "This address is missing its state. " + _RETRY, 400)
        row, problem = await service.store.claim_state(state_hash(state), service.clock.now())
        if row is None or problem is not None:
            await self._failed(row, problem or "unknown", "callback")
            return CallbackResult(False, "Not connected", f"This link was already used or has expired. {_RETRY}", 410)
        if not binding or not hmac.compare_digest(binding, self._binding(state)):
            # The state is burnt: whoever holds the URL cannot try again with it.
            await self._failed(row, "browser does not match the one the link was opened in", "callback")
            return CallbackResult(False, "Not connected", (
                "This browser is not the one the Connect link was opened in, so nothing was connected. "
                + _RETRY), 403)
        spec = service.specs.get(row.connection)
        request = await service.get(row.request_id) if row.request_id is not None else None
        if spec is None:
            await self._failed(row, "connection no longer configured", "callback")
            return CallbackResult(False, "Not connected", "That connection is no longer configured.", 410)
        if request is not None and not await self.may_complete(row.principal, request.principal, row.channel):
            await self._failed(row, "principal does not match the request", "callback")
            return CallbackResult(False, "Not connected", NOT_YOURS, 403)
        if error or not code:
            await self._failed(row, f"provider said {error or 'no code'}", "callback")
            return CallbackResult(False, "Not connected", (
                f"{spec.name} did not grant access ({error or 'no code'}). The request stays open until it "
                f"expires. {_RETRY}"), 400)
        try:
            tokens = await service.client.exchange(spec, code=code, verifier=pkce_verifier(self._key, state),
                                                   redirect_uri=self.redirect_uri(), scopes=_asked(spec, request))
        except OAuthError as exc:
            await self._failed(row, f"token exchange failed: {exc}", "callback")
            return CallbackResult(False, "Not connected", f"{spec.name} refused the code: {exc}. {_RETRY}", 502)
        granted = tokens.scopes
        owner = service.owner_for(spec, row.principal)
        try:
            _stored, settled = await self._store(spec.name, owner, tokens, granted, row, request_id=(
                request.id if request is not None and request.status == ConnectionStatus.PENDING else None))
        except Exception as exc:  # the state is used up: say so, and give back what could not be kept
            log.exception("connection %s: the tokens could not be stored", spec.name)
            await self._failed(row, f"could not store the tokens ({type(exc).__name__})", "callback")
            await self._give_back(spec, tokens)
            return CallbackResult(False, "Not connected", f"The bot could not store the connection. {_RETRY}", 500)
        log.info("connection %s connected by %s", spec.name, row.principal)
        if settled is not None:
            service.requests.settled_here(settled)
            return CallbackResult(True, "Connected", "Connected, you can close this tab.")
        late = " The request that waited for it had already ended." if request is not None else ""
        return CallbackResult(True, "Connected", f"Connected, you can close this tab.{late}")

    async def _store(self, name: str, owner: str, tokens: TokenSet, granted: tuple[str, ...] | None,
                     state: OAuthStateRow, *, request_id: int | None
                     ) -> tuple[ConnectionRow, ConnectionRequestInfo | None]:
        service = self.service
        now = service.clock.now()

        def seal(row: ConnectionRow) -> None:
            assert row.id is not None
            plain = json.dumps({"access_token": tokens.access_token, "refresh_token": tokens.refresh_token})
            sealed = service.keys.seal(plain, seal_context(row.name, row.owner, row.id))
            row.key_id, row.ciphertext = sealed.key_id, sealed.blob

        service.learn_tokens(name, tokens)  # masked before anything could show it
        row = ConnectionRow(name=name, owner=owner, key_id="", ciphertext="",
                            scopes=json.dumps(list(granted)) if granted is not None else "null",
                            expires_at=tokens.expires_at, refreshable=tokens.refresh_token is not None,
                            meta=json.dumps(tokens.extra) if tokens.extra else None, connected_by=state.principal,
                            created_at=now, updated_at=now)
        # A reconnect replaces the stored tokens without revoking the old ones: for the same app and person
        # they are usually the same grant, and revoking them would end the new tokens too (Google does).
        return await service.store.connect(row, seal=seal, request_id=request_id, by=state.principal, now=now,
                                           audit={"request": request_id, "via": state.channel,
                                                  "scopes": list(granted) if granted is not None else None})

    async def _give_back(self, spec: ConnectionSpec, tokens: TokenSet) -> None:
        """Revoke tokens that were obtained but not kept (best effort: they are in no one's hands)."""
        if spec.revoke_url is None:
            return
        for token, hint in ((tokens.refresh_token, "refresh_token"), (tokens.access_token, "access_token")):
            if token:
                try:
                    await self.service.client.revoke(spec, token, hint)
                except OAuthError as exc:
                    log.warning("connection %s: could not revoke unkept tokens: %s", spec.name, exc)

    async def _failed(self, row: OAuthStateRow | None, why: str, step: str) -> None:
        service = self.service
        log.info("connection consent refused (%s): %s", step, why)
        await service.store.audit(service.clock.now(), row.principal if row else "unknown",
                                  "connection.callback_failed", f"connection:{row.connection if row else '?'}",
                                  {"step": step, "error": why, "request": row.request_id if row else None})

    def redirect_uri(self) -> str:
        return f"{self.base_url().rstrip('/')}/oauth/callback"

    def _binding(self, state: str) -> str:
        return hmac.new(self._key, f"browser|{state}".encode(), hashlib.sha256).hexdigest()


def _asked(spec: ConnectionSpec, request: ConnectionRequestInfo | None) -> tuple[str, ...]:
    """The scopes a consent asks for: the entry's, and those the parked call was refused for."""
    return tuple(dict.fromkeys(spec.scopes + (request.scopes if request else ())))
