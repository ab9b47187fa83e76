"""Waiting for something a person settles (an approval, a credential): shared by both brokers.

The database holds the request; this process only waits. A decision made here wakes the waiter at
once (``Waiters.wake``); one made by another process (an operator's CLI, another replica) is seen
by polling. Running out of time or being cancelled settles the request too — exactly once, because
the broker's settle is a conditional update of a pending row.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Protocol, TypeVar

from core.clock import Clock


class Parked(Protocol):
    @property
    def id(self) -> int: ...
    @property
    def expires_at(self) -> datetime: ...
    @property
    def settled(self) -> bool: ...


P = TypeVar("P", bound=Parked)


class Waiters:
    def __init__(self, clock: Clock, poll_s: float) -> None:
        self.clock = clock
        self.poll_s = poll_s
        self._events: dict[int, asyncio.Event] = {}

    def wake(self, request_id: int) -> None:
        """Settled by this process: its waiter returns now, and need not announce it again."""
        event = self._events.get(request_id)
        if event is not None:
            event.set()

    async def wait(
        self,
        request: P,
        *,
        load: Callable[[int], Awaitable[P | None]],
        expire: Callable[[int], Awaitable[P]],
        cancel: Callable[[int], Awaitable[object]],
        settled_elsewhere: Callable[[P], None],
    ) -> P:
        """Until settled (by anyone), expired (then ``expire``), or cancelled (then ``cancel``, and re-raise)."""
        event = self._events.setdefault(request.id, asyncio.Event())
        try:
            while True:
                left = (request.expires_at - self.clock.now()).total_seconds()
                if left <= 0:
                    return await expire(request.id)
                try:
                    await asyncio.wait_for(event.wait(), min(left, self.poll_s))
                except TimeoutError:
                    pass
                current = await load(request.id)
                if current is not None and current.settled:
                    if not event.is_set():
                        settled_elsewhere(current)
                    return current
        except asyncio.CancelledError:
            await cancel(request.id)
            raise
        finally:
            self._events.pop(request.id, None)
