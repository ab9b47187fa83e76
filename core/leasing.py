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

    async def take(self, session_id: str) -> bool:
        assert self.store is not None
        return await self.store.acquire(lease_name(session_id), self.holder, timedelta(seconds=self.ttl_s),
                                        self.clock.now())

    async def release(self, session_id: str) -> None:
        assert self.store is not None
        await self.store.release(lease_name(session_id), self.holder)

    async def heartbeat(self, session_id: str, on_lost: Callable[[], None]) -> None:
        """Renew the session's lease until cancelled; if another replica took it over, call ``on_lost``."""
        assert self.store is not None
        while True:
            await asyncio.sleep(self.ttl_s / 3)
            if not await self.store.renew(lease_name(session_id), self.holder, timedelta(seconds=self.ttl_s),
                                          self.clock.now()):
                # Another replica took the session over (we stalled past the lease): stop, never run twice.
                log.error("lost the lease on %s; stopping its turn here", session_id)
                on_lost()
                return

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
