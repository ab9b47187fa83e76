"""Session leases (SPEC §5): with several replicas, one process at a time runs a session.

A turn driver takes its session's lease before running it and renews it while it holds it; a replica
that stops renewing loses its sessions after ``ttl_s``. The sweeper then lets a live replica recover the
turns a dead one left running. Without a lease store (a single process) every session is this one's.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta

from core.clock import Clock
from core.store import LeaseStore
from core.store.leases import GiveBack, LeaseClaim, LeaseTake

log = logging.getLogger(__name__)


HOLDER_MAX = 64  # leases.holder and deliveries.claimed_by are VARCHAR(64)


def holder_name() -> str:
    """This process among the replicas: host, pid and a random part (a restarted pid is a new holder), at most
    HOLDER_MAX characters: a long hostname (a pod's, up to 63) keeps its start and end, "~" between."""
    suffix = f":{os.getpid()}:{uuid.uuid4().hex[:8]}"
    host, room = socket.gethostname(), HOLDER_MAX - len(suffix)
    if len(host) > room:
        head = (room - 1) // 2
        host = f"{host[:head]}~{host[len(host) - (room - 1 - head):]}"
    return host + suffix


def lease_name(session_id: str) -> str:
    return f"session:{session_id}"


class SessionLeases:
    def __init__(self, store: LeaseStore | None, clock: Clock, ttl_s: float) -> None:
        self.store = store
        self.clock = clock
        self.ttl_s = ttl_s
        self.holder = holder_name()
        self._sweeper: asyncio.Task[None] | None = None

    @property
    def enabled(self) -> bool:
        return self.store is not None

    async def unheld(self, sessions: list[str]) -> list[str]:
        """The sessions among ``sessions`` whose lease no live holder has (its holder died)."""
        assert self.store is not None
        live = await self.store.live_holders([lease_name(s) for s in sessions], self.clock.now())
        return [s for s in sessions if lease_name(s) not in live]

    def taker(self, session_id: str) -> LeaseTake:
        """Takes the session's lease inside the transaction that starts its turn (``InputStore.take_batch``)."""
        assert self.store is not None
        claim = LeaseClaim(lease_name(session_id), self.holder, timedelta(seconds=self.ttl_s))
        # now: read here, on the loop: the transaction may run on the database's thread
        return LeaseTake(self.store, claim, self.clock.now())

    async def release(self, session_id: str) -> None:
        assert self.store is not None
        await self.store.release(lease_name(session_id), self.holder)

    async def heartbeat(self, session_id: str, on_lost: Callable[[], None]) -> None:
        """Renew the session's lease until cancelled. If another replica took it over, or renewing keeps
        failing (the database unreachable) until the lease would have run out, call ``on_lost``: past that
        moment another replica may take the session, and a turn must never run twice."""
        assert self.store is not None
        loop = asyncio.get_running_loop()
        renewed = loop.time()
        while True:
            await asyncio.sleep(self.ttl_s / 3)
            try:
                held = await self.store.renew(lease_name(session_id), self.holder, timedelta(seconds=self.ttl_s),
                                              self.clock.now())
            except Exception as exc:  # e.g. the database restarting: try again, until the lease is gone
                if loop.time() - renewed < self.ttl_s * 2 / 3:
                    log.warning("could not renew the lease on %s (%s); trying again", session_id, type(exc).__name__)
                    continue
                held = False
            if not held:
                log.error("lost the lease on %s; stopping its turn here", session_id)
                on_lost()
                return
            renewed = loop.time()

    def hold(self, session_id: str, on_lost: Callable[[], None]) -> LeaseHold:
        return LeaseHold(self, session_id, on_lost)

    def start_sweeper(self, recover: Callable[[], Awaitable[None]]) -> None:
        """Every ``ttl_s``, run ``recover`` (the turns of replicas whose leases ran out)."""
        self._sweeper = asyncio.create_task(self._sweep(recover), name="turns:sweep")

    def stop_sweeper(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()

    async def _sweep(self, recover: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(self.ttl_s)
            try:
                await recover()
            except Exception:
                log.exception("recovering abandoned turns failed")


class LeaseHold:
    """One turn driver's hold on its session's lease. Taken in the transaction that starts a turn
    (``taker``), given back in the one that ends it when nothing waits (``releaser``): a turn costs the
    lease no transaction of its own. Without leases (one process) it is never held and does nothing."""

    def __init__(self, leases: SessionLeases, session_id: str, on_lost: Callable[[], None]) -> None:
        self._leases = leases
        self._session_id = session_id
        self._on_lost = on_lost
        self._heartbeat: asyncio.Task[None] | None = None
        self.held = False
        self._given_back: bool | None = None  # what the last turn's end did, once it committed
        self._pending: GiveBack | None = None  # what the running turn's end does, until it commits

    def taker(self) -> LeaseTake | None:
        """For the transaction that starts the next turn (None without leases). Also when held: it extends
        a lease still ours and finds one another replica took meanwhile (we stalled past it), so no turn
        ever starts on a lease this process only believes it holds."""
        return self._leases.taker(self._session_id) if self._leases.enabled else None

    def took(self) -> None:
        self.held = True
        self._given_back = None
        if self._heartbeat is None or self._heartbeat.done():
            self._heartbeat = asyncio.create_task(self._leases.heartbeat(self._session_id, self._lost))

    def lost(self) -> None:
        """Another replica holds it now (a turn's start found so): nothing to renew or give back."""
        self._let_go()

    def _lost(self) -> None:
        self.held = False  # the heartbeat ends by itself
        self._heartbeat = None
        self._on_lost()

    def releaser(self) -> GiveBack | None:
        """For the transaction that ends the turn (``finish_turn``'s ``give_back``): gives the lease back unless a
        message waits. What it did counts only once that transaction committed (``ended``)."""
        if not self.held or self._leases.store is None:
            return None
        self._pending = GiveBack(lease_name(self._session_id), self._leases.holder, self._session_id)
        return self._pending

    def ended(self) -> None:
        """The turn's end committed: if it gave the lease back, it is not held any more."""
        pending, self._pending = self._pending, None
        if pending is not None and pending.given_back is not None:
            self._given_back = pending.given_back
            if pending.given_back:
                self._let_go()

    async def release_if_idle(self) -> bool:
        """After a turn: give the lease back unless a message waits (another replica's arrivals wake no
        driver here). True when it is not held any more. Costs nothing when the turn's end already tried."""
        if not self.held:
            return True
        tried, self._given_back = self._given_back, None
        if tried is False:  # the turn's end found a message waiting, just now
            return False
        assert self._leases.store is not None
        if await self._leases.store.release_if_idle(lease_name(self._session_id), self._leases.holder,
                                                    self._session_id):
            self._let_go()
            return True
        return False

    def _let_go(self) -> None:
        self.held = False
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            self._heartbeat = None

    async def close(self) -> None:
        held = self.held
        self._let_go()
        if held:
            await asyncio.shield(self._leases.release(self._session_id))
