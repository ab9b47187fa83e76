"""The dispatcher: the one entry point channel adapters call, and the loop that runs turns (SPEC §5).

- Single flight per session, parallel across sessions up to ``max_concurrent_turns``.
- Every accepted input is in the database before ``accept`` returns; the in-memory driver table is
  only a wake-up signal, rebuilt from the database at start.
- Messages arriving while a turn runs are steered into it at its next tool step (``steer``), or
  merged into the next turn after a quiet window (``collect``, and ``steer`` when the turn ended
  before a tool step), or run one by one (``followup``).

The jobs it delegates: running turns (core.turns), session leases across replicas (core.leasing),
and stopping or re-queueing work, with who may (core.controls).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field, replace
from datetime import timedelta

from core.agents import AgentDirectory
from core.approvals import ApprovalPolicy
from core.clock import Clock
from core.controls import Controls, StopReport, is_command
from core.errors import CoreError, InvalidInput
from core.events import EventBus, InputQueued, Notice, TurnFailed
from core.leasing import SessionLeases
from core.model import (
    RESERVED_SESSION_PREFIXES,
    Inbound,
    InputKind,
    Outcome,
    QueueMode,
    SessionInfo,
    SessionSummary,
    TranscriptEntry,
)
from core.runner import AgentRunner
from core.store import (
    Accepted,
    AcceptOutcome,
    Budget,
    ControlStore,
    ConversationStore,
    InputStore,
    LeaseStore,
)
from core.text import clean_text
from core.turns import OutcomeWaiters, TurnDrivers

log = logging.getLogger(__name__)

MAX_TEXT_CHARS = 40_000
DELIVERY_RETENTION = timedelta(days=2)  # Slack retries for minutes; keep ids far longer than that


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
        self._accepting = False
        self.leases = leases  # with several replicas: one process at a time runs a session
        self.leasing = SessionLeases(leases, clock, config.lease_ttl_s)
        self.holder = self.leasing.holder
        # Who may stop or re-queue someone else's work: approvers and admins (without one: nobody).
        self.policy = policy or ApprovalPolicy((), ())
        self.controls = Controls(conversations, inputs, control, agents, self.policy, clock, config.queue_mode,
                                 cancel=self.cancel)
        self.waiters = OutcomeWaiters(inputs)
        self.turns = TurnDrivers(conversations, inputs, runner, agents, bus, clock, config, self.leasing,
                                 self.waiters, queue_mode=self.queue_mode)

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Recover what a dead process left, then resume every session with work to do."""
        await self._recover_abandoned()
        for session_id in await self.conversations.sessions_with_work():
            self.turns.kick(session_id)
        await self.inputs.prune_deliveries(self.clock.now() - DELIVERY_RETENTION)
        if self.leasing.enabled:
            self.leasing.start_sweeper(self._recover_abandoned)
        self._accepting = True

    async def _recover_abandoned(self) -> None:
        """Turns left running by a process that is gone: continued once, or failed and told. With
        several replicas, only sessions whose lease ran out (its holder died) are recovered."""
        sessions: list[str] | None = None
        if self.leasing.enabled:
            unheld = await self.leasing.unheld(await self.conversations.running_sessions())
            sessions = [s for s in unheld if not self.turns.driving(s)]
        failed = await self.conversations.requeue_interrupted(self.config.max_turn_attempts, self.clock.now(),
                                                              sessions)
        for turn_id in failed:
            info = await self.conversations.turn_info(turn_id)
            if info is not None:
                self.bus.emit(TurnFailed(info.session, info, "interrupted", _INTERRUPTED_TWICE))
        for session_id in sessions or []:
            self.turns.kick(session_id)

    async def stop(self, drain_s: float) -> None:
        """Stop taking input, give running turns ``drain_s`` to finish; the rest resume at next start."""
        self._accepting = False
        self.leasing.stop_sweeper()
        tasks = self.turns.tasks()
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
        return self.turns.count

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
        command = is_command(text) if message.addressed else False
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
            if self.turns.turn_running(session.id):
                assert result.input_id is not None
                self.bus.emit(InputQueued(session, result.input_id, message.ref))
            self.turns.kick(session.id)
        elif result.outcome is AcceptOutcome.REFUSED:
            self.bus.emit(Notice(session, result.note or "refused", message.ref))
        elif result.outcome is AcceptOutcome.COMMAND:
            assert result.input_id is not None
            reply = await self.controls.obey(session, text, message.sender)
            await self.inputs.note(result.input_id, reply)
            self.bus.emit(Notice(session, reply, message.ref))
        return result

    # -- operator controls ----------------------------------------------------------------------

    async def set_paused(self, paused: bool) -> None:
        await self.control.set_intake_paused(paused, self.clock.now())

    async def paused(self) -> bool:
        return await self.control.intake_paused()

    async def queue_mode(self, session_id: str) -> str:
        return await self.controls.queue_mode(session_id)

    async def set_place_queue_mode(self, place: str, mode: str, *, by: str) -> None:
        """A place's queue mode (``/bot queue``): for approvers and admins, and for whoever asked for the
        work in progress there. Refused with InvalidInput."""
        await self.controls.set_place_queue_mode(place, mode, by=by)

    async def latest_live_session(self, place: str) -> str | None:
        return await self.inputs.latest_live_session(place)

    async def stop_latest(self, place: str, *, by: str) -> StopReport | None:
        """``/bot stop``: stop the place's most recently busy conversation (None: nothing is busy). Refused
        with InvalidInput unless ``by`` may control it."""
        return await self.controls.stop_latest(place, by=by)

    async def may_control(self, user: str, session_id: str | None) -> bool:
        """Whether ``user`` may stop a conversation or change how it queues: its requester (who asked for
        its live or latest turn), approvers and admins. A conversation nobody has asked anything yet is
        anyone's to set up. ``session_id`` None stands for a place with nothing busy: approvers and admins."""
        return await self.controls.may_control(user, session_id)

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
        return await self.waiters.wait(input_id)

    async def cancel(self, session_id: str, by: str | None, *, announce: bool = True) -> StopReport:
        """Stop the session's running turn at its next await, and drop the messages waiting behind it."""
        note = f"stopped by {by}" if by else "stopped"
        waiting = await self.inputs.cancel_waiting(session_id, note)
        for input_id in waiting:
            self.waiters.resolve(input_id, Outcome("cancelled", note))
        turn_id = await self.conversations.running_turn(session_id)
        running = turn_id is not None
        if turn_id is not None:
            await self.inputs.cancel_turn_inputs(turn_id, note)
            self.turns.cancel_turn(session_id, turn_id, by)
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
            self.waiters.resolve(input_id, outcome)
        if emptied_turn is not None:
            info = await self.conversations.turn_info(emptied_turn)
            if info is not None:
                self.turns.cancel_turn(info.session.id, emptied_turn, by)


_PAUSED = "The bot is paused by an operator and is not taking new requests right now; try again later."
_INTERRUPTED_TWICE = (
    "I was restarted twice while working on this and stopped, so it may be half done. "
    "Check the state of anything I was changing, then ask again."
)
