"""The channels the bot listens in (``[slack] listen_channels``): where a message that does not mention the bot still
starts a turn, whose answer is optional. Only the translation is here: which channel ids those are. Whether the
message starts a turn (the per-minute rate, bots, dedupe) is core's (``Inbound.listen_per_minute``).

Ids are taken as configured; ``#names`` are resolved to ids through the port's channel lookup (cached there), per
workspace, and looked at again every few minutes: a channel created (or the bot invited) later starts to count
without a restart.
"""

from __future__ import annotations

import asyncio
import logging
import time

from channels.slack.port import SlackPort
from channels.slack.workspaces import current_team
from core.errors import ToolError

log = logging.getLogger(__name__)

RESOLVE_AGAIN_S = 300.0


class ListeningChannels:
    def __init__(self, port: SlackPort, channels: tuple[str, ...], per_minute: int) -> None:
        self.port = port
        self.per_minute = per_minute
        self._ids = frozenset(c for c in channels if not c.startswith("#"))
        self._names = tuple(c for c in channels if c.startswith("#"))
        self._resolved: dict[str, tuple[float, frozenset[str]]] = {}  # workspace → (when, the names' ids)
        self._lock = asyncio.Lock()  # a burst of messages resolves the names once

    async def rate_in(self, channel: str) -> int | None:
        """Unaddressed turns a minute in ``channel`` (of the workspace in scope), or None: not listened in."""
        if channel in self._ids:
            return self.per_minute
        if not self._names:
            return None
        return self.per_minute if channel in await self._named() else None

    async def _named(self) -> frozenset[str]:
        team = current_team() or ""
        cached = self._resolved.get(team)
        if cached is not None and time.monotonic() - cached[0] < RESOLVE_AGAIN_S:
            return cached[1]
        async with self._lock:
            cached = self._resolved.get(team)
            if cached is not None and time.monotonic() - cached[0] < RESOLVE_AGAIN_S:
                return cached[1]
            found = set()
            for name in self._names:
                try:
                    found.add(await self.port.channel_id(name))
                except ToolError:
                    log.warning("listen_channels: there is no channel %s that the bot can see", name)
                except Exception as exc:  # Slack unreachable: not listening there until the next look
                    log.warning("listen_channels: looking up %s failed: %s", name, type(exc).__name__)
            ids = frozenset(found)
            self._resolved[team] = (time.monotonic(), ids)
            return ids

    def forget(self, team: str) -> None:
        """A workspace re-installed or removed: its names are looked up again."""
        self._resolved.pop(team, None)
