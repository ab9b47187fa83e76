"""One-time links (SPEC §8): where no modal can be shown, a person provides a credential on a page
(channels/web/credential_link.py) that a link opens once, for at most ``LINK_MAX_AGE``.
"""

from __future__ import annotations

import secrets
from datetime import timedelta

import jwt

from core.credentials import CredentialService, ProvideResult
from core.errors import InvalidInput
from core.hosts import parse_hosts
from core.model import CredentialRequestInfo

LINK_MAX_AGE = timedelta(minutes=15)
_LINK_AUDIENCE = "credential-link"


class CredentialLinks:
    """Links to provide the value of one open credential request through ``service``."""

    def __init__(self, service: CredentialService) -> None:
        self.service = service

    async def create_link(self, request_id: int) -> str:
        service = self.service
        request = await service.store.get(request_id)
        if request is None or request.settled:
            raise InvalidInput("that credential request is not open")
        if request.expires_at <= service.clock.now():
            raise InvalidInput(f"that credential request expired at {request.expires_at:%Y-%m-%d %H:%M:%S} UTC")
        jti = secrets.token_urlsafe(16)
        expires = min(service.clock.now() + LINK_MAX_AGE, request.expires_at)
        await service.store.add_link(jti, request_id, expires)
        return jwt.encode({"jti": jti, "rid": request_id, "exp": expires, "aud": _LINK_AUDIENCE},
                          service.keys.derive("credential-links"), algorithm="HS256")

    async def check_link(self, token: str) -> tuple[CredentialRequestInfo | None, str]:
        """The request a link opens, or None and why not (expired, used, unknown)."""
        store = self.service.store
        try:
            claims = jwt.decode(token, self.service.keys.derive("credential-links"), algorithms=["HS256"],
                                audience=_LINK_AUDIENCE, options={"require": ["exp", "jti", "aud"]})
        except jwt.ExpiredSignatureError:
            return None, "This link has expired. Ask the bot for a new one."
        except jwt.InvalidTokenError:
            return None, "This link is not valid."
        link = await store.link(str(claims["jti"]))
        if link is None or link.request_id != claims.get("rid"):
            return None, "This link is not valid."
        if link.used_at is not None:
            return None, "This link has already been used."
        request = await store.get(link.request_id)
        if request is None or request.settled:
            return None, f"This request is closed: {request.summary() if request else 'gone'}."
        return request, ""

    async def provide_via_link(self, token: str, value: str, hosts: object = None) -> ProvideResult:
        service = self.service
        request, why = await self.check_link(token)
        if request is None:
            return ProvideResult(False, why)
        problem = service.validate(value)
        if problem is not None:
            return ProvideResult(False, problem, field_error=problem, request=request)
        _, problem = parse_hosts(hosts, secret=value)  # before the link is burnt: a typo must not use it up
        if problem is not None:
            return ProvideResult(False, problem, field_error=problem, request=request, field="hosts")
        claims = jwt.decode(token, options={"verify_signature": False})
        if not await service.store.burn(str(claims["jti"]), service.clock.now()):
            return ProvideResult(False, "This link has already been used.")
        # Whoever holds the link was chosen to answer: it is the approval.
        return await service.provide(request.id, value, by="one-time link", operator=True, hosts=hosts)
