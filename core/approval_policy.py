"""Who may decide a parked request (approvals and credentials), and what a decision achieved."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from core.model import ApprovalInfo, ApprovalStatus, SessionInfo
from core.people import REQUESTER, People
from core.trust import NOT_ALLOWED, SenderTrust, is_restricted


class GroupResolver(Protocol):
    async def members(self, group_id: str) -> set[str]:
        """User ids in a user group (e.g. a Slack user group ``S…``)."""
        ...


class ApprovalPolicy:
    """Who may decide: admins always; approvers by user id, by user group, or as the requester. People are
    compared with their channel (``core.people``): every caller says which channel the person acting is of."""

    def __init__(self, approvers: tuple[str, ...], admins: tuple[str, ...], groups: GroupResolver | None = None,
                 trust: SenderTrust | None = None, people: People | None = None):
        self.approvers = approvers
        self.admins = admins
        self.groups = groups
        self.trust = trust  # senders' trust levels (None: everyone counts as a member)
        self.people = people or People()

    async def untrusted(self, user: str, session: SessionInfo, action: str, subject: str) -> str | None:
        """Why ``user`` may not ``action`` (approve, provide) in ``session`` because of their trust level, audited;
        None when their level allows it. Guests, people from other organisations and bots decide nothing."""
        if self.trust is None:
            return None
        level = await self.trust.level(session.channel, user, session.place)
        if not is_restricted(level):
            return None
        await self.trust.refused(user, level, action, subject, session=session.id)
        return (f"You can't {action} this: {NOT_ALLOWED} ({level}). Guests, people from other organisations "
                "and bots can't approve requests or provide credentials here.")

    async def may_decide(self, user: str, requester: str | None, agent_approvers: tuple[str, ...] = (), *,
                         channel: str | None) -> bool:
        """Whether ``user`` (of ``channel``) may decide for something ``requester`` asked for (approvals and
        credentials). ``channel`` None only where the caller cannot know it (``Controls.may_control``): then ids
        are compared alone."""
        if not user:
            return False
        if self.is_admin(user, channel=channel):
            return True
        approvers = agent_approvers or self.approvers
        if self.people.any(approvers, user, channel) or (REQUESTER in approvers and user == requester):
            return True
        for group in self.people.groups(approvers, channel):
            if self.groups is not None and user in await self.groups.members(group):
                return True
        return False

    def deciders(self, requester: str | None, agent_approvers: tuple[str, ...] = ()) -> tuple[str, ...]:
        """Who is asked to decide (user and group ids, ``requester`` resolved; admins may too but are not
        named): what a channel shows as "waiting for approval from …"."""
        named = (requester if a == REQUESTER else a for a in (agent_approvers or self.approvers))
        return tuple(dict.fromkeys(a for a in named if a))

    def is_admin(self, user: str, *, channel: str | None) -> bool:
        return self.people.any(self.admins, user, channel)


@dataclass(frozen=True)
class DecideResult:
    """What a click (or an operator) achieved: ``won`` when it settled the request."""

    won: bool
    request: ApprovalInfo | None
    refused: str | None = None  # the clicker may not decide: why
    late: bool = False  # it was still pending, but past its expiry: settled as expired instead
    voted: bool = False  # a vote counted towards the request's quorum (``won`` when it settled it)
    step_up: str | None = None  # nothing counted yet: how the approver confirms with a passkey (told privately)

    @property
    def expired(self) -> bool:
        """The decision came after the request ran out of time (now, or earlier): nothing was decided."""
        return not self.won and self.request is not None and self.request.status == ApprovalStatus.EXPIRED

    @property
    def message(self) -> str:
        if self.refused is not None:
            return self.refused
        if self.request is None:
            return "That approval request does not exist."
        if self.step_up is not None:
            return self.step_up
        if self.won:
            return self.request.summary() + "."
        if self.voted:
            return f"Your approval is counted: {self.request.progress()}."
        if not self.request.settled:  # a second vote by the same person: still one
            return f"You have already voted on this request: {self.request.progress()}."
        if self.late:
            return (f"Too late: request {self.request.id} expired at {self.request.expires_at:%Y-%m-%d %H:%M:%S} UTC; "
                    "nothing was approved or denied, and it did not run.")
        return f"Already settled: {self.request.summary()}."
