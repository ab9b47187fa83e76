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
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta

from core.clock import Clock
from core.dispatcher import Dispatcher
from core.errors import InvalidInput, Unavailable
from core.events import Event, TurnCancelled, TurnFailed, TurnFinished
from core.model import EVENT_PREFIX, Inbound, MessageRef, OutcomeStatus
from core.store import AcceptOutcome
from core.store.tables import WebhookEventRow
from core.store.webhook_events import WebhookEventStore
from core.webhooks.model import ANSWERED, FAILED, QUEUED, EventArrival, EventSource
from core.webhooks.rendering import render_event

log = logging.getLogger(__name__)

_End = tuple[str, str | None]  # an event's status when its turn ended, and why (failed)
_ENDS_KEPT = 10_000
_TAKING_MAX = 1_000  # events being taken at once (most waiting for their pace); the table keeps the rest

# Where a destination as the operator typed it ("#ops") is resolved to the platform's id (a port's
# ``resolve_destination``); InvalidInput when it cannot be posted to.
Resolve = Callable[[str], Awaitable[str]]


@dataclass(frozen=True)
class ProcessorSettings:
    channel: str  # the channel whose places destinations are (Slack)
    poll_s: float = 2.0  # how soon a row queued by another process (a replay, a crash) is taken
    settle_poll_s: float = 10.0  # how soon a turn another replica ran (or a steered input) settles its event
    takes_per_s: float = 25.0  # events taken to their turns per second at most (far above any source's rate)
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
    def __init__(self, store: WebhookEventStore, dispatcher: Dispatcher, clock: Clock,
                 sources: Mapping[str, EventSource], resolve: Resolve | None, settings: ProcessorSettings) -> None:
        self.store = store
        self.dispatcher = dispatcher
        self.clock = clock
        self.sources = dict(sources)
        self.resolve = resolve  # None: no channel here can post to a destination
        self.settings = settings
        self._destinations: dict[str, str] = {}  # source name → resolved destination id (operator-written)
        self._running: set[int] = set()  # rows this process is taking to an answer
        self._next_take = 0.0  # the loop time before which the next event is not taken
        self._tasks: set[asyncio.Task[None]] = set()
        self._started = False
        # Inputs of event turns: the tasks watching them, and ends seen before anyone watched (bounded).
        self._watching: dict[int, asyncio.Future[_End]] = {}
        self._ended: OrderedDict[int, _End] = OrderedDict()
        dispatcher.bus.subscribe(self._observe)

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        self._started = True
        self._next_take = 0.0
        self._spawn(self._follow_table())

    async def stop(self) -> None:
        self._started = False
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def queued(self, event_id: int, arrival: EventArrival | None = None) -> None:
        """The intake stored an event (``arrival``: what it stored, so it need not be read again): take it now.
        A wake-up only: the table is the truth, polled for what this misses."""
        if self._started:
            # Behind a backlog the payload is read again when its turn comes: waiting events hold no payload.
            idle = self._next_take <= asyncio.get_running_loop().time()
            self._take(event_id, arrival if idle else None)

    def _take(self, event_id: int, arrival: EventArrival | None = None) -> None:
        if len(self._running) >= _TAKING_MAX:  # a flood: the rest stay stored, and the poll takes them later
            return
        if event_id not in self._running:
            self._running.add(event_id)
            self._spawn(self._answer(event_id, arrival))

    async def _observe(self, event: Event) -> None:
        """How the turns of event conversations end, as they end: what settles their events (without a read each)."""
        if not isinstance(event, TurnFinished | TurnFailed | TurnCancelled) or source_of(event.session.id) is None:
            return
        if isinstance(event, TurnFinished):
            end: _End = (ANSWERED, None)
        elif isinstance(event, TurnFailed):
            end = (FAILED, f"failed: {event.message}"[:1000])
        else:
            end = (FAILED, f"cancelled by {event.by or 'someone'}")
        for input_id in event.turn.input_ids:
            waiting = self._watching.pop(input_id, None)
            if waiting is not None and not waiting.done():
                waiting.set_result(end)
            else:  # ended before its event's task began to watch it: kept a while for it
                self._ended[input_id] = end
                while len(self._ended) > _ENDS_KEPT:
                    self._ended.popitem(last=False)

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

    async def _answer(self, event_id: int, arrival: EventArrival | None) -> None:
        try:
            # Events are taken to their turns at a bounded pace; a burst waits stored. A turn costs the process
            # more than storing its event does: unpaced, a burst of them starves the intake's 202s (which never
            # wait for this), and no model is that fast anyway. A turn's own length never holds the next one back.
            await self._paced()
            await self._answer_once(event_id, arrival)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("event %s: could not be taken to an answer now; retried", event_id)
            await asyncio.sleep(self.settings.retry_s)
        finally:
            self._running.discard(event_id)

    async def _paced(self) -> None:
        loop = asyncio.get_running_loop()
        at = max(loop.time(), self._next_take)
        self._next_take = at + 1 / self.settings.takes_per_s
        if at > loop.time():
            await asyncio.sleep(at - loop.time())

    async def _answer_once(self, event_id: int, arrival: EventArrival | None) -> None:
        row: EventArrival | WebhookEventRow | None = arrival
        if row is None:  # found in the table (a restart, a replay, another replica's): read it now
            row = await self.store.get(event_id)
            if row is None or row.status != QUEUED:
                return
        source = self.sources.get(row.source)
        if source is None:
            await self._finish(event_id, FAILED, f"event source {row.source!r} is no longer configured")
            return
        # Accepting again after a restart is safe: the idempotency key finds the input the first accept stored.
        input_id = row.input_id if isinstance(row, WebhookEventRow) else None
        session_id = row.session_id if isinstance(row, WebhookEventRow) else None
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
            if accepted.outcome is AcceptOutcome.REFUSED:
                await self._finish(event_id, FAILED, f"refused: {accepted.note}"[:1000], session_id=session_id,
                                   input_id=input_id)
                return
        # Answered once its turn answered: posting it is the delivery outbox's job (retried like every answer).
        status, note = await self._settled(input_id)
        await self._finish(event_id, status, note, session_id=session_id, input_id=input_id)

    async def _settled(self, input_id: int) -> _End:
        """How the input's turn ended: as this process sees it end (``_observe``: no read at all), else as read
        every ``settle_poll_s`` (a turn another replica ran, a steered input, one that ended before a restart)."""
        end = self._ended.pop(input_id, None)
        if end is not None:
            return end
        waiting = self._watching.setdefault(input_id, asyncio.get_running_loop().create_future())
        try:
            while True:
                try:
                    return await asyncio.wait_for(asyncio.shield(waiting), self.settings.settle_poll_s)
                except TimeoutError:
                    pass
                outcome = await self.dispatcher.inputs.outcome(input_id)
                if outcome is not None:
                    if outcome.status == OutcomeStatus.ANSWERED:
                        return ANSWERED, None
                    return FAILED, f"{outcome.status}: {outcome.text}"[:1000]
        finally:
            self._watching.pop(input_id, None)

    async def _destination(self, source: EventSource) -> str:
        if self.resolve is None:
            raise InvalidInput(f"no {self.settings.channel} channel is configured to post to")
        found = self._destinations.get(source.name)
        if found is None:
            found = self._destinations[source.name] = await self.resolve(source.destination)
        return found

    async def _finish(self, event_id: int, status: str, note: str | None, *, session_id: str | None = None,
                      input_id: int | None = None) -> None:
        if status == FAILED:
            log.warning("event %s failed: %s", event_id, note)
        await self.store.finish(event_id, status=status, note=note, now=self.clock.now(), session_id=session_id,
                                input_id=input_id)
