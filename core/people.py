"""People as core compares them: named with their channel (``slack:U123``, ``web:web``), so ids from two
platforms never collide.

A configured entry (BOT_APPROVERS, BOT_ADMINS, ``approvers`` and ``escalate_to`` in bot.toml) is ``requester``,
``<channel>:<id>``, or a bare id; a bare id belongs to the channel that claims its shape (``Claims``, given by the
wiring: Slack's ``U…``/``W…``/``S…``, the web chat's ``web``). Entries are kept as written (requests store and
show them so); only the comparison qualifies them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from core.oncall import is_oncall

REQUESTER = "requester"

# A bare entry → the channel it names a person or group of (None: no channel claims it).
Claims = Callable[[str], str | None]


def person(channel: str, user: str) -> str:
    """How core names ``user`` of ``channel``."""
    return f"{channel}:{user}"


@dataclass(frozen=True)
class Person:
    """Someone acting on a channel (a viewer of lists): what core compares configured entries with."""

    channel: str
    user: str


class People:
    """Compares configured entries with a person of a channel."""

    def __init__(self, claims: Claims | None = None) -> None:
        self._claims = claims

    def owner(self, entry: str) -> tuple[str | None, str]:
        """(channel, id) of an entry; the channel is None when nothing says it (no claims given)."""
        if ":" in entry:
            channel, _, ident = entry.partition(":")
            return channel, ident
        return (self._claims(entry) if self._claims is not None else None), entry

    def qualified(self, entry: str) -> str:
        channel, ident = self.owner(entry)
        return person(channel, ident) if channel is not None else ident

    def names(self, entry: str, user: str, channel: str | None) -> bool:
        """Whether ``entry`` names ``user`` of ``channel``. Ids are compared alone only for a caller that cannot
        know the channel (None, said where it is passed) and for a bare entry when no claims were given (core
        on its own, e.g. in tests: the wiring always gives them)."""
        if entry == REQUESTER or is_oncall(entry):  # a rota names people only once resolved (core.oncall)
            return False
        owner, ident = self.owner(entry)
        return ident == user and (channel is None or owner is None or owner == channel)

    def any(self, entries: Iterable[str], user: str, channel: str | None) -> bool:
        return any(self.names(entry, user, channel) for entry in entries)

    def groups(self, entries: Iterable[str], channel: str | None) -> list[str]:
        """The user groups among ``entries`` (ids starting with S), of ``channel`` when it is known."""
        found = []
        for entry in entries:
            owner, ident = self.owner(entry)
            if is_oncall(entry):
                continue
            if ident.startswith("S") and entry != REQUESTER and (channel is None or owner is None or owner == channel):
                found.append(ident)
        return found
