"""Core delivers answers itself: an outbox row per answer, sent through the session's port, retried until taken.

Path of an answer: ``ConversationStore.finish_turn`` writes it and its outbox row in one commit (the row
already claimed by this process) → ``TurnFinished`` → ``Deliveries`` asks the port to ``deliver`` it and
records the receipt. A failed attempt is retried with capped exponential backoff, across restarts and by
whichever replica claims the row, until the channel takes it or ``max_age_s`` passes; then it is given up,
counted, and the thread is told once the channel takes posts again. Before each retry the port is asked
whether an earlier attempt landed after all (``find_delivered``), so an answer is posted once.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass
from datetime import datetime, timedelta

from core.clock import Clock
from core.events import Event, EventBus, TurnFinished
from core.leasing import holder_name
from core.model import LIVE_TURN_STATUSES, DeliveryStatus, SessionInfo, TurnStatus
from core.ports import DeliveryFailed, Ports, Receipt
from core.store.deliveries import DeliveryStore, OutboxClaim
from core.waiting import Waiters

log = logging.getLogger(__name__)

EMPTY_ANSWER = "(the model returned an empty answer)"


@dataclass(frozen=True)
class DeliveryOutcome:
    """How a turn's answer left: where it landed (``ref``), or why it never will (``error``)."""

    ref: str | None
    error: str | None


@dataclass(frozen=True)
class DeliveryConfig:
    max_age_s: float = 3600.0  # DELIVERY_MAX_AGE_S: how long an undelivered answer is retried
    retry_base_s: float = 1.0  # the first retry's delay; doubled each time, up to retry_max_s
    retry_max_s: float = 300.0
    # One attempt's claim (LEASE_TTL_S): a dead claimer's row is taken over after this long. An attempt
    # is cut off before its claim runs out, so two processes never post the same answer at once.
    claim_s: float = 30.0
    poll_s: float = 2.0  # how often rows claimable by anyone (other replicas' failures) are looked for


