"""The one way core waits for something recorded in the database (an outcome, a decision, a receipt).

The database is the truth; this process only waits. Whoever records a result here calls ``wake`` so
its waiters return at once; a result recorded by another process (a replica, the operator's CLI) is
seen by re-reading every ``poll_s``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class Waiters(Generic[V]):
    def __init__(self, poll_s: float) -> None:
        self.poll_s = poll_s
        self._events: dict[Hashable, asyncio.Event] = {}
        self._counts: dict[Hashable, int] = {}

    def wake(self, key: Hashable) -> None:
        """Something about ``key`` was recorded: its waiters read the database again now."""
        event = self._events.get(key)
        if event is not None:
            event.set()

    def waiting(self, key: Hashable) -> bool:
        return key in self._events

    async def wait(self, key: Hashable, load: Callable[[], Awaitable[V | None]], *,
                   timeout_s: float | None = None) -> V | None:
        """Until ``load`` returns a value (returned), or ``timeout_s`` passes (None)."""
        event = self._events.setdefault(key, asyncio.Event())
        self._counts[key] = self._counts.get(key, 0) + 1
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        try:
            while True:
                event.clear()  # cleared before the read: a wake during the read is not lost
                value = await load()
                if value is not None:
                    return value
                step = self.poll_s if deadline is None else min(self.poll_s, deadline - loop.time())
                if step <= 0:
                    return None
                try:  # asyncio.timeout, not wait_for: 3.11's wait_for loses a cancel that races a wake
                    async with asyncio.timeout(step):
                        await event.wait()
                except TimeoutError:
                    pass
        finally:
            self._counts[key] -= 1
            if not self._counts[key]:
                del self._counts[key]
                self._events.pop(key, None)
