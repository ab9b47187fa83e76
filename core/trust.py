"""Sender trust: what a person may make the bot do depends on who they are on the platform.

Channel adapters only label a sender from platform facts (``ChannelPort.sender_trust``: a full member, a
guest account, someone from another organisation, a bot); core decides everything else here: BOT_ADMINS
are ``admin``, an unknown label counts as a guest (fail closed), a turn runs at the least-trusted level of
everyone whose words it took in, and restricted levels (guest, external, bot) cannot make gated tools run,
approve, provide credentials or create schedules unless a ``[[policies]]`` rule names their level.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime
from typing import Any, Protocol

from core.people import People
from core.policies import TRUST_LEVELS  # one list of names: policies match on them
from core.ports import ChannelPort

log = logging.getLogger(__name__)


class Trust(enum.StrEnum):
    ADMIN = "admin"
    MEMBER = "member"
    GUEST = "guest"
    EXTERNAL = "external"
    BOT = "bot"


# Higher is more trusted. A bot's message can carry anyone's text (an alert, a webhook): the lowest.
RANK = {Trust.ADMIN: 4, Trust.MEMBER: 3, Trust.GUEST: 2, Trust.EXTERNAL: 1, Trust.BOT: 0}
RESTRICTED = frozenset({Trust.GUEST, Trust.EXTERNAL, Trust.BOT})
NOT_ALLOWED = "not allowed for this sender"


def least_trusted(levels: Iterable[Trust]) -> Trust | None:
    """The lowest of ``levels`` (None when there are none)."""
    return min(levels, key=RANK.__getitem__, default=None)


def is_restricted(level: str | None) -> bool:
    """Whether ``level`` is one of the levels that by default may not make gated tools run (None: a context
    that carries no sender, e.g. the operator's CLI, is not restricted)."""
    return level is not None and level in RESTRICTED


async def restricted(levels: SenderTrust | None, level: str | None, actor: str, action: str, subject: str,
                     **detail: Any) -> bool:
    """Whether ``level`` (a turn's, or a person's) is restricted; a refusal of ``action`` is audited when it is."""
    if not is_restricted(level):
        return False
    if levels is not None:
        await levels.refused(actor, str(level), action, subject, **detail)
    return True


class PortLookup(Protocol):
    def find(self, channel: str) -> ChannelPort | None: ...


Audit = Callable[[datetime, str, str, str, dict[str, Any]], Awaitable[None]]
# A session whose turns run at a level fixed when it was made (a schedule's firing: its creator's level at
# creation), or None for a session whose senders decide.
FixedLevel = Callable[[str], Awaitable[str | None]]


class Place(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def channel(self) -> str: ...
    @property
    def place(self) -> str | None: ...


class SenderTrust:
    """The trust level of a sender at a place, and the audit of what trust refused."""

    def __init__(self, ports: PortLookup, admins: tuple[str, ...], *, audit: Audit | None = None,
                 now: Callable[[], datetime] | None = None, fixed: FixedLevel | None = None,
                 people: People | None = None) -> None:
        self.ports = ports
        self.admins = admins
        self.people = people or People()  # BOT_ADMINS compared with the sender's channel
        self.fixed = fixed
        self._audit = audit
        self._now = now

    async def level(self, channel: str, sender: str | None, place: str | None) -> Trust:
        """``sender``'s level on ``channel``. Nobody (core's own work) and channels that cannot label (none
        registered under that name) are members; a label the platform could not give is a guest's."""
        if sender is not None and self.people.any(self.admins, sender, channel):
            return Trust.ADMIN
        if sender is None:  # core's own work (nobody's words)
            return Trust.MEMBER
        port = self.ports.find(channel)
        if port is None:  # no port here can say who this is (e.g. not configured in this process)
            log.warning("trust of %s on %s unknown (no such channel here): counted as a guest", sender, channel)
            return Trust.GUEST
        try:
            label = await port.sender_trust(sender, place)
        except Exception as exc:  # a platform failure is not a reason to trust more
            log.warning("trust of %s on %s unknown (%s): counted as a guest", sender, channel, type(exc).__name__)
            label = None
        if label is None or label == Trust.ADMIN or label not in TRUST_LEVELS:  # only BOT_ADMINS make an admin
            return Trust.GUEST
        return Trust(label)

    async def of_turn(self, session: Place, senders: Iterable[str | None]) -> Trust:
        """The level a turn of ``session`` runs at: a level fixed for the session (a schedule's firing), else
        the least-trusted among ``senders`` (everyone whose words are in the conversation)."""
        if self.fixed is not None and (level := await self.fixed(session.id)) is not None:
            return Trust(level) if level in TRUST_LEVELS else Trust.GUEST
        return await self.of_senders(session.channel, senders, session.place)

    async def of_senders(self, channel: str, senders: Iterable[str | None], place: str | None) -> Trust:
        """The least-trusted level among ``senders`` (everyone whose words a turn took in)."""
        levels = [await self.level(channel, sender, place) for sender in dict.fromkeys(senders)]
        return least_trusted(levels) or Trust.MEMBER

    async def demoted(self, channel: str, sender: str, place: str | None,
                      then: str | None) -> tuple[Trust, Trust] | None:
        """(level now, level ``then``) when ``sender`` no longer holds the authority they had ``then`` (e.g. a
        schedule's creator, at its creation: None counts as a member): restricted now, or ranked lower."""
        was = Trust(then) if then in TRUST_LEVELS else Trust.MEMBER
        now = await self.level(channel, sender, place)
        if is_restricted(now) or RANK[now] < RANK[was]:
            return now, was
        return None

    async def refused(self, actor: str, level: str, action: str, subject: str, **detail: Any) -> None:
        """Audit a refusal by trust: who, at which level, what they could not do."""
        log.info("trust: %s (%s) may not %s %s", actor, level, action, subject)
        if self._audit is not None and self._now is not None:
            await self._audit(self._now(), actor, "trust.refused", subject,
                              {"level": level, "action": action, **detail})
