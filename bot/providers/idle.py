"""The idle watchdog of a streamed answer (LLM_IDLE_TIMEOUT_S): a stream that sends nothing for that long is cancelled
and has failed, for good (``stalled``: never retried; the fallback model answers, or the turn fails).

It guards one model call's stream only, from its head to its end: tools running and people deciding happen between
model calls, where no watchdog exists. Each piece that arrives only notes the time (no timer is moved per piece); the
one timer, when it fires early, sets itself again for what is left.
"""

from __future__ import annotations

import asyncio
from types import TracebackType

from core.errors import ProviderError


class IdleWatchdog:
    def __init__(self, idle_s: float) -> None:
        self.idle_s = idle_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timeout: asyncio.Timeout | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._last = 0.0

    def touch(self) -> None:
        """Something arrived."""
        assert self._loop is not None
        self._last = self._loop.time()

    async def __aenter__(self) -> IdleWatchdog:
        self._loop = asyncio.get_running_loop()
        self._timeout = asyncio.timeout(None)
        await self._timeout.__aenter__()
        self._last = self._loop.time()
        self._timer = self._loop.call_at(self._last + self.idle_s, self._check)
        return self

    def _check(self) -> None:
        assert self._loop is not None and self._timeout is not None
        due = self._last + self.idle_s
        if self._loop.time() >= due:
            self._timeout.reschedule(self._loop.time())  # cancels the reading task now
        else:
            self._timer = self._loop.call_at(due, self._check)

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        trace: TracebackType | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        assert self._timeout is not None
        try:
            await self._timeout.__aexit__(kind, error, trace)
        except TimeoutError:
            raise ProviderError("stalled", f"the model's stream sent nothing for {self.idle_s:g} s "
                                "(LLM_IDLE_TIMEOUT_S)", retryable=False) from None
