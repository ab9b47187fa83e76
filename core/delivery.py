"""Core delivers answers itself: an outbox row per answer, sent through the session's port, retried until taken.

Path of an answer: ``ConversationStore.finish_turn`` writes it and its outbox row in one commit (the row
already claimed by this process) → ``TurnFinished`` → ``Deliveries`` asks the port to ``deliver`` it and
records the receipt. A failed attempt is retried with capped exponential backoff, across restarts and by
whichever replica claims the row, until the channel takes it or ``max_age_s`` passes; then it is given up,
counted, and the thread is told once the channel takes posts again (in a task of its own, a few tries; told
only once the notice was taken). Before each retry the port is asked
whether an earlier attempt landed after all (``find_delivered``), so an answer is posted once.

One attempt at a time: every attempt runs under a claim on its row (``claimed_by``, the attempt number, and
``next_attempt_at`` as its end) and is cut off before the claim ends; only the claim's holder records the
result. The first attempt runs from the bus, which takes a thread's events in turn, so it may start late: it
keeps its claim only if nobody (this process's own retry loop included) took the row meanwhile and the claim
still has time left; otherwise the retry loop takes the row, looking for an earlier post first.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from core.clock import Clock
from core.errors import DeliveryFailed
from core.events import Event, EventBus, TurnFinished
from core.leasing import holder_name
from core.model import LIVE_TURN_STATUSES, DeliveryStatus, SessionInfo, TurnStatus
from core.ports import ChannelPort, DeliveryId, Ports, Receipt
from core.store.deliveries import DeliveryStore, OutboxClaim
from core.tracing import DELIVERY, NO_TRACING, Tracer
from core.waiting import Waiters

log = logging.getLogger(__name__)

_LANDING_S = timedelta(seconds=5)  # how long a request cut off mid-flight may still take to land

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
    retry_max_s: float = 300.0  # tries are at most this far apart, whatever a Retry-After says
    # One attempt's claim (LEASE_TTL_S): a dead claimer's row is taken over after this long. An attempt
    # is cut off a fifth of it before its claim runs out, so two processes never post the same answer at once.
    claim_s: float = 30.0
    poll_s: float = 2.0  # how often rows claimable by anyone (other replicas' failures) are looked for


@dataclass(frozen=True)
class _Claim:
    """One attempt's hold on a row: its number, when the claim ends, and when the answer was written."""

    turn_id: int
    attempt: int
    until: datetime
    written_at: datetime


