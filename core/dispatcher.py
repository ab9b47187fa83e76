"""The dispatcher: the one entry point channel adapters call, and the loop that runs turns (SPEC §5).

- Single flight per session, parallel across sessions up to ``max_concurrent_turns``.
- Every accepted input is in the database before ``accept`` returns; the in-memory driver table is
  only a wake-up signal, rebuilt from the database at start.
- Messages arriving while a turn runs are steered into it at its next tool step (``steer``), or
  merged into the next turn after a quiet window (``collect``, and ``steer`` when the turn ended
  before a tool step), or run one by one (``followup``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
import uuid
from dataclasses import dataclass, field, replace
from datetime import timedelta

from core import logcontext
from core.agents import AgentDirectory
from core.approvals import ApprovalPolicy
from core.clock import Clock
from core.errors import CoreError, InvalidInput, ProviderError, StepLimitReached
from core.events import (
    EventBus,
    InputQueued,
    InputsTaken,
    Notice,
    TurnCancelled,
    TurnFailed,
    TurnFinished,
    TurnStarted,
)
from core.model import (
    RESERVED_SESSION_PREFIXES,
    Inbound,
    InputKind,
    Outcome,
    QueueMode,
    SessionInfo,
    SessionSummary,
    TranscriptEntry,
    TurnInfo,
    TurnStatus,
)
from core.providers import ChatMessage
from core.runner import AgentRunner
from core.store import (
    Accepted,
    AcceptOutcome,
    Budget,
    ControlStore,
    ConversationStore,
    InputStore,
    LeaseStore,
    Taken,
)
from core.text import clean_text

log = logging.getLogger(__name__)

MAX_TEXT_CHARS = 40_000
DELIVERY_RETENTION = timedelta(days=2)  # Slack retries for minutes; keep ids far longer than that
_QUEUE_COMMAND = re.compile(r"^queue(?:\s+(\w+))?$", re.IGNORECASE)
_STOP_WORDS = {"stop", "stop!", "cancel"}


@dataclass(frozen=True)
class DispatchConfig:
    max_concurrent_turns: int = 8
    record_thread_context: bool = True
    max_turn_attempts: int = 2  # a turn interrupted by a crash is continued once, then failed
    queue_mode: str = QueueMode.STEER
    debounce_s: float = 0.5
    max_waiting: int = 20
    budget: Budget = field(default_factory=Budget)
    lease_ttl_s: float = 30.0  # a replica that stops renewing loses its sessions after this long
    lease_retry_s: float = 0.5


@dataclass(frozen=True)
class StopReport:
    running: bool
    waiting: int

    def describe(self, by: str | None) -> str:
        if not self.running and not self.waiting:
            return "Nothing to stop: I'm not working on anything in this conversation."
        parts = (["the running turn"] if self.running else []) + (
            [f"{self.waiting} waiting message{'s' if self.waiting != 1 else ''}"] if self.waiting else [])
        return f"Stopped {' and '.join(parts)}" + (f" (asked by {by})." if by else ".")


@dataclass
class _Driver:
    task: asyncio.Task[None]
    wake: bool = False
    turn_id: int | None = None
    turn: asyncio.Task[str] | None = None  # the running turn's own task, so it can be cancelled alone
    cancelled_by: str | None = None
    cancel_turn_id: int | None = None  # a stop that raced the turn's start
    steered: bool = False  # the running turn took inputs at a tool step


class Dispatcher:
    def __init__(
        self,
        conversations: ConversationStore,
        inputs: InputStore,
        control: ControlStore,
        runner: AgentRunner,
        agents: AgentDirectory,
        bus: EventBus,
        clock: Clock,
        config: DispatchConfig = DispatchConfig(),
        leases: LeaseStore | None = None,
        policy: ApprovalPolicy | None = None,
    ) -> None:
        self.conversations = conversations
        self.inputs = inputs
        self.control = control
        self.runner = runner
        self.agents = agents
        self.bus = bus
        self.clock = clock
        self.config = config
        self._slots = asyncio.Semaphore(config.max_concurrent_turns)
        self._drivers: dict[str, _Driver] = {}
        self._waiters: dict[int, list[asyncio.Future[Outcome]]] = {}
        self._accepting = False
        self.leases = leases  # with several replicas: one process at a time runs a session
        # Who may stop or re-queue someone else's work: approvers and admins (without one: nobody).
        self.policy = policy or ApprovalPolicy((), ())
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._sweeper: asyncio.Task[None] | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Recover what a dead process left, then resume every session with work to do."""
        await self._recover_abandoned()
        for session_id in await self.conversations.sessions_with_work():
            self._kick(session_id)
        await self.inputs.prune_deliveries(self.clock.now() - DELIVERY_RETENTION)
        if self.leases is not None:
            self._sweeper = asyncio.create_task(self._sweep_abandoned(), name="turns:sweep")
        self._accepting = True

    async def _recover_abandoned(self) -> None:
        """Turns left running by a process that is gone: continued once, or failed and told. With
        several replicas, only sessions whose lease ran out (its holder died) are recovered."""
        sessions: list[str] | None = None
        if self.leases is not None:
            running = await self.conversations.running_sessions()
            live = await self.leases.live_holders([_lease_name(s) for s in running], self.clock.now())
            sessions = [s for s in running if _lease_name(s) not in live and s not in self._drivers]
        failed = await self.conversations.requeue_interrupted(self.config.max_turn_attempts, self.clock.now(),
                                                              sessions)
        for turn_id in failed:
            info = await self.conversations.turn_info(turn_id)
            if info is not None:
                self.bus.emit(TurnFailed(info.session, info, "interrupted", _INTERRUPTED_TWICE))
        for session_id in sessions or []:
            self._kick(session_id)

    async def _sweep_abandoned(self) -> None:
        while True:
            await asyncio.sleep(self.config.lease_ttl_s)
            try:
                await self._recover_abandoned()
            except Exception:
                log.exception("recovering abandoned turns failed")

    async def stop(self, drain_s: float) -> None:
        """Stop taking input, give running turns ``drain_s`` to finish; the rest resume at next start."""
        self._accepting = False
        if self._sweeper is not None:
            self._sweeper.cancel()
        tasks = [d.task for d in self._drivers.values()]
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=drain_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        await self.bus.drain(timeout=5)

    @property
    def accepting(self) -> bool:
        return self._accepting

    @property
    def running_sessions(self) -> int:
        return len(self._drivers)

    # -- intake ---------------------------------------------------------------------------------

    async def accept(self, message: Inbound, *, internal: bool = False) -> Accepted:
        """Store one input durably (deduplicated) and act on it: queue it, record it, or obey it.

        ``internal`` is for core's own inputs (a scheduled firing): only they may use reserved
        session ids and preapproved calls."""
        if not internal and message.session_id.startswith(RESERVED_SESSION_PREFIXES):
            raise InvalidInput(f"session id {message.session_id!r} is reserved")
        if not internal and message.preapproved:
            raise InvalidInput("preapproved calls cannot be set from outside")
        message = replace(message, text=clean_text(message.text))  # stored: no NUL, no lone surrogate
        if len(message.text) > MAX_TEXT_CHARS:
            raise InvalidInput(f"message is longer than {MAX_TEXT_CHARS} characters")
        if not self._accepting:
            raise CoreError("the gateway is not accepting messages right now")
        text = message.text.strip()
        command = _is_command(text) if message.addressed else False
        kind = InputKind.CONTROL if command else InputKind.MESSAGE if message.addressed else InputKind.CONTEXT
        paused = kind == InputKind.MESSAGE and await self.control.intake_paused()
        result = await self.inputs.accept(
            message, kind=kind, agent=self.agents.get(message.agent).name,
            refuse=_PAUSED if paused else None, max_waiting=self.config.max_waiting, now=self.clock.now(),
        )
        session = result.session
        if session is None:
            return result
        if result.outcome is AcceptOutcome.QUEUED:
            driver = self._drivers.get(session.id)
            if driver is not None and driver.turn_id is not None:
                assert result.input_id is not None
                self.bus.emit(InputQueued(session, result.input_id, message.ref))
            self._kick(session.id)
        elif result.outcome is AcceptOutcome.REFUSED:
            self.bus.emit(Notice(session, result.note or "refused", message.ref))
        elif result.outcome is AcceptOutcome.COMMAND:
            assert result.input_id is not None
            reply = await self._obey(session, text, message.sender)
            await self.inputs.note(result.input_id, reply)
            self.bus.emit(Notice(session, reply, message.ref))
        return result

    async def _obey(self, session: SessionInfo, text: str, sender: str) -> str:
        if text.lower() in _STOP_WORDS:
            if not await self.may_control(sender, session.id):
                return _STOP_REFUSED
            report = await self.cancel(session.id, by=sender, announce=False)
            return report.describe(sender)
        match = _QUEUE_COMMAND.match(text)
        assert match is not None
        mode = (match.group(1) or "").lower()
        if not mode:
            return f"Queue mode here: {await self.queue_mode(session.id)} (steer, collect or followup)."
        if mode not in QueueMode.ALL:
            return f"Unknown queue mode {mode!r}: use steer, collect or followup."
        if not await self.may_control(sender, session.id):
            return _QUEUE_REFUSED
        await self.control.set_session_queue_mode(session.id, mode, self.clock.now())
        return f"Queue mode for this conversation is now {mode}."

    # -- operator controls ----------------------------------------------------------------------

    async def set_paused(self, paused: bool) -> None:
        await self.control.set_intake_paused(paused, self.clock.now())

    async def paused(self) -> bool:
        return await self.control.intake_paused()

    async def queue_mode(self, session_id: str) -> str:
        return await self.control.queue_mode(session_id) or self.config.queue_mode

    async def set_place_queue_mode(self, place: str, mode: str, *, by: str) -> None:
        """A place's queue mode (``/bot queue``): for approvers and admins, and for whoever asked for the
        work in progress there. Refused with InvalidInput."""
        if mode not in QueueMode.ALL:
            raise InvalidInput(f"unknown queue mode {mode!r}: use steer, collect or followup")
        if not await self.may_control(by, await self.inputs.latest_live_session(place)):
            raise InvalidInput(_QUEUE_REFUSED)
        await self.control.set_place_queue_mode(place, mode, self.clock.now())

    async def latest_live_session(self, place: str) -> str | None:
        return await self.inputs.latest_live_session(place)

    async def stop_latest(self, place: str, *, by: str) -> StopReport | None:
        """``/bot stop``: stop the place's most recently busy conversation (None: nothing is busy). Refused
        with InvalidInput unless ``by`` may control it."""
        session_id = await self.inputs.latest_live_session(place)
        if session_id is None:
            return None
        if not await self.may_control(by, session_id):
            raise InvalidInput(_STOP_REFUSED)
        return await self.cancel(session_id, by=by)

    async def may_control(self, user: str, session_id: str | None) -> bool:
        """Whether ``user`` may stop a conversation or change how it queues: its requester (who asked for
        its live or latest turn), approvers and admins. A conversation nobody has asked anything yet is
        anyone's to set up. ``session_id`` None stands for a place with nothing busy: approvers and admins."""
        if not user:
            return False
        requester = await self.inputs.requester(session_id) if session_id is not None else None
        if session_id is not None and requester is None:
            return True
        if user == requester:
            return True
        session = await self.conversations.get_session(session_id) if session_id is not None else None
        agent = self.agents.get(session.agent if session is not None else None)
        return await self.policy.may_decide(user, requester, agent.approvers)

    # -- reads for channels ---------------------------------------------------------------------

    async def session(self, session_id: str) -> SessionInfo | None:
        return await self.conversations.get_session(session_id)

    async def history(self, session_id: str) -> list[TranscriptEntry]:
        return await self.conversations.history(session_id)

    async def list_sessions(self, channel: str) -> list[SessionSummary]:
        return await self.conversations.list_sessions(channel)

    async def working(self, session_id: str) -> bool:
        return await self.conversations.has_live_work(session_id)

    async def report_delivery(self, turn_id: int, ref: str | None, error: str | None) -> None:
        """A channel says how delivering a turn's answer went (e.g. Slack's message ts, or the error)."""
        await self.conversations.report_delivery(turn_id, ref, error)

    async def dispatch(self, message: Inbound, cancel: asyncio.Event | None = None) -> Outcome:
        """Accept an input and wait for its outcome; setting ``cancel`` withdraws it (see ``cancel_input``)."""
        result = await self.accept(message)
        if result.input_id is None:
            return Outcome("refused", "not for the bot" if result.outcome is AcceptOutcome.IGNORED
                           else "already received")
        pending = asyncio.ensure_future(self.outcome(result.input_id))
        if cancel is None:
            return await pending
        cancelled = asyncio.ensure_future(cancel.wait())
        try:
            await asyncio.wait({pending, cancelled}, return_when=asyncio.FIRST_COMPLETED)
            if not pending.done():
                await self.cancel_input(result.input_id, by=message.sender)
            return await pending
        finally:
            cancelled.cancel()

    # -- outcomes and cancellation --------------------------------------------------------------

    async def outcome(self, input_id: int) -> Outcome:
        """Wait until the input is answered, failed, cancelled or refused."""
        known = await self.inputs.outcome(input_id)
        if known is not None:
            return known
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(input_id, []).append(future)
        known = await self.inputs.outcome(input_id)  # it may have ended while we registered
        if known is not None:
            self._resolve(input_id, known)
        return await future

    def _resolve(self, input_id: int, outcome: Outcome) -> None:
        for future in self._waiters.pop(input_id, []):
            if not future.done():
                future.set_result(outcome)

    async def _resolve_turn(self, turn: TurnInfo) -> None:
        for input_id in turn.input_ids:
            if input_id in self._waiters:
                outcome = await self.inputs.outcome(input_id)
                if outcome is not None:
                    self._resolve(input_id, outcome)

    async def cancel(self, session_id: str, by: str | None, *, announce: bool = True) -> StopReport:
        """Stop the session's running turn at its next await, and drop the messages waiting behind it."""
        note = f"stopped by {by}" if by else "stopped"
        waiting = await self.inputs.cancel_waiting(session_id, note)
        for input_id in waiting:
            self._resolve(input_id, Outcome("cancelled", note))
        turn_id = await self.conversations.running_turn(session_id)
        running = turn_id is not None
        if turn_id is not None:
            await self.inputs.cancel_turn_inputs(turn_id, note)
            self._cancel_turn(session_id, turn_id, by)
        report = StopReport(running=running, waiting=len(waiting))
        if announce:
            session = await self.conversations.get_session(session_id)
            if session is not None:
                self.bus.emit(Notice(session, report.describe(by)))
        return report

    async def cancel_input(self, input_id: int, by: str | None) -> None:
        """Withdraw one input (e.g. its caller went away). A merged or steered turn stops only when
        every input in it is withdrawn."""
        note = f"cancelled by {by}" if by else "cancelled"
        emptied_turn = await self.inputs.cancel_input(input_id, note)
        outcome = await self.inputs.outcome(input_id)
        if outcome is not None and emptied_turn is None:
            self._resolve(input_id, outcome)
        if emptied_turn is not None:
            info = await self.conversations.turn_info(emptied_turn)
            if info is not None:
                self._cancel_turn(info.session.id, emptied_turn, by)

    def _cancel_turn(self, session_id: str, turn_id: int, by: str | None) -> None:
        driver = self._drivers.get(session_id)
        if driver is None:
            return
        driver.cancelled_by = by or "someone"
        if driver.turn_id == turn_id and driver.turn is not None and not driver.turn.done():
            driver.turn.cancel()
        else:
            driver.cancel_turn_id = turn_id  # the driver has taken it but not started it yet

    # -- turn driving ---------------------------------------------------------------------------

    def _kick(self, session_id: str) -> None:
        driver = self._drivers.get(session_id)
        if driver is not None:
            driver.wake = True
            return
        task = asyncio.create_task(self._drive(session_id), name=f"turns:{session_id}")
        self._drivers[session_id] = _Driver(task)

    async def _drive(self, session_id: str) -> None:
        first = True
        holding = False
        heartbeat: asyncio.Task[None] | None = None
        try:
            while True:
                driver = self._drivers[session_id]
                driver.wake = False
                # After a turn, look again only if something waits (one read), after its quiet window.
                if first or await self._quiet_window(session_id):
                    if self.leases is not None and not holding:
                        holding = await self._take_lease(session_id)
                        if not holding:  # another replica runs this session: it will take what waits,
                            if await self.inputs.last_arrival(session_id) is None:  # or we try again
                                return
                            await asyncio.sleep(self.config.lease_retry_s)
                            continue
                        heartbeat = asyncio.create_task(self._heartbeat(session_id, driver))
                    async with self._slots:
                        started = await self._next(session_id, resume=first)
                        if started is not None:
                            await self._run(*started)
                else:
                    started = None
                first = False
                if started is None and not driver.wake:
                    return
        except Exception:
            log.exception("turn driver for %s stopped", session_id)
        finally:
            self._drivers.pop(session_id, None)
            if heartbeat is not None:
                heartbeat.cancel()
            if holding and self.leases is not None:
                await asyncio.shield(self.leases.release(_lease_name(session_id), self.holder))

    async def _take_lease(self, session_id: str) -> bool:
        assert self.leases is not None
        return await self.leases.acquire(_lease_name(session_id), self.holder,
                                         timedelta(seconds=self.config.lease_ttl_s), self.clock.now())

    async def _heartbeat(self, session_id: str, driver: _Driver) -> None:
        assert self.leases is not None
        while True:
            await asyncio.sleep(self.config.lease_ttl_s / 3)
            if not await self.leases.renew(_lease_name(session_id), self.holder,
                                           timedelta(seconds=self.config.lease_ttl_s), self.clock.now()):
                # Another replica took the session over (we stalled past the lease): stop, never run twice.
                log.error("lost the lease on %s; stopping its turn here", session_id)
                if driver.turn is not None:
                    driver.turn.cancel()
                return

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

    async def _next(self, session_id: str, *, resume: bool) -> tuple[TurnInfo, str, tuple[str, ...]] | None:
        # Only a driver's first look can find an interrupted turn: they exist only from before start().
        resumed = await self.conversations.resume_interrupted(session_id, self.clock.now()) if resume else None
        if resumed is not None:
            return resumed, "", ()
        taken = await self.inputs.take_batch(session_id, self.config.queue_mode, self.config.budget,
                                             self.clock.now())
        if taken is None:
            return None
        return taken.turn, taken.text, taken.images

    async def _run(self, turn: TurnInfo, text: str, images: tuple[str, ...]) -> None:
        agent = self.agents.get(turn.session.agent)
        driver = self._drivers[turn.session.id]
        logcontext.session_id.set(turn.session.id)  # every line logged for this turn carries both
        logcontext.turn_id.set(turn.id)
        log.info("turn %s started (session %s)", turn.id, turn.session.id)
        self.bus.emit(InputsTaken(turn.session, turn.id, turn.inputs, steered=False))
        self.bus.emit(TurnStarted(turn.session, turn))
        driver.turn_id = turn.id
        if driver.cancel_turn_id != turn.id:
            driver.cancelled_by = None
        driver.turn = asyncio.create_task(
            self.runner.run(turn, agent, images=images, steer=lambda: self._steer(turn)), name=f"turn:{turn.id}"
        )
        if driver.cancel_turn_id == turn.id:
            driver.turn.cancel()
        try:
            answer = await driver.turn
        except asyncio.CancelledError:
            if driver.cancelled_by is None or _current_task_cancelling():
                log.warning("turn %s interrupted; it resumes at the next start", turn.id)
                raise
            await self._cancelled(turn, driver.cancelled_by)
        except ProviderError as exc:
            await self._fail(turn, exc.kind, exc.user_message)
        except StepLimitReached as exc:
            await self._fail(turn, "step_limit", str(exc))
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
            driver.turn = driver.turn_id = driver.cancel_turn_id = None
            if any(i in self._waiters for i in turn.input_ids) or driver.steered:
                final = await self.conversations.turn_info(turn.id)
                await self._resolve_turn(final or turn)
            driver.steered = False

    async def _steer(self, turn: TurnInfo) -> list[ChatMessage]:
        taken: Taken | None = await self.inputs.take_steered(turn.id, self.config.queue_mode, self.config.budget,
                                                             self.clock.now())
        if taken is None:
            return []
        driver = self._drivers.get(turn.session.id)
        if driver is not None:
            driver.steered = True
        self.bus.emit(InputsTaken(turn.session, turn.id, taken.refs, steered=True))
        log.info("turn %s took %d waiting message(s) in at a tool step", turn.id, len(taken.refs))
        return [ChatMessage("user", taken.text, images=taken.images)]

    async def _finish(self, turn: TurnInfo, answer: str) -> None:
        final = await self.conversations.finish_turn(turn.id, status=TurnStatus.FINISHED, answer=answer,
                                                     error=None, now=self.clock.now())
        log.info("turn %s finished (session %s)", turn.id, turn.session.id)
        self.bus.emit(TurnFinished(final.session, final, answer or "(the model returned an empty answer)"))

    async def _cancelled(self, turn: TurnInfo, by: str) -> None:
        saved = await self.conversations.final_answer(turn.id)
        if saved is not None:  # the stop lost the race: the answer exists, so it is the outcome
            await self._finish(turn, saved)
            return
        # Said in the transcript, so the model knows that request was dropped, not still pending.
        await self.conversations.add_message(turn.session.id, role="assistant", content=f"(stopped by {by})",
                                             turn_id=turn.id, now=self.clock.now())
        final = await self.conversations.finish_turn(turn.id, status=TurnStatus.CANCELLED, answer=None,
                                                     error=f"stopped by {by}", now=self.clock.now())
        log.info("turn %s stopped by %s", turn.id, by)
        self.bus.emit(TurnCancelled(final.session, final, by))

    async def _fail(self, turn: TurnInfo, kind: str, message: str) -> None:
        message = await self.runner.redact(message)  # e.g. a provider error quoting the API key
        log.warning("turn %s failed (%s): %s", turn.id, kind, message)
        final = await self.conversations.finish_turn(turn.id, status=TurnStatus.FAILED, answer=None,
                                                     error=message, now=self.clock.now())
        self.bus.emit(TurnFailed(final.session, final, kind, message))


def _lease_name(session_id: str) -> str:
    return f"session:{session_id}"


def _is_command(text: str) -> bool:
    return text.lower() in _STOP_WORDS or _QUEUE_COMMAND.match(text) is not None


def _current_task_cancelling() -> bool:
    """True when the driver itself is being cancelled (shutdown), not just the turn it awaits."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


_STOP_REFUSED = ("You can't stop this: only whoever asked for it, an approver or an admin can. "
                 "Nothing was stopped.")
_QUEUE_REFUSED = ("You can't change the queue mode here: only whoever asked for the work in progress, an approver "
                  "or an admin can. Nothing was changed.")
_PAUSED = "The bot is paused by an operator and is not taking new requests right now; try again later."
_INTERRUPTED_TWICE = (
    "I was restarted twice while working on this and stopped, so it may be half done. "
    "Check the state of anything I was changing, then ask again."
)
