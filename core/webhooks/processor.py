"""From a stored event to an answer (SPEC §17 ``[[event_sources]]``): each queued event becomes a turn of its
source's agent, in the conversation its thread key names, answered in the source's destination.

Path: the intake stores the event (``queued``) and calls ``queued(id)``; here it is rendered (``core.webhooks.
rendering``) and accepted as an input of the session ``event:<source>:<key digest>`` (deduplicated by
``event:<id>``, so a restart or a second replica taking the same row starts nothing new); the outcome of its
input, and then its delivery, settle the row (``answered`` / ``failed``). Rows a crash left queued, and rows
another process queued (``bot events replay``), are found by polling the table.

The turn runs at the source's ``trust`` (``level``: ``SenderTrust``'s fixed level for event sessions); its
sender is ``event:<source>``, which is nobody's: no requester, so gated calls need named approvers.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta

from core.clock import Clock
from core.delivery import Deliveries
from core.dispatcher import Dispatcher
from core.errors import InvalidInput, Unavailable
from core.model import EVENT_PREFIX, Inbound, MessageRef, OutcomeStatus
from core.store.webhook_events import WebhookEventStore
from core.webhooks.model import ANSWERED, FAILED, QUEUED, EventSource
from core.webhooks.rendering import render_event

log = logging.getLogger(__name__)

# Where a destination as the operator typed it ("#ops") is resolved to the platform's id (a port's
# ``resolve_destination``); InvalidInput when it cannot be posted to.
Resolve = Callable[[str], Awaitable[str]]


@dataclass(frozen=True)
class ProcessorSettings:
    channel: str  # the channel whose places destinations are (Slack)
    poll_s: float = 2.0  # how soon a row queued by another process (a replay, a crash) is taken
    retry_s: float = 30.0  # a destination that could not be resolved for now (the platform is down) is retried
    retention: timedelta = timedelta(days=30)  # EVENT_RETENTION_DAYS
    prune_every_s: float = 3600.0


def event_session(source: str, key: str) -> str:
    """The conversation of ``source``'s events whose thread key is ``key``: one per key, whatever its length."""
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{EVENT_PREFIX}{source}:{digest}"


def own_session(source: str, event_id: int) -> str:
    """The conversation of an event without a thread key: its own. Not a digest of any key (a key "#1" renders
    from an outsider's payload; it must not name event 1's conversation)."""
    return f"{EVENT_PREFIX}{source}:own-{event_id}"


def event_place(channel: str, source: str, destination: str) -> str:
    """Where a source's event turns live (``slack:event-ci:C2``): their approvals are asked, and "Always allow"
    grants kept, per source. Not a schedule's firing's ``slack:dest:C2``, nor another source's: a grant given
    to a trusted source's call must not let the same call run unasked for a source outsiders write to."""
    return f"{channel}:event-{source}:{destination}"


def event_sender(source: str) -> str:
    """Who an event's words are from: the source, never a person (so nobody is its requester)."""
    return f"{EVENT_PREFIX}{source}"


def source_of(session_id: str) -> str | None:
    """The source an event session belongs to (None for any other session)."""
    if not session_id.startswith(EVENT_PREFIX):
        return None
    return session_id[len(EVENT_PREFIX):].split(":", 1)[0]


class SourceLevels:
    """The trust level an event session's turns run at (``SenderTrust``'s fixed level): its source's (at most
    member, checked when bot.toml is read); a session of a source no longer configured runs at the lowest."""

    def __init__(self, sources: Mapping[str, EventSource]) -> None:
        self.sources = dict(sources)

    async def __call__(self, session_id: str) -> str | None:
        name = source_of(session_id)
        if name is None:
            return None  # not an event session: its senders decide
        source = self.sources.get(name)
        return source.trust if source is not None else "bot"