class Deliveries:
    def __init__(self, store: DeliveryStore, ports: Ports, bus: EventBus, clock: Clock, *, holder: str | None = None,
                 config: DeliveryConfig = DeliveryConfig(), tracer: Tracer = NO_TRACING) -> None:
        self.store = store
        self.ports = ports
        self.clock = clock
        self.holder = holder or holder_name()  # whose claim a row is under, among replicas
        self.config = config
        self.tracer = tracer  # each attempt is a span of its turn's trace (core.tracing)
        self.waiters: Waiters[DeliveryOutcome] = Waiters(config.poll_s)
        self._claim = timedelta(seconds=config.claim_s)
        self._margin = self._claim / 5  # an attempt ends this long before its claim does
        self._attempted: dict[int, None] = {}  # turns whose fresh claim was used (insertion-ordered)
        self._install: str | None = None
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._telling: dict[str, asyncio.Task[None]] = {}  # by channel: threads told of given-up answers
        self._tell_again: set[str] = set()
        # Channels whose last look found no given-up answer to tell, with none given up here since: not
        # looked at again after every post (forgotten on each turn of the retry loop, for other replicas').
        self._nothing_to_tell: set[str] = set()
        self._tell_later: list[asyncio.TimerHandle] = []  # a failed notice's next try, even if nothing else posts
        bus.subscribe(self._on_event)

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self, *, single_process: bool) -> None:
        """Resume every pending row. With one process per database, claims left by a dead one end now
        (not this process's own: a turn resumed at start may be making its first attempt)."""
        if single_process:
            released = await self.store.release_claims(self.clock.now(), keep=self.holder)
            if released:
                log.info("%d answer(s) left mid-delivery by the last run: retrying", released)
        self._loop_task = asyncio.create_task(self._loop(), name="deliveries")

    async def stop(self) -> None:
        tasks = [t for t in (self._loop_task, *self._telling.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._loop_task = None
        self._telling.clear()
        for handle in self._tell_later:
            handle.cancel()
        self._tell_later.clear()

    # -- what the rest of core calls ------------------------------------------------------------

    def outbox(self, channel: str, now: datetime) -> OutboxClaim | None:
        """For ``finish_turn`` at ``now``: the claim its outbox row starts with, or None when no port
        delivers there."""
        if self.ports.find(channel) is None:
            return None
        return OutboxClaim(self.holder, now + self._claim, now)

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
        if not isinstance(event, TurnFinished) or event.silent or self.ports.find(event.channel) is None:
            return
        now, turn_id = self.clock.now(), event.turn.id
        fresh = event.outbox
        if fresh is not None and fresh.written_at is not None and fresh.holder == self.holder \
                and fresh.until - now >= self._claim - self._margin and self._first_attempt(turn_id):
            # finish_turn wrote this claim a moment ago and nothing has used it: nobody takes a row before its
            # claim ends, so the first attempt needs no second write to keep it.
            await self._attempt(_Claim(turn_id, 1, fresh.until, fresh.written_at), event.session, event.text,
                                first=True, trace=event.turn.trace_context)
            return
        row = await self.store.extend_claim(turn_id, holder=self.holder, attempt=1, valid_after=now + self._margin,
                                            until=now + self._claim)
        if row is None:  # started late: the retry loop (here or on another replica) has the row, or soon will
            self._wake.set()
            return
        claim = _Claim(turn_id, 1, row.next_attempt_at, row.created_at)
        await self._attempt(claim, event.session, event.text, first=True, trace=event.turn.trace_context)

    def _first_attempt(self, turn_id: int) -> bool:
        """True the first time only (a recent window of turns is remembered)."""
        if turn_id in self._attempted:
            return False
        self._attempted[turn_id] = None
        if len(self._attempted) > 4096:
            del self._attempted[next(iter(self._attempted))]
        return True

    async def _loop(self) -> None:
        while True:
            self._nothing_to_tell.clear()  # another replica may have given answers up meanwhile
            try:
                for turn_id in await self.store.due(self.clock.now()):
                    try:
                        await self._retry(turn_id)
                    except Exception:  # one row's trouble does not hold up the others
                        log.exception("retrying the delivery of turn %s failed", turn_id)
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

    async def _retry(self, turn_id: int) -> None:
        now = self.clock.now()
        pending = await self.store.claim(turn_id, self.holder, now, now + self._claim)
        if pending is not None:
            claim = _Claim(turn_id, pending.row.attempts, pending.row.next_attempt_at, pending.row.created_at)
            trace = await self.store.trace_context(turn_id) if self.tracer.enabled else None  # no query when off
            await self._attempt(claim, pending.session, pending.text or EMPTY_ANSWER, first=False, trace=trace)

    async def _until_next(self) -> float:
        due = await self.store.next_due()
        if due is None:
            return self.config.poll_s
        return min(self.config.poll_s, max(0.0, (due - self.clock.now()).total_seconds()))

    def _deadline(self, until: datetime) -> float:
        """The event loop's time at which work under a claim ending at ``until`` must stop."""
        left = (until - self._margin - self.clock.now()).total_seconds()
        return asyncio.get_running_loop().time() + left

    async def _attempt(self, claim: _Claim, session: SessionInfo, text: str, *, first: bool,
                       trace: str | None) -> None:
        """One attempt, in a ``deliver <channel>`` span of the turn's trace (``trace``: its stored traceparent)."""
        with self.tracer.span(f"{DELIVERY} {session.channel}", {
                "chatops.channel": session.channel, "chatops.turn.id": claim.turn_id,
                "chatops.delivery.attempt": claim.attempt}, parent=trace) as span:
            error = await self._post(claim, session, text, first=first)
            if error is not None:
                span.fail(error)

    async def _post(self, claim: _Claim, session: SessionInfo, text: str, *, first: bool) -> str | None:
        """Post the answer and record how that went: None once taken, else what failed (a type, never text)."""
        port = self.ports.find(session.channel)
        turn_id = claim.turn_id
        try:
            if port is None:
                raise DeliveryFailed(f"no {session.channel} channel is configured", retryable=True)
            if self._install is None:
                self._install = await self.store.install_id(self.clock.now())
            delivery_id = DeliveryId(self._install, turn_id, claim.written_at)
            async with asyncio.timeout_at(self._deadline(claim.until)):
                receipt: Receipt | None = None if first else await port.find_delivered(session, delivery_id)
                if receipt is None:
                    receipt = await port.deliver(session, text, delivery_id=delivery_id, resume=not first)
        except asyncio.CancelledError:
            raise  # shutdown: the claim runs out (or is released at the next start) and the row is retried
        except DeliveryFailed as exc:
            await self._failed(claim, exc.error, retryable=exc.retryable, retry_after_s=exc.retry_after_s)
            return "DeliveryFailed"
        except TimeoutError:
            # Cut off mid-request: the post may still land on Slack's side. The next look for it comes only
            # after this claim would have ended, and a little more, so it can see that post.
            await self._failed(claim, "timed out", retryable=True, retry_after_s=None,
                               not_before=claim.until + _LANDING_S)
            return "TimeoutError"
        except Exception as exc:  # e.g. a connection error an adapter did not translate: try again later
            log.warning("delivery of turn %s failed: %s: %s", turn_id, type(exc).__name__, exc)
            await self._failed(claim, type(exc).__name__, retryable=True, retry_after_s=None)
            return type(exc).__name__
        if await self.store.delivered(turn_id, receipt.ref, self.clock.now(), holder=self.holder,
                                      attempt=claim.attempt):
            log.info("answer of turn %s delivered (%s)", turn_id, receipt.ref)
        self.waiters.wake(turn_id)
        self._tell(session.channel)
        return None

    async def _failed(self, claim: _Claim, error: str, *, retryable: bool, retry_after_s: float | None,
                      not_before: datetime | None = None) -> None:
        row = await self.store.get(claim.turn_id)
        if row is None or row.status != DeliveryStatus.PENDING or row.attempts != claim.attempt \
                or row.claimed_by != self.holder:
            return  # the claim was lost: the row is someone else's now
        now, turn_id = self.clock.now(), claim.turn_id
        try:
            deadline = row.created_at + timedelta(seconds=self.config.max_age_s)
        except OverflowError:  # a DELIVERY_MAX_AGE_S of centuries: never
            deadline = datetime.max.replace(tzinfo=UTC)
        if not retryable or now >= deadline:
            if await self.store.give_up(turn_id, error, now, holder=self.holder, attempt=claim.attempt):
                self._nothing_to_tell.discard(row.channel)
                log.error("answer of turn %s given up after %d attempt(s): %s%s", turn_id, row.attempts, error,
                          "" if retryable else " (retrying cannot help)")
            self.waiters.wake(turn_id)
            return
        delay = self._backoff(row.attempts)
        if retry_after_s is not None and math.isfinite(retry_after_s):  # the platform's word, within our bounds
            delay = max(delay, min(retry_after_s, self.config.retry_max_s))
        at = min(max(now + timedelta(seconds=delay), not_before or now), deadline)
        log.warning("answer of turn %s not delivered (attempt %d: %s); next try in %.1f s",
                    turn_id, row.attempts, error, (at - now).total_seconds())
        if await self.store.retry_later(turn_id, error, at, holder=self.holder, attempt=claim.attempt):
            self._wake.set()

    def _backoff(self, tries: int) -> float:
        """Seconds before the next try after ``tries``: doubled each time (the exponent capped, so it stays
        a float), jittered so replicas retrying the same outage do not march in step, at most retry_max_s."""
        delay = self.config.retry_base_s * 2 ** min(max(0, tries - 1), 20) * random.uniform(0.8, 1.2)
        return min(self.config.retry_max_s, delay)

    # -- telling threads about given-up answers ---------------------------------------------------

    def _tell(self, channel: str) -> None:
        """The channel took a post: tell the threads whose answers were given up. In a task of its own: a
        notice may wait out a rate limit, and no answer waits behind it."""
        if self._loop_task is None:  # stopped (or not started): the next start tells
            return
        if channel in self._nothing_to_tell:
            return
        task = self._telling.get(channel)
        if task is not None and not task.done():
            self._tell_again.add(channel)  # rows given up meanwhile: one more round when this one ends
            return
        self._telling[channel] = asyncio.create_task(self._tell_given_up(channel), name=f"deliveries:tell:{channel}")

    def _tell_due(self, channel: str) -> None:
        """A failed notice's next try is due: look, whatever the last look found."""
        self._nothing_to_tell.discard(channel)
        self._tell(channel)

    async def _tell_given_up(self, channel: str) -> None:
        port = self.ports.find(channel)
        if port is None:
            return
        try:
            while True:
                self._tell_again.discard(channel)
                untold = await self.store.untold(channel, self.clock.now())
                for turn_id in untold:
                    await self._tell_one(port, turn_id)
                if channel not in self._tell_again:
                    if not untold:
                        self._nothing_to_tell.add(channel)
                    return
        except Exception:
            log.exception("telling threads about given-up answers in %s failed", channel)

    async def _tell_one(self, port: ChannelPort, turn_id: int) -> None:
        """One notice, once across replicas: claimed for a while, cut off before the claim ends, and the
        thread counts as told only once the notice was taken (else it is tried again, a few times)."""
        now = self.clock.now()
        told = await self.store.take_telling(turn_id, self.holder, now, now + self._claim)
        if told is None:
            return
        taken = False
        try:
            async with asyncio.timeout_at(self._deadline(told.row.next_attempt_at)):
                taken = await port.post_notice(told.session, _given_up_text(told.row.created_at, told.row.last_error))
        except Exception as exc:  # a timeout, or a port that raised after all
            log.warning("telling the thread of turn %s that its answer was given up failed: %s", turn_id,
                        type(exc).__name__)
        if taken:
            await self.store.told(turn_id, self.holder)
        else:
            delay = self._backoff(told.row.notice_tries)
            await self.store.tell_later(turn_id, self.holder, self.clock.now() + timedelta(seconds=delay))
            # Tried again then, whether or not another answer is posted meanwhile (that would only tell earlier).
            loop = asyncio.get_running_loop()
            self._tell_later = [h for h in self._tell_later if h.when() > loop.time()]  # those still to run
            self._tell_later.append(loop.call_later(delay + 0.01, self._tell_due, port.name))


def _given_up_text(written_at: datetime, error: str | None) -> str:
    return (f"An answer I wrote here at {written_at:%Y-%m-%d %H:%M} UTC could not be posted "
            f"({error or 'unknown error'}) and was given up. Ask again if you still need it.")
