"""Waiting for an input's outcome (answered, failed, cancelled or refused), across processes."""

from __future__ import annotations

from collections.abc import Iterable

from core.model import Outcome
from core.store import InputStore
from core.waiting import Waiters


class OutcomeWaiters:
    """Callers waiting for an input's outcome (answered, failed, cancelled or refused), read from the
    database: woken at once when this process records it, by a re-read every ``poll_s`` when another
    process (a replica) does."""

    def __init__(self, inputs: InputStore, poll_s: float) -> None:
        self.inputs = inputs
        self._waiters: Waiters[Outcome] = Waiters(poll_s)

    async def wait(self, input_id: int) -> Outcome:
        outcome = await self._waiters.wait(input_id, lambda: self.inputs.outcome(input_id))
        assert outcome is not None  # no timeout: only a value ends the wait
        return outcome

    def wake(self, input_ids: Iterable[int]) -> None:
        """Their outcomes were recorded (or may have been): their waiters read them now."""
        for input_id in input_ids:
            self._waiters.wake(input_id)

    def any_for(self, input_ids: Iterable[int]) -> bool:
        return any(self._waiters.waiting(i) for i in input_ids)
