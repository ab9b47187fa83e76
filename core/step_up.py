"""The passkey pages' side of core (channels/web/passkey_pages.py): open a one-time link, give its WebAuthn
options, and finish it: enrol a passkey, or confirm an approval with one, which then counts through the normal
decision (quorum, settled exactly once, audited)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.approvals import ApprovalBroker
from core.display import arguments_text
from core.passkeys import ENROL, STEP_UP, Confirmed, OpenLink, Passkeys


@dataclass(frozen=True)
class LinkPage:
    """What a link's page shows before the passkey is used."""

    kind: str
    owner: str
    title: str
    text: str  # plain text: the page escapes it
    call: str | None = None  # a step-up's call, its arguments in full


@dataclass(frozen=True)
class Finished:
    ok: bool
    message: str
    gone: bool = False  # the link cannot be used (any more): nothing was tried


class StepUps:
    def __init__(self, passkeys: Passkeys, approvals: ApprovalBroker) -> None:
        self.passkeys = passkeys
        self.approvals = approvals

    async def page(self, token: str, kind: str) -> LinkPage | str:
        """The page of a usable link, or why it cannot be used."""
        link = await self._usable(token, kind)
        if isinstance(link, str):
            return link
        if link.kind == ENROL:
            return LinkPage(ENROL, link.owner, "Enrol a passkey",
                            f"This adds a passkey for {link.owner}, to confirm approvals that need one. Use it "
                            "only if you are that person.")
        request = await self.approvals.get(link.approval_id or 0)
        assert request is not None  # _usable checked it
        return LinkPage(STEP_UP, link.owner, f"Confirm approval {request.id}",
                        f"{request.agent} asks to run {request.tool}. Confirm your approval with your passkey: "
                        "only then does it count.", call=arguments_text(request.arguments))

    async def options(self, token: str, kind: str) -> dict[str, Any] | str:
        link = await self._usable(token, kind)
        if isinstance(link, str):
            return link
        return await self.passkeys.options(token, link)

    async def finish(self, token: str, kind: str, credential: dict[str, Any]) -> Finished:
        link = await self._usable(token, kind)
        if isinstance(link, str):
            return Finished(False, link, gone=True)
        if link.kind == ENROL:
            enrolled = await self.passkeys.enrol(token, credential)
            if isinstance(enrolled, str):
                return Finished(False, enrolled)
            return Finished(True, f"Passkey {enrolled} enrolled for {link.owner}. You can close this page.")
        confirmed = await self.passkeys.confirm(token, credential)
        if isinstance(confirmed, str):
            return Finished(False, confirmed)
        return await self._count(confirmed)

    async def _count(self, confirmed: Confirmed) -> Finished:
        """The confirmed approval, through the normal decision: who may decide is checked again now."""
        result = await self.approvals.decide(confirmed.approval_id, confirmed.verdict, by=confirmed.decider,
                                             stepped_up=True)
        if result.won or result.voted:
            return Finished(True, f"Confirmed with passkey {confirmed.passkey_id}. {result.message} "
                                  "You can close this page.")
        return Finished(False, result.message)

    async def _usable(self, token: str, kind: str) -> OpenLink | str:
        link = await self.passkeys.open_link(token, kind)
        if isinstance(link, str) or link.kind == ENROL:
            return link
        request = await self.approvals.get(link.approval_id or 0)
        if request is None:
            return "This link is not valid."
        if request.settled:
            return f"This request is closed: {request.summary()}."
        if request.expires_at <= self.approvals.clock.now():
            return "This request has expired: nothing can be approved any more."
        return link
