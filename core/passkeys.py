"""Passkeys for step-up approvals (SPEC §17 ``step_up``): WebAuthn through the ``webauthn`` package.

An approver enrols a passkey on the bot's page through a one-time link an operator makes (``bot approvers enroll
USER``). A click on Approve of a ``step_up`` request gives the approver a one-time link instead of counting; on its
page they confirm with one of *their* passkeys, with user verification, and only then does the approval count.

The relying party is ``BOT_PUBLIC_URL``: its host is the RP id and its origin the only origin accepted (WebAuthn
refuses an IP address, and a browser offers it only over https or on ``localhost``). Challenges are made here,
kept in the database with the link (one live challenge per link, for a few minutes) and used once; the browser's
word on which challenge it answered is compared with that, never believed. Links are stored as a sha256 of
their token, so neither a database copy nor a log line opens one.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from webauthn import (
    generate_authentication_options,
    generate_registration_options,
    verify_authentication_response,
    verify_registration_response,
)
from webauthn.helpers import base64url_to_bytes, bytes_to_base64url, options_to_json
from webauthn.helpers.exceptions import WebAuthnException
from webauthn.helpers.structs import (
    AuthenticatorSelectionCriteria,
    PublicKeyCredentialDescriptor,
    ResidentKeyRequirement,
    UserVerificationRequirement,
)

from core.clock import Clock
from core.model import ApprovalInfo
from core.people import person
from core.store.passkey_tables import PasskeyLinkRow, PasskeyRow
from core.store.passkeys import PasskeyStore, token_digest

log = logging.getLogger(__name__)

ENROL_LINK_MAX_AGE = timedelta(hours=24)
STEP_UP_LINK_MAX_AGE = timedelta(minutes=15)  # and never past the request's own expiry
CHALLENGE_MAX_AGE = timedelta(minutes=5)
ENROL, STEP_UP = "enrol", "step_up"
_CEREMONY_MS = 120_000
_LINK_PATH = {ENROL: "passkeys/enrol", STEP_UP: "passkeys/step-up"}


@dataclass(frozen=True)
class RelyingParty:
    """Who the passkeys are for: BOT_PUBLIC_URL's host (``id``), its origin, and where the pages are."""

    id: str
    origin: str
    base_url: str  # BOT_PUBLIC_URL without its trailing slash: links are made under it
    name: str = "chat-ops bot"


def relying_party(public_url: str | None) -> RelyingParty | str:
    """The relying party of ``BOT_PUBLIC_URL``, or why it cannot be one (one line)."""
    why = "step_up needs BOT_PUBLIC_URL with a host name, over https (or http://localhost)"
    if not public_url:
        return f"{why}; it is not set"
    parts = urlsplit(public_url)
    host = (parts.hostname or "").lower()
    if not host:
        return f"{why}; {public_url!r} has no host"
    try:
        ipaddress.ip_address(host)
        return f"{why}; {host} is an IP address, which WebAuthn refuses"
    except ValueError:
        pass
    if parts.scheme != "https" and not (parts.scheme == "http" and host == "localhost"):
        return f"{why}; {public_url!r} is neither https nor http://localhost"
    port = f":{parts.port}" if parts.port else ""
    return RelyingParty(id=host, origin=f"{parts.scheme}://{host}{port}", base_url=public_url.rstrip("/"))


@dataclass(frozen=True)
class OpenLink:
    """A link that may still be used: what it is for."""

    kind: str
    owner: str
    approval_id: int | None = None
    decider: str | None = None
    verdict: str | None = None


@dataclass(frozen=True)
class PasskeyView:
    """An enrolled passkey as operators see it (``bot approvers list``): never its key."""

    id: int
    owner: str
    created_at: datetime
    last_used_at: datetime | None


@dataclass(frozen=True)
class Confirmed:
    """A step-up assertion verified: ``decider`` approved ``approval_id`` with passkey ``passkey_id``."""

    approval_id: int
    decider: str
    verdict: str
    passkey_id: int


