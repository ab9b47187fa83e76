"""Waiting for something a person settles (any kind of core.requests: an approval, a credential, a connection).

The database holds the request; this process only waits, on core.waiting: a decision made here
wakes the waiter at once, one made by another process (an operator's CLI, another replica) is seen
by re-reading. Running out of time settles the request (exactly once: the broker's settle is a
conditional update of a pending row). Being cancelled settles it only when the turn was stopped
(a person's stop): a shutdown, or a replica losing the session, leaves it pending, so its buttons
keep working for whichever process continues the turn. A parked turn holds no concurrency slot
(``Hold.on_park``); once its request is settled it takes one again (``on_unpark``) before it runs on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, TypeVar

from core import waiting
from core.clock import Clock


class Parked(Protocol):
    @property
    def id(self) -> int: ...
    @property
    def expires_at(self) -> datetime: ...
    @property
    def settled(self) -> bool: ...


P = TypeVar("P", bound=Parked)


async def _nothing() -> None:
    return None


@dataclass(eq=False)
class Hold:
    """One turn's share in parking, between the turn (which parks) and its driver (which may stop it,
    or set it aside at shutdown). Reached through ``HOLD``, set in the turn's task; used only by a
    wait for that turn (a task the turn spawned to outlive it, e.g. a schedule's destination wait,
    inherits the variable but waits for no turn)."""

    turn_id: int
    on_park: Callable[[], None] = field(default=lambda: None)  # the turn just parked: its slot is free
    on_unpark: Callable[[], Awaitable[None]] = field(default=_nothing)  # before it runs on: take a slot
    parked: int = 0  # requests the turn waits on right now (or waits for a slot after)
    stopped: bool = False  # a person's stop: cancelling the turn settles what it waits on

    def stop(self) -> None:
        self.stopped = True

    def park(self) -> None:
        self.parked += 1
        if self.parked == 1:
            self.on_park()

    async def unpark(self) -> None:
        """The wait is over; the turn runs on once ``on_unpark`` returns. Until then it still counts as
        parked: nothing has started, so a shutdown may set it aside. Cancelled: it runs on no further."""
        try:
            if self.parked == 1:
                await self.on_unpark()
        finally:
            self.parked -= 1


HOLD: ContextVar[Hold | None] = ContextVar("parking_hold", default=None)


class Waiters:
    def __init__(self, clock: Clock, poll_s: float) -> None:
        self.clock = clock
        self._waiters: waiting.Waiters[Parked] = waiting.Waiters(poll_s)
        self._settled_here: set[int] = set()
        self._expected: set[int] = set()  # parked for a wait that has not begun yet (a batch's later calls)

    def expect(self, request_id: int, expected: bool = True) -> None:
        """A wait on it will begin later in this process (or, ``expected`` False, never will): settled here before
        then, it is not announced a second time when the wait begins."""
        if expected:
            self._expected.add(request_id)
        else:
            self._expected.discard(request_id)
            self._settled_here.discard(request_id)

    def wake(self, request_id: int) -> None:
        """Settled by this process: its waiter returns now, and need not announce it again."""
        if self._waiters.waiting(request_id) or request_id in self._expected:
            self._settled_here.add(request_id)
        self._waiters.wake(request_id)

    async def wait(
        self,
        request: P,
        *,
        turn_id: int | None,
        load: Callable[[int], Awaitable[P | None]],
        expire: Callable[[int], Awaitable[P]],
        cancel: Callable[[int], Awaitable[object]],
        settled_elsewhere: Callable[[P], None],
    ) -> P:
        """Until settled (by anyone), or expired (then ``expire``). Cancelled: ``cancel`` first if the
        turn it belongs to (``turn_id``; None: no turn's) was stopped, then re-raised."""
        key = request.id
        found: list[P] = []  # typed as P: core.waiting holds any Parked

        async def settled() -> Parked | None:
            if self._left(request) <= 0:  # counted on the clock, from the request's own expiry
                found.append(await expire(key))
                return found[-1]
            current = await load(key)
            if current is None or not current.settled:
                return None
            found.append(current)
            return current

        hold = HOLD.get()
        if hold is not None and hold.turn_id != turn_id:
            hold = None
        if hold is not None:
            hold.park()
        over = False
        try:
            while await self._waiters.wait(key, settled, timeout_s=max(self._left(request), 0.0)) is None:
                pass  # its time ran out: the next read settles it as expired
            here = key in self._settled_here
            self._expected.discard(key)
            if not self._waiters.waiting(key):
                self._settled_here.discard(key)
            if not here:
                settled_elsewhere(found[-1])
            over = True
        except asyncio.CancelledError:
            if hold is not None and hold.stopped:
                await cancel(key)
            raise
        finally:
            if hold is not None and not over:
                hold.parked -= 1  # the turn ends here: it takes no slot again
        if hold is not None:
            await hold.unpark()  # settled: a stop from here on cancels the turn, not the request
        return found[-1]

    def _left(self, request: Parked) -> float:
        return (request.expires_at - self.clock.now()).total_seconds()


class TurnSlot:
    """A turn's share of MAX_CONCURRENT_TURNS. Given back while the turn is parked on a person (so
    parked turns cannot keep everyone else from an answer), taken again before it runs on."""

    def __init__(self, slots: asyncio.Semaphore) -> None:
        self._slots = slots
        self.held = False

    async def take(self) -> None:
        if not self.held:
            await self._slots.acquire()  # cancelled while waiting: the semaphore keeps nothing
            self.held = True

    def give_back(self) -> None:
        if self.held:
            self.held = False
            self._slots.release()
