"""The channel contract: ``Channel`` (what the wiring starts, stops and serves) and ``ChannelPort`` (what core
calls on a channel), one port registered per channel name.

Adapters call core through ``core.gateway.Gateway``; core calls adapters only through these ports.
Delivering an answer is core's job (``core.delivery``): it records the answer in an outbox, asks the
session's port to ``deliver`` it, and records the ``Receipt`` (or retries) itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from aiohttp import web

from core.errors import InvalidInput
from core.model import SessionInfo


@dataclass(frozen=True)
class Receipt:
    """Where a delivered message landed on its platform (Slack: the first message's ts)."""

    ref: str


@dataclass(frozen=True)
class DeliveryId:
    """What an answer's messages carry, so a retry can tell whether an earlier attempt landed: the turn, and the
    database it was written in (``install``: random, made once per database, since turn ids repeat across
    databases). ``written_at``: no message older than the answer can be it."""

    install: str
    turn_id: int
    written_at: datetime


class ChannelPort(Protocol):
    """The services core needs from one channel. Every method may be called from any task."""

    @property
    def name(self) -> str: ...

    async def deliver(self, session: SessionInfo, text: str, *, delivery_id: DeliveryId,
                      resume: bool = False) -> Receipt:
        """Post ``text`` as the session's answer, carrying ``delivery_id`` (and the session) so a retry can find it.
        ``resume``: an earlier attempt may have posted part of it (a long answer is several messages):
        post only what did not land. Raises DeliveryFailed."""
        ...

    async def find_delivered(self, session: SessionInfo, delivery_id: DeliveryId) -> Receipt | None:
        """Before retrying: the receipt of an earlier attempt that did land after all, if any. Raises
        DeliveryFailed (retryable) when that cannot be known now."""
        ...

    async def resolve_destination(self, destination: str) -> str:
        """A destination as typed ("#ops", an id) to the platform's id, if the bot can post there.
        Raises InvalidInput with the reason otherwise."""
        ...

    async def group_members(self, group_id: str) -> set[str]:
        """The members of a user group named in BOT_APPROVERS / BOT_ADMINS (empty if unknown)."""
        ...

    async def post_notice(self, session: SessionInfo, text: str) -> bool:
        """A short notice in the session's place (best effort: failures are logged, not raised).
        True once the platform took it."""
        ...

    async def sender_trust(self, sender: str, place: str | None) -> str | None:
        """What the platform says about ``sender`` at ``place``: member, guest, external, bot, or None when
        unknown (core counts that as a guest; only BOT_ADMINS make an admin: ``core.trust``)."""
        ...

    async def fetch_file(self, source: str, max_bytes: int) -> bytes:
        """The content of a shared file (``Attachment.source``), at most ``max_bytes`` of it. Raises
        FetchFailed with the reason (too big, not the platform's own file host, refused, unreachable)."""
        ...


class Channel(Protocol):
    """One chat channel as the wiring runs it: its HTTP routes on the one server, started after recovery,
    stopped before the drain, closed after it. ``port`` is what core calls on it."""

    name: str
    started: bool

    @property
    def port(self) -> ChannelPort: ...

    def routes(self) -> list[web.RouteDef]: ...
    async def start(self) -> None: ...
    async def stop(self) -> None: ...  # takes no more input
    async def close(self) -> None: ...  # after the drain: what the drained turns still used


class Ports:
    """The registered ports by channel name (filled by the wiring before start)."""

    def __init__(self) -> None:
        self._ports: dict[str, ChannelPort] = {}

    def register(self, port: ChannelPort) -> None:
        self._ports[port.name] = port

    def get(self, channel: str) -> ChannelPort:
        port = self._ports.get(channel)
        if port is None:
            raise InvalidInput(f"no {channel} channel is configured")
        return port

    def find(self, channel: str) -> ChannelPort | None:
        return self._ports.get(channel)

    def all(self) -> list[ChannelPort]:
        return list(self._ports.values())

    async def members(self, group_id: str) -> set[str]:
        """A user group's members, as whichever channel knows the group reports them (``ApprovalPolicy``)."""
        found: set[str] = set()
        for port in self._ports.values():
            found |= await port.group_members(group_id)
        return found