class Passkeys:
    def __init__(self, store: PasskeyStore, clock: Clock, rp: RelyingParty) -> None:
        self.store = store
        self.clock = clock
        self.rp = rp

    # -- links -------------------------------------------------------------------------------------

    async def enrol_link(self, owner: str, *, by: str) -> tuple[str, datetime]:
        """A one-time link that enrols a passkey for ``owner`` (a person named with their channel), and when it
        expires. Audited as made by ``by``."""
        now = self.clock.now()
        expires = now + ENROL_LINK_MAX_AGE
        token = secrets.token_urlsafe(32)
        await self.store.add_link(PasskeyLinkRow(token_digest=token_digest(token), kind=ENROL, owner=owner,
                                                 created_at=now, expires_at=expires),
                                  audit=(by, "passkey.enrol_link", {"owner": owner, "expires_at": expires.isoformat()}))
        return self._url(ENROL, token), expires

    async def step_up_link(self, *, owner: str, decider: str, approval_id: int, verdict: str,
                           request_expires_at: datetime) -> tuple[str, datetime] | None:
        """A one-time link on which ``owner`` confirms their ``verdict`` on ``approval_id`` with a passkey, and when
        it expires (with the request, or earlier); None when they have no passkey to confirm with."""
        if not await self.store.passkeys_of(owner):
            return None
        now = self.clock.now()
        expires = min(now + STEP_UP_LINK_MAX_AGE, request_expires_at)
        token = secrets.token_urlsafe(32)
        await self.store.add_link(PasskeyLinkRow(token_digest=token_digest(token), kind=STEP_UP, owner=owner,
                                                 approval_id=approval_id, decider=decider, verdict=verdict,
                                                 created_at=now, expires_at=expires))
        return self._url(STEP_UP, token), expires

    async def ask(self, request: ApprovalInfo, verdict: str, by: str) -> str:
        """What an approver (``by``, of the request's channel) is told, privately, when their approval of a
        ``step_up`` request does not count yet: a one-time link to confirm it with their passkey, or how to
        enrol one. The link is never posted where anyone else can see it, nor logged."""
        owner = person(request.session.channel, by)
        made = await self.step_up_link(owner=owner, decider=by, approval_id=request.id, verdict=verdict,
                                       request_expires_at=request.expires_at)
        if made is None:
            log.info("approval %s: %s has no passkey for its step-up", request.id, owner)
            return (f"Approving request {request.id} needs a passkey, and you have none yet: ask an operator to run "
                    f"`bot approvers enroll {owner}`, open the link they give you, then click Approve again. "
                    "Nothing was counted; the request still waits.")
        url, expires = made
        log.info("approval %s: step-up link made for %s", request.id, owner)
        return (f"Approving request {request.id} needs your passkey. Confirm it here (only you, once, until "
                f"{expires:%H:%M:%S} UTC): {url} — nothing is counted until you do.")

    def _url(self, kind: str, token: str) -> str:
        return f"{self.rp.base_url}/{_LINK_PATH[kind]}/{token}"

    async def open_link(self, token: str, kind: str) -> OpenLink | str:
        """The link ``token`` of ``kind`` while it may be used; else why not, as a person is told."""
        row = await self.store.link(token) if 0 < len(token) <= 128 else None
        if row is None or row.kind != kind:
            return "This link is not valid."
        if row.used_at is not None:
            return "This link has already been used. Links work once: ask for a new one."
        if row.expires_at <= self.clock.now():
            return f"This link expired at {row.expires_at:%Y-%m-%d %H:%M:%S} UTC. Ask for a new one."
        return OpenLink(kind=row.kind, owner=row.owner, approval_id=row.approval_id, decider=row.decider,
                        verdict=row.verdict)

    # -- ceremonies ---------------------------------------------------------------------------------

    async def options(self, token: str, link: OpenLink) -> dict[str, Any] | str:
        """The browser's ``publicKey`` options for this link, with a fresh challenge kept server-side (the one
        before it no longer counts); or why not."""
        owner_keys = await self.store.passkeys_of(link.owner)
        descriptors = [PublicKeyCredentialDescriptor(id=_b64decode(k.credential_id)) for k in owner_keys]
        if link.kind == ENROL:
            options: Any = generate_registration_options(
                rp_id=self.rp.id, rp_name=self.rp.name, user_name=link.owner, user_display_name=link.owner,
                user_id=hashlib.sha256(link.owner.encode()).digest(), timeout=_CEREMONY_MS,
                authenticator_selection=AuthenticatorSelectionCriteria(
                    resident_key=ResidentKeyRequirement.PREFERRED,
                    user_verification=UserVerificationRequirement.REQUIRED),
                exclude_credentials=descriptors)
        else:
            if not descriptors:
                return "You have no passkey any more: ask an operator to enrol one."
            # Only this approver's passkeys are offered (and only they are accepted when it comes back).
            options = generate_authentication_options(
                rp_id=self.rp.id, timeout=_CEREMONY_MS, allow_credentials=descriptors,
                user_verification=UserVerificationRequirement.REQUIRED)
        now = self.clock.now()
        challenge = bytes_to_base64url(options.challenge)
        if not await self.store.set_challenge(token, challenge, now + CHALLENGE_MAX_AGE, now):
            return "This link can no longer be used."
        parsed: dict[str, Any] = json.loads(options_to_json(options))
        return parsed

    async def enrol(self, token: str, credential: dict[str, Any]) -> int | str:
        """Register the passkey the browser made for this enrolment link: its id, or why not. The link is used
        up either way (a second try needs a new link)."""
        link = await self.store.take(token, self.clock.now())
        if link is None or link.kind != ENROL or link.challenge is None:
            return "This link is not valid any more (used, expired, or its page was not opened): ask for a new one."
        try:
            verified = verify_registration_response(
                credential=credential, expected_challenge=_b64decode(link.challenge), expected_rp_id=self.rp.id,
                expected_origin=self.rp.origin, require_user_verification=True)
        except (WebAuthnException, ValueError, KeyError, TypeError, AttributeError) as exc:  # whatever was sent
            log.info("passkey enrolment for %s refused: %s", link.owner, exc)
            return "The passkey could not be verified, so nothing was enrolled. Ask for a new link."
        credential_id = bytes_to_base64url(verified.credential_id)
        # Any person's, revoked ones too: without attestation the browser names the id, and one id is one passkey.
        if await self.store.credential_known(credential_id):
            return "This passkey is already enrolled."
        passkey_id = await self.store.add_passkey(PasskeyRow(
            owner=link.owner, credential_id=credential_id, public_key=verified.credential_public_key,
            sign_count=verified.sign_count, created_at=self.clock.now(), created_by="enrolment link"))
        log.info("passkey %s enrolled for %s", passkey_id, link.owner)
        return passkey_id

    async def confirm(self, token: str, credential: dict[str, Any]) -> Confirmed | str:
        """Verify a step-up assertion: the link (used up now), its challenge, this origin and RP id, user
        verification, one of the link owner's own passkeys, a sign count that moved forward. The confirmation
        is audited ("step-up confirmed with passkey N"); the caller then counts the approval."""
        now = self.clock.now()
        link = await self.store.take(token, now)
        if link is None or link.kind != STEP_UP or link.challenge is None or link.approval_id is None \
                or link.decider is None or link.verdict is None:
            return "This link is not valid any more (used, expired, or its page was not opened)."
        raw_id = credential.get("id") if isinstance(credential, dict) else None
        passkey = next((k for k in await self.store.passkeys_of(link.owner) if k.credential_id == raw_id), None)
        if passkey is None or passkey.id is None:  # another person's passkey, a revoked one, or none
            log.info("step-up for approval %s refused: not a passkey of %s", link.approval_id, link.owner)
            return "That passkey is not one of yours, so nothing was approved."
        try:
            verified = verify_authentication_response(
                credential=credential, expected_challenge=_b64decode(link.challenge), expected_rp_id=self.rp.id,
                expected_origin=self.rp.origin, credential_public_key=passkey.public_key,
                credential_current_sign_count=passkey.sign_count, require_user_verification=True)
        except (WebAuthnException, ValueError, KeyError, TypeError, AttributeError) as exc:  # whatever was sent
            log.info("step-up for approval %s refused: %s", link.approval_id, exc)
            return "The passkey could not be verified, so nothing was approved."
        note = f"step-up confirmed with passkey {passkey.id}"
        if not await self.store.used(passkey.id, passkey.sign_count, verified.new_sign_count, now, audit=(
                link.owner, "approval.step_up", f"approval:{link.approval_id}",
                {"passkey": passkey.id, "verdict": link.verdict, "note": note})):
            return "That passkey was used elsewhere at the same moment, so nothing was approved."
        return Confirmed(approval_id=link.approval_id, decider=link.decider, verdict=link.verdict,
                         passkey_id=passkey.id)

    # -- operators ----------------------------------------------------------------------------------

    async def listed(self) -> list[PasskeyView]:
        return [_view(row) for row in await self.store.all()]

    async def revoke(self, passkey_id: int, *, by: str) -> PasskeyView | None:
        """Revoke an active passkey (audited): it confirms nothing any more."""
        row = await self.store.revoke(passkey_id, by, self.clock.now())
        return _view(row) if row is not None else None


def _view(row: PasskeyRow) -> PasskeyView:
    assert row.id is not None
    return PasskeyView(id=row.id, owner=row.owner, created_at=row.created_at, last_used_at=row.last_used_at)


def _b64decode(text: str) -> bytes:
    return base64url_to_bytes(text)