class Deliveries:
    def __init__(self, store: DeliveryStore, ports: Ports, bus: EventBus, clock: Clock, *, holder: str | None = None,
                 config: DeliveryConfig = DeliveryConfig()) -> None:
        self.store = store
        self.ports = ports
        self.clock = clock
        self.holder = holder or holder_name()  # whose claim a row is under, among replicas
        self.config = config
        self.waiters: Waiters[DeliveryOutcome] = Waiters(config.poll_s)
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        bus.subscribe(self._on_event)

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self, *, single_process: bool) -> None:
        """Resume every pending row. With one process per database, claims left by a dead one end now."""
        if single_process:
            released = await self.store.release_claims(self.clock.now())
            if released:
                log.info("%d answer(s) left mid-delivery by the last run: retrying", released)
        self._loop_task = asyncio.create_task(self._loop(), name="deliveries")

    async def stop(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
            self._loop_task = None

    # -- what the rest of core calls ------------------------------------------------------------

    def outbox(self, channel: str) -> OutboxClaim | None:
        """For ``finish_turn``: the claim its outbox row starts with, or None when no port delivers there."""
        if self.ports.find(channel) is None:
            return None
        return OutboxClaim(self.holder, self.clock.now() + timedelta(seconds=self.config.claim_s))

    async def wait(self, turn_id: int) -> DeliveryOutcome:
        """Until the turn's answer is delivered or given up (recorded by this process or another)."""
        outcome = await self.waiters.wait(turn_id, lambda: self.outcome(turn_id))
        assert outcome is not None  # no timeout: every row ends, delivered or given up
        return outcome

    async def outcome(self, turn_id: int) -> DeliveryOutcome | None:
        # The turn first: it ends in the same commit that writes its outbox row, so once it reads as
        # finished, the row (if any) is there to read.
        state = await self.store.turn_state(turn_id)
        if state is None:
            return DeliveryOutcome(None, "unknown turn")
        status, channel = state
        if status != TurnStatus.FINISHED:
            return None if status in LIVE_TURN_STATUSES else DeliveryOutcome(None, status)
        row = await self.store.get(turn_id)
        if row is None:
            if self.ports.find(channel) is None:
                return DeliveryOutcome(None, f"no {channel} channel is configured")
            return DeliveryOutcome(None, "the answer was not queued for delivery")
        if row.status == DeliveryStatus.DELIVERED:
            return DeliveryOutcome(row.ref, None)
        if row.status == DeliveryStatus.GIVEN_UP:
            return DeliveryOutcome(None, f"not delivered: {row.last_error}")
        return None

    # -- attempts -------------------------------------------------------------------------------

    async def _on_event(self, event: Event) -> None:
        # The first attempt, at once and in order per session (the bus serializes a session's events).
        if isinstance(event, TurnFinished) and self.ports.find(event.channel) is not None:
            await self._attempt(event.turn.id, event.session, event.text, first=True)

    async def _loop(self) -> None:
        while True:
            try:
                for turn_id in await self.store.due(self.clock.now()):
                    now = self.clock.now()
                    pending = await self.store.claim(turn_id, self.holder, now,
                                                     now + timedelta(seconds=self.config.claim_s))
                    if pending is not None:
                        await self._attempt(turn_id, pending.session, pending.text or EMPTY_ANSWER, first=False)
                wait_s = await self._until_next()
            except Exception:
                log.exception("delivery loop failed; retrying")
                wait_s = self.config.poll_s
            self._wake.clear()
            try:  # asyncio.timeout, not wait_for: 3.11's wait_for loses a cancel that races a wake-up
                async with asyncio.timeout(wait_s):
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def _until_next(self) -> float:
        due = await self.store.next_due()
        if due is None:
            return self.config.poll_s
        return min(self.config.poll_s, max(0.0, (due - self.clock.now()).total_seconds()))

    async def _attempt(self, turn_id: int, session: SessionInfo, text: str, *, first: bool) -> None:
        port = self.ports.find(session.channel)
        try:
            if port is None:
                raise DeliveryFailed(f"no {session.channel} channel is configured", retryable=True)
            async with asyncio.timeout(self.config.claim_s * 0.8):
                receipt: Receipt | None = None if first else await port.find_delivered(session, turn_id)
                if receipt is None:
                    receipt = await port.deliver(session, text, delivery_id=turn_id, resume=not first)
        except asyncio.CancelledError:
            raise  # shutdown: the claim runs out (or is released at the next start) and the row is retried
        except DeliveryFailed as exc:
            await self._failed(turn_id, exc.error, retryable=exc.retryable, retry_after_s=exc.retry_after_s)
            return
        except Exception as exc:  # e.g. a connection error an adapter did not translate: try again later
            log.warning("delivery of turn %s failed: %s: %s", turn_id, type(exc).__name__, exc)
            await self._failed(turn_id, type(exc).__name__, retryable=True, retry_after_s=None)
            return
        if await self.store.delivered(turn_id, receipt.ref, self.clock.now()):
            log.info("answer of turn %s delivered (%s)", turn_id, receipt.ref)
        self.waiters.wake(turn_id)
        await self._tell_given_up(session.channel)

    async def _failed(self, turn_id: int, error: str, *, retryable: bool, retry_after_s: float | None) -> None:
        row = await self.store.get(turn_id)
        if row is None or row.status != DeliveryStatus.PENDING:
            return
        now = self.clock.now()
        deadline = row.created_at + timedelta(seconds=self.config.max_age_s)
        if not retryable or now >= deadline:
            if await self.store.give_up(turn_id, error, now):
                log.error("answer of turn %s given up after %d attempt(s): %s%s", turn_id, row.attempts, error,
                          "" if retryable else " (retrying cannot help)")
            self.waiters.wake(turn_id)
            return
        delay = min(self.config.retry_max_s, self.config.retry_base_s * 2 ** max(0, row.attempts - 1))
        delay *= random.uniform(0.8, 1.2)  # replicas retrying the same outage do not march in step
        if retry_after_s is not None:
            delay = max(delay, retry_after_s)
        at = min(now + timedelta(seconds=delay), deadline)
        log.warning("answer of turn %s not delivered (attempt %d: %s); next try in %.1f s",
                    turn_id, row.attempts, error, (at - now).total_seconds())
        await self.store.retry_later(turn_id, self.holder, error, at)
        self._wake.set()

    async def _tell_given_up(self, channel: str) -> None:
        """The channel takes posts again: tell each thread whose answer was given up (once, by one process)."""
        port = self.ports.find(channel)
        if port is None:
            return
        for turn_id in await self.store.untold(channel):
            told = await self.store.take_telling(turn_id)
            if told is None:
                continue
            await port.post_notice(told.session, _given_up_text(told.row.created_at, told.row.last_error))


def _given_up_text(written_at: datetime, error: str | None) -> str:
    return (f"An answer I wrote here at {written_at:%Y-%m-%d %H:%M} UTC could not be posted "
            f"({error or 'unknown error'}) and was given up. Ask again if you still need it.")
