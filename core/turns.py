"""The loop that runs turns (SPEC §5): one driver task per session with work, single flight per session.

A driver waits out a burst's quiet window, takes the session's lease (with several replicas), takes the
next batch of inputs as one turn, runs it, records how it ended and settles whoever waits for those
inputs; then looks again. Messages arriving during a turn are taken in at its next tool step (``steer``).
MAX_CONCURRENT_TURNS counts turns at work: a turn parked on a person gives its slot back meanwhile.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from core import current, logcontext
from core.agents import Agent, AgentDirectory
from core.attachments import AttachmentReader
from core.delivery import EMPTY_ANSWER
from core.errors import BudgetExhausted, ProviderError, StepLimitReached
from core.events import (
    AnswerDelta,
    EventBus,
    InputsTaken,
    Notice,
    ToolStarted,
    TurnCancelled,
    TurnFailed,
    TurnFinished,
    TurnStarted,
)
from core.leasing import LeaseHold, SessionLeases
from core.listening import silent
from core.model import Attachment, QueueMode, SessionInfo, TurnInfo, TurnStatus
from core.outcomes import OutcomeWaiters
from core.parking import HOLD, Hold, TurnSlot
from core.ports import Ports
from core.providers import ChatMessage
from core.runner import AgentRunner
from core.store import Budget, ControlStore, ConversationStore, HeldElsewhere, InputStore, Taken

if TYPE_CHECKING:
    from core.clock import Clock
    from core.store.deliveries import OutboxClaim

log = logging.getLogger(__name__)


class TurnSettings(Protocol):
    """The settings the drivers read; core.dispatcher.DispatchConfig has them (and the dispatcher's own)."""

    @property
    def max_concurrent_turns(self) -> int: ...

    @property
    def queue_mode(self) -> str: ...  # where a conversation set none

    @property
    def debounce_s(self) -> float: ...

    @property
    def budget(self) -> Budget: ...

    @property
    def lease_retry_s(self) -> float: ...


@dataclass
class _Driver:
    task: asyncio.Task[None]
    wake: bool = False
    turn_id: int | None = None
    turn: asyncio.Task[str] | None = None  # the running turn's own task, so it can be cancelled alone
    cancelled_by: str | None = None
    cancel_turn_id: int | None = None  # a stop that raced the turn's start
    steered: bool = False  # the running turn took inputs at a tool step
    hold: Hold | None = None  # the running turn's share in parking: is it waiting on a person?
    set_aside: bool = False  # shutdown found its turn parked and ended it without settling anything
    more: bool = False  # the last batch left messages waiting (followup, or past the merge budget)
    lease: LeaseHold | None = None  # with several replicas: its hold on the session's lease

    def stop_turn(self) -> None:
        if self.turn is not None:
            self.turn.cancel()


@dataclass(frozen=True)
class Shutdown:
    drained: int  # turns that ended while shutting down
    set_aside: int  # turns parked on a person: their requests stay pending, the next start continues them
    interrupted: int  # turns still running when the drain window closed: continued at the next start


class TurnDrivers:
    def __init__(
        self,
        conversations: ConversationStore,
        inputs: InputStore,
        control: ControlStore,
        runner: AgentRunner,
        agents: AgentDirectory,
        bus: EventBus,
        clock: Clock,
        config: TurnSettings,
        leasing: SessionLeases,
        waiters: OutcomeWaiters,
        outbox: Callable[[str, datetime], OutboxClaim | None] | None = None,
        attachments: AttachmentReader | None = None,
    ) -> None:
        self.outbox = outbox  # a channel's claim on a finished answer's outbox row (core.delivery)
        self.attachments = attachments or AttachmentReader(Ports())  # without ports: files are named, not read
        self.conversations = conversations
        self.inputs = inputs
        self.control = control  # where a conversation's (or its place's) queue mode is set
        self.runner = runner
        self.agents = agents
        self.bus = bus
        self.clock = clock
        self.config = config
        self.leasing = leasing
        self.waiters = waiters
        self._slots = asyncio.Semaphore(config.max_concurrent_turns)
        self._drivers: dict[str, _Driver] = {}
        self._parked = asyncio.Event()  # a turn just parked (shutdown sets it aside at once)
        self.ended = 0  # turns that ended (answered, failed or stopped) in this process

    async def queue_mode(self, session_id: str) -> str:
        """The queue mode the session's turns run in: its own, its place's, or the configured default."""
        return await self.control.queue_mode(session_id) or self.config.queue_mode

    # -- the driver table -----------------------------------------------------------------------

    @property
    def count(self) -> int:
        return len(self._drivers)

    def driving(self, session_id: str) -> bool:
        return session_id in self._drivers

    def turn_running(self, session_id: str) -> bool:
        driver = self._drivers.get(session_id)
        return driver is not None and driver.turn_id is not None

    def tasks(self) -> list[asyncio.Task[None]]:
        return [d.task for d in self._drivers.values()]

    def kick(self, session_id: str) -> None:
        driver = self._drivers.get(session_id)
        if driver is not None:
            driver.wake = True
            return
        task = asyncio.create_task(self._drive(session_id), name=f"turns:{session_id}")
        self._drivers[session_id] = _Driver(task)

    def cancel_turn(self, session_id: str, turn_id: int, by: str | None) -> None:
        driver = self._drivers.get(session_id)
        if driver is None:
            return
        driver.cancelled_by = by or "someone"
        if driver.turn_id == turn_id and driver.turn is not None and not driver.turn.done():
            if driver.hold is not None:
                driver.hold.stop()  # a stop, not an interruption: what the turn waits on is cancelled too
            driver.turn.cancel()
        else:
            driver.cancel_turn_id = turn_id  # the driver has taken it but not started it yet

    async def shut_down(self, drain_s: float) -> Shutdown:
        """A turn waiting on a person is set aside at once: its request stays pending, its buttons keep
        working, and the next start continues it. Other turns get ``drain_s`` to end; those still
        running then are interrupted (continued at the next start, as after a crash)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + drain_s
        ended, set_aside, every = self.ended, 0, set(self.tasks())
        while True:
            for driver in self._drivers.values():
                if driver.hold is not None and driver.hold.parked and not driver.set_aside:
                    driver.set_aside = True
                    driver.task.cancel()
                    set_aside += 1
            busy = [d.task for d in self._drivers.values() if not d.set_aside and not d.task.done()]
            every.update(busy)
            left = deadline - loop.time()
            if not busy or left <= 0:
                break
            self._parked.clear()
            parked = asyncio.ensure_future(self._parked.wait())
            await asyncio.wait([*busy, parked], timeout=left, return_when=asyncio.FIRST_COMPLETED)
            parked.cancel()
        for task in busy:
            task.cancel()
        await asyncio.gather(*every, return_exceptions=True)
        return Shutdown(drained=self.ended - ended, set_aside=set_aside, interrupted=len(busy))

    # -- driving --------------------------------------------------------------------------------

    async def _drive(self, session_id: str) -> None:
        first, retry = True, False
        lease = self.leasing.hold(session_id, self._drivers[session_id].stop_turn)  # several replicas
        self._drivers[session_id].lease = lease
        try:
            while True:
                driver = self._drivers[session_id]
                woken, driver.wake = driver.wake, False
                if self.leasing.enabled and not (first or retry or woken or driver.more):
                    # After a turn (another replica's arrivals wake no driver here): the lease went back with
                    # its end, or goes back now, unless a message waits.
                    if not lease.held or await lease.release_if_idle():
                        if not driver.wake:
                            return
                        continue
                retry = False
                # After a turn, look again only if something waits (one read), after its quiet window. In one
                # process every arrival wakes the driver: not woken, nothing left behind, nothing waits.
                started: Taken | HeldElsewhere | None = None
                if first or ((woken or driver.more or self.leasing.enabled) and await self._quiet_window(session_id)):
                    slot = TurnSlot(self._slots)
                    await slot.take()
                    try:
                        # The lease is taken in the transaction that starts the turn (one commit for both).
                        taker = lease.taker()  # (only a first look can find an interrupted turn: from before start())
                        started = await self.inputs.take_batch(
                            session_id, self.config.queue_mode, self.config.budget, self.clock.now(), resume=first,
                            history=self.runner.limits.history_messages, lease=taker)
                        if isinstance(started, HeldElsewhere):
                            # Another replica runs this session: it takes what waits, or we try again later.
                            lease.lost()
                            if not started.waiting and not driver.wake:
                                return
                            slot.give_back()
                            await asyncio.sleep(self.config.lease_retry_s)
                            retry = True
                            continue  # still the first look, if it was: it may resume an interrupted turn
                        if taker is not None:
                            lease.took()  # (again: extended)
                        driver.more = started is not None and started.more
                        if started is not None:
                            await self._run(started, slot=slot)
                    finally:
                        slot.give_back()  # unless the turn ended parked: it has none then
                first = False
                if started is None and not driver.wake:
                    return
        except Exception:
            log.exception("turn driver for %s stopped", session_id)
        finally:
            # Given back while still listed: a kick meanwhile only marks this driver, and a new one (below)
            # takes the lease after that, never to see it deleted under it.
            await lease.close()
            gone = self._drivers.pop(session_id, None)
            if gone is not None and gone.wake and not _current_task_cancelling():
                self.kick(session_id)

    async def _quiet_window(self, session_id: str) -> bool:
        """Let a burst finish arriving, so it becomes one merged turn (SPEC §5 debounce).
        Returns False when nothing waits."""
        checked_mode = False
        while True:
            last = await self.inputs.last_arrival(session_id)
            if last is None:
                return False
            if not checked_mode:
                if await self.queue_mode(session_id) == QueueMode.FOLLOWUP:
                    return True
                checked_mode = True
            left = (last + timedelta(seconds=self.config.debounce_s) - self.clock.now()).total_seconds()
            if left <= 0:
                return True
            await asyncio.sleep(left)

    async def _run(self, taken: Taken, *, slot: TurnSlot) -> None:
        turn = taken.turn
        agent = self.agents.get(turn.session.agent)
        driver = self._drivers[turn.session.id]
        logcontext.session_id.set(turn.session.id)  # every line logged for this turn carries both
        logcontext.turn_id.set(turn.id)
        current.session.set(turn.session)  # a port posting for a tool knows where (e.g. which workspace)
        log.info("turn %s started (session %s)", turn.id, turn.session.id)
        self.bus.emit(InputsTaken(turn.session, turn.id, turn.inputs, steered=False, resumed=taken.resumed))
        self.bus.emit(TurnStarted(turn.session, turn))
        driver.turn_id = turn.id
        if driver.cancel_turn_id != turn.id:
            driver.cancelled_by = None
        driver.hold = Hold(turn.id, on_park=lambda: self._parking(slot), on_unpark=slot.take)
        context = contextvars.copy_context()  # the turn's task (and what it spawns) sees its hold
        context.run(HOLD.set, driver.hold)
        driver.turn = asyncio.create_task(self._answer(taken, agent, slot), name=f"turn:{turn.id}", context=context)
        if driver.cancel_turn_id == turn.id:
            driver.hold.stop()
            driver.turn.cancel()
        try:
            answer = await driver.turn
        except asyncio.CancelledError:
            if driver.set_aside:
                await self.conversations.suspend_turn(turn.id)
                log.info("turn %s set aside while it waits on a person; it continues at the next start", turn.id)
                raise
            if driver.cancelled_by is None or _current_task_cancelling():
                log.warning("turn %s interrupted; it resumes at the next start", turn.id)
                raise
            await self._cancelled(turn, driver.cancelled_by)
        except ProviderError as exc:
            await self._fail(turn, exc.kind, exc.user_message)
        except (StepLimitReached, BudgetExhausted) as exc:
            await self._fail(turn, "budget" if isinstance(exc, BudgetExhausted) else "step_limit", str(exc))
        except Exception as exc:
            log.exception("turn %s failed", turn.id)
            await self._fail(
                turn, "internal",
                f"Something went wrong on my side ({type(exc).__name__}). It is logged; "
                "try again, and tell the operator if it keeps happening.",
            )
        else:
            await self._finish(turn, answer)
        finally:
            self.runner.unsaved_switch(turn.id)  # one its end did not store (it failed, or was interrupted) is dropped
            await self.runner.count_alone(turn.id)  # a call is counted, even when its turn's end was not stored
            driver.turn = driver.turn_id = driver.cancel_turn_id = driver.hold = None
            if self.waiters.any_for(turn.input_ids) or driver.steered:  # steered inputs joined the turn late
                final = await self.conversations.turn_info(turn.id)
                self.waiters.wake((final or turn).input_ids)
            driver.steered = False
        self.ended += 1

    async def _answer(self, taken: Taken, agent: Agent, slot: TurnSlot) -> str:
        """The turn's work (one task, so a stop cancels it wherever it is): shared files read, then the model."""
        turn, images, transcript = taken.turn, taken.images, taken.transcript
        if taken.attachments:
            read, _text = await self._read_files(turn.session, turn.id, taken.attachments)
            images += read
            transcript = None  # the file texts were added to it: the runner reads it again
        return await self.runner.run(
            turn, agent, images=images, steer=lambda: self._steer(turn, slot), transcript=transcript,
            save_answer=False, secrets=None if taken.attachments else taken.secrets,  # files take time: read again
            # A turn that may stay silent shows nothing while it is written: it may yet decide to say nothing.
            on_text=None if turn.answer_optional
            else lambda text, again: self.bus.emit(AnswerDelta(turn.session, turn, text, again)),
            on_tool=lambda tool: self.bus.emit(ToolStarted(turn.session, turn, tool)))

    async def _read_files(self, session: SessionInfo, turn_id: int,
                          attachments: tuple[Attachment, ...]) -> tuple[tuple[str, ...], str]:
        """Read what was shared: the images (for this model call) and the texts, which are also added to the
        transcript (every later call sees them); what could not be read is said in the thread."""
        read = await self.attachments.read(session, attachments)
        if read.text:
            await self.conversations.add_message(session.id, role="user", content=read.text, turn_id=turn_id,
                                                 now=self.clock.now())
        if read.problems:
            self.bus.emit(Notice(session, " ".join(read.problems)))
        return tuple(read.images), read.text

    def _parking(self, slot: TurnSlot) -> None:
        slot.give_back()
        self._parked.set()  # shutdown sets it aside at once

    async def _steer(self, turn: TurnInfo, slot: TurnSlot) -> list[ChatMessage]:
        # Asked before every model call after tool calls: no model call without a slot, even when a tool's
        # own timeout cut short the re-taking of the slot it gave back while parked.
        await slot.take()
        taken: Taken | None = await self.inputs.take_steered(turn.id, self.config.queue_mode, self.config.budget,
                                                             self.clock.now())
        if taken is None:
            return []
        driver = self._drivers.get(turn.session.id)
        if driver is not None:
            driver.steered = True
        self.bus.emit(InputsTaken(turn.session, turn.id, taken.refs, steered=True))
        log.info("turn %s took %d waiting message(s) in at a tool step", turn.id, len(taken.refs))
        # One message per input, as the transcript holds them: the newest that addressed the bot is never cut to
        # fit the context window, and the context with it goes oldest first (core.context_window).
        steered = [ChatMessage("user", text, asked=asked) for text, asked in taken.parts]
        images = taken.images
        if taken.attachments:
            read, files_text = await self._read_files(turn.session, turn.id, taken.attachments)
            images += read
            if files_text:
                steered.append(ChatMessage("user", files_text))
        if not steered:
            steered.append(ChatMessage("user", taken.text))
        at = next((i for i in range(len(steered) - 1, -1, -1) if steered[i].asked), len(steered) - 1)
        steered[at] = replace(steered[at], images=images, senders=taken.senders)  # what the runner reads of them
        return steered

    # -- how a turn ended -----------------------------------------------------------------------

    async def _end(self, turn: TurnInfo, **how: Any) -> TurnInfo:
        """Record the turn's end (``ConversationStore.finish_turn``). With several replicas, when its batch
        left nothing behind and nothing woke its driver, the session's lease goes back in the same commit,
        unless a message waits."""
        driver = self._drivers.get(turn.session.id)
        lease = driver.lease if driver is not None and not (driver.more or driver.wake) else None
        # A switch to the fallback model that this end's answer (or silence) carries: stored in the same commit.
        switch = self.runner.unsaved_switch(turn.id)
        store_switch = self.runner.models.unstored(switch) if switch else None
        # A turn that took nothing at its tool steps holds the inputs it started with: not read again.
        known = turn if driver is not None and not driver.steered else None
        count = self.runner.uncounted(turn.id)
        try:
            final = await self.conversations.finish_turn(turn.id, **how, then=store_switch, known=known,
                                                         give_back=lease.releaser() if lease else None, count=count)
        except Exception:
            self.runner.still_uncounted(turn.id, count)  # counted on its own (the driver's finally): it was made
            raise
        if lease is not None:
            lease.ended()
        if switch is not None:
            self.runner.models.stored(switch)
        return final

    async def _finish(self, turn: TurnInfo, answer: str, *, saved: bool = False) -> None:
        """The answer (unless ``saved`` already), the turn's end and its outbox row: one commit."""
        now = self.clock.now()
        if turn.answer_optional and silent(answer):
            # Nobody asked, and the model had nothing to add: finished with no answer and no outbox row (one commit),
            # so nothing is posted for it, now or after a crash.
            final = await self._end(turn, status=TurnStatus.FINISHED, answer=None, error=None, now=now)
            log.info("turn %s ended silently (session %s)", turn.id, turn.session.id)
            self.bus.emit(TurnFinished(final.session, final, "", silent=True))
            return
        outbox = self.outbox(turn.session.channel, now) if self.outbox is not None else None
        final = await self._end(turn, status=TurnStatus.FINISHED, answer=answer, error=None, now=now, outbox=outbox,
                                answer_message=not saved)
        log.info("turn %s finished (session %s)", turn.id, turn.session.id)
        self.bus.emit(TurnFinished(final.session, final, answer or EMPTY_ANSWER, outbox=outbox))

    async def _cancelled(self, turn: TurnInfo, by: str) -> None:
        saved = await self.conversations.final_answer(turn.id)
        # A turn's answer is stored with its end (one commit), so this finds one only for a turn whose
        # runner stored it itself (before that was so) and that is stopped after being resumed.
        if saved is not None:  # the answer exists, so it is the outcome
            await self._finish(turn, saved, saved=True)  # already in the transcript: not again
            return
        # Said in the transcript, so the model knows that request was dropped, not still pending.
        await self.conversations.add_message(turn.session.id, role="assistant", content=f"(stopped by {by})",
                                             turn_id=turn.id, now=self.clock.now())
        final = await self._end(turn, status=TurnStatus.CANCELLED, answer=None, error=f"stopped by {by}",
                                now=self.clock.now())
        log.info("turn %s stopped by %s", turn.id, by)
        self.bus.emit(TurnCancelled(final.session, final, by))

    async def _fail(self, turn: TurnInfo, kind: str, message: str) -> None:
        message = await self.runner.redact(message)  # e.g. a provider error quoting the API key
        log.warning("turn %s failed (%s): %s", turn.id, kind, message)
        final = await self._end(turn, status=TurnStatus.FAILED, answer=None, error=message, now=self.clock.now())
        self.bus.emit(TurnFailed(final.session, final, kind, message))


def _current_task_cancelling() -> bool:
    """True when the driver itself is being cancelled (shutdown), not just the turn it awaits."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