class EventProcessor:
    def __init__(self, store: WebhookEventStore, dispatcher: Dispatcher, deliveries: Deliveries, clock: Clock,
                 sources: Mapping[str, EventSource], resolve: Resolve | None, settings: ProcessorSettings) -> None:
        self.store = store
        self.dispatcher = dispatcher
        self.deliveries = deliveries
        self.clock = clock
        self.sources = dict(sources)
        self.resolve = resolve  # None: no channel here can post to a destination
        self.settings = settings
        self._destinations: dict[str, str] = {}  # source name → resolved destination id (operator-written)
        self._running: set[int] = set()  # rows this process is taking to an answer
        self._tasks: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._started = False

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        self._started = True
        self._spawn(self._follow_table())

    async def stop(self) -> None:
        self._started = False
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def queued(self, event_id: int) -> None:
        """The intake stored an event: take it now (a wake-up; the table is the truth)."""
        if self._started:
            self._take(event_id)

    def _take(self, event_id: int) -> None:
        if event_id not in self._running:
            self._running.add(event_id)
            self._spawn(self._answer(event_id))

    def _spawn(self, coro: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _follow_table(self) -> None:
        """Take every queued row (left by a crash, or queued by another process), and prune old ones."""
        pruned_at: float | None = None
        loop = asyncio.get_running_loop()
        while True:
            try:
                for event_id in await self.store.queued_ids():
                    self._take(event_id)
                if pruned_at is None or loop.time() - pruned_at >= self.settings.prune_every_s:
                    pruned_at = loop.time()
                    pruned = await self.store.prune(self.clock.now() - self.settings.retention)
                    if pruned:
                        log.info("pruned %d event(s) older than %d days", pruned, self.settings.retention.days)
            except Exception:
                log.exception("could not read the queued events")
            await asyncio.sleep(self.settings.poll_s)

    # -- one event ------------------------------------------------------------------------------

    async def _answer(self, event_id: int) -> None:
        try:
            await self._answer_once(event_id)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("event %s: could not be taken to an answer now; retried", event_id)
            await asyncio.sleep(self.settings.retry_s)
        finally:
            self._running.discard(event_id)

    async def _answer_once(self, event_id: int) -> None:
        row = await self.store.get(event_id)
        if row is None or row.status != QUEUED:
            return
        source = self.sources.get(row.source)
        if source is None:
            await self._finish(event_id, FAILED, f"event source {row.source!r} is no longer configured")
            return
        input_id = row.input_id
        if input_id is None:
            try:
                destination = await self._destination(source)
            except InvalidInput as exc:
                await self._finish(event_id, FAILED, f"destination {source.destination}: {exc}")
                return
            session_id = (event_session(source.name, row.thread_key) if row.thread_key
                          else own_session(source.name, event_id))
            text = render_event(source=source.name, kind=row.kind, event_type=row.event_type, payload=row.payload,
                                prompt=source.prompt)
            try:
                accepted = await self.dispatcher.accept(Inbound(
                    session_id=session_id, channel=self.settings.channel, sender=event_sender(source.name), text=text,
                    addressed=True, reply_ref={"channel": destination, "open_thread": True}, ref=MessageRef(),
                    idempotency_key=f"event:{event_id}", agent=source.agent,
                    place=event_place(self.settings.channel, source.name, destination),
                ), internal=True)
            except Unavailable:  # stopping: the next start takes it
                return
            except InvalidInput as exc:  # e.g. the conversation belongs to another agent now
                await self._finish(event_id, FAILED, str(exc))
                return
            if accepted.input_id is None:
                await self._finish(event_id, FAILED, f"not accepted ({accepted.outcome})")
                return
            input_id = accepted.input_id
            await self.store.started(event_id, session_id=session_id, input_id=input_id)
        outcome = await self.dispatcher.outcome(input_id)
        if outcome.status != OutcomeStatus.ANSWERED:
            await self._finish(event_id, FAILED, f"{outcome.status}: {outcome.text}"[:1000])
            return
        error = None
        if outcome.turn_id is not None:  # core delivers the answer (retrying through outages): how did it land?
            error = (await self.deliveries.wait(outcome.turn_id)).error
        await self._finish(event_id, FAILED if error else ANSWERED, error)

    async def _destination(self, source: EventSource) -> str:
        if self.resolve is None:
            raise InvalidInput(f"no {self.settings.channel} channel is configured to post to")
        found = self._destinations.get(source.name)
        if found is None:
            found = self._destinations[source.name] = await self.resolve(source.destination)
        return found

    async def _finish(self, event_id: int, status: str, note: str | None) -> None:
        if status == FAILED:
            log.warning("event %s failed: %s", event_id, note)
        await self.store.finish(event_id, status=status, note=note, now=self.clock.now())
