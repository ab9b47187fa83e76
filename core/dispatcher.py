"""The dispatcher: intake of every message (``accept``), and the loop that runs turns (SPEC §5).

- Single flight per session, parallel across sessions up to ``max_concurrent_turns``.
- Every accepted input is in the database before ``accept`` returns; the in-memory driver table is
  only a wake-up signal, rebuilt from the database at start.
- Messages arriving while a turn runs are steered into it at its next tool step (``steer``), or
  merged into the next turn after a quiet window (``collect``, and ``steer`` when the turn ended
  before a tool step), or run one by one (``followup``).

The jobs it delegates: running turns (core.turns), session leases across replicas (core.leasing),
and stopping or re-queueing work, with who may (core.controls). It receives those parts built:
``build_dispatcher`` builds them in dependency order, none refers back to the dispatcher. Channels
reach it through ``core.gateway.Gateway``.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from core.agents import AgentDirectory
from core.approval_policy import ApprovalPolicy
from core.attachments import AttachmentReader
from core.clock import Clock
from core.controls import Controls, StopReport, is_command
from core.delivery import Deliveries
from core.errors import InvalidInput, Unavailable
from core.events import EventBus, InputQueued, Notice, TurnFailed
from core.failed_turns import INTERRUPTED
from core.leasing import SessionLeases
from core.model import (
    RESERVED_SESSION_PREFIXES,
    VIEW_KEY,
    Inbound,
    InputKind,
    Outcome,
    QueueMode,
)
from core.outcomes import OutcomeWaiters
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
from core.tracing import INTAKE, NO_TRACING, Tracer
from core.turns import Shutdown, TurnDrivers

log = logging.getLogger(__name__)

MAX_TEXT_CHARS = 40_000
MAX_ATTACHMENTS = 10  # files shared with one message (Slack: ten at most)
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
    outcome_poll_s: float = 1.0  # how soon an outcome recorded by another replica is seen


class Dispatcher:
    """Takes its parts built (``build_dispatcher`` builds them in order); none of them refers back to it."""

    def __init__(
        self,
        conversations: ConversationStore,
        inputs: InputStore,
        control: ControlStore,
        agents: AgentDirectory,
        bus: EventBus,
        clock: Clock,
        config: DispatchConfig,
        *,
        leasing: SessionLeases,
        waiters: OutcomeWaiters,
        turns: TurnDrivers,
        controls: Controls,
        tracer: Tracer = NO_TRACING,
    ) -> None:
        self.conversations = conversations
        self.inputs = inputs
        self.control = control
        self.agents = agents
        self.bus = bus
        self.clock = clock
        self.config = config
        self._accepting = False
        self.leasing = leasing  # with several replicas: one process at a time runs a session
        self.waiters = waiters
        self.turns = turns
        self.controls = controls
        self.tracer = tracer  # every message taken in starts a trace (core.tracing)

    @property
    def runner(self) -> AgentRunner:
        return self.turns.runner

    @property
    def holder(self) -> str:
        return self.leasing.holder

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
            # A turn another replica set aside at shutdown is continued here, like one whose holder died.
            unheld = await self.leasing.unheld(await self.conversations.running_sessions(set_aside=True))
            sessions = [s for s in unheld if not self.turns.driving(s)]
        failed = await self.conversations.requeue_interrupted(self.config.max_turn_attempts, self.clock.now(),
                                                              sessions)
        for turn_id in failed:
            info = await self.conversations.turn_info(turn_id)
            if info is not None:
                self.bus.emit(TurnFailed(info.session, info, INTERRUPTED, _INTERRUPTED_TWICE))
        for session_id in sessions or []:
            self.turns.kick(session_id)

    async def stop(self, drain_s: float) -> Shutdown:
        """Stop taking input; set parked turns aside at once, give running ones ``drain_s`` to finish
        (core.turns.TurnDrivers.shut_down); the rest resume at next start."""
        self._accepting = False
        self.leasing.stop_sweeper()
        report = await self.turns.shut_down(drain_s)
        await self.bus.drain(timeout=5)
        return report

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
        # A new trace, whatever the caller's context: the turn that takes this message joins it (its traceparent is
        # stored with the input). A trace context a request came with is never adopted: outsiders join no trace.
        with self.tracer.span(f"{INTAKE} {message.channel}", {"chatops.channel": message.channel,
                                                               "gen_ai.conversation.id": message.session_id},
                              parent=None) as span:
            accepted = await self._accept(message, internal)
            span.set("chatops.intake.outcome", accepted.outcome.value)
            return accepted

    async def _accept(self, message: Inbound, internal: bool) -> Accepted:
        if not internal and message.session_id.startswith(RESERVED_SESSION_PREFIXES):
            raise InvalidInput(f"session id {message.session_id!r} is reserved")
        if not internal and message.preapproved:
            raise InvalidInput("preapproved calls cannot be set from outside")
        message = replace(message, text=clean_text(message.text))  # stored: no NUL, no lone surrogate
        if message.view_context:  # marked, so a newer view replaces it while it waits (core/store/intake.py)
            message = replace(message, addressed=False,
                              idempotency_key=f"{VIEW_KEY}{message.idempotency_key or secrets.token_hex(8)}")
        if len(message.text) > MAX_TEXT_CHARS:
            raise InvalidInput(f"message is longer than {MAX_TEXT_CHARS} characters")
        if len(message.attachments) > MAX_ATTACHMENTS or any(
                len(a.name) > 255 or len(a.mimetype) > 255 or len(a.source) > 2048 for a in message.attachments):
            raise InvalidInput(f"a message can share at most {MAX_ATTACHMENTS} files, with names of 255 characters")
        if not self._accepting:
            raise Unavailable("the gateway is not accepting messages right now")
        text = message.text.strip()
        command = is_command(text) if message.addressed else False
        # Unaddressed in a listening place: a message whose answer is optional, while the place's rate has room
        # (core.store.listen_rates, counted as it is stored).
        listening = not message.addressed and message.listen_per_minute is not None and message.listen_per_minute > 0
        if not listening and message.listen_per_minute is not None:
            message = replace(message, listen_per_minute=None)
        kind = (InputKind.CONTROL if command else InputKind.MESSAGE if message.addressed or listening
                else InputKind.CONTEXT)
        if kind == InputKind.CONTEXT and not self.config.record_thread_context:
            # Kept nowhere, not even its dedupe keys: the same message arriving later as a mention is
            # then answered (once, by the keys that mention stores).
            return Accepted(AcceptOutcome.IGNORED)
        # Stored and acted on even if our caller goes away meanwhile (a closed connection): once the message
        # is in a commit group it may be committed, and then it must also be answered, not left waiting
        # behind the dedupe key that makes Slack's redelivery a duplicate.
        work = asyncio.ensure_future(self._store_and_act(message, kind, text, self.tracer.traceparent()))
        work.add_done_callback(_retrieved)  # a failure nobody is left to hear is not logged as unretrieved
        return await asyncio.shield(work)

    async def _store_and_act(self, message: Inbound, kind: str, text: str, trace: str | None) -> Accepted:
        # Whether intake is paused is read in the transaction that stores the message.
        result = await self.inputs.accept(
            message, kind=kind, agent=self.agents.get(message.agent).name, refuse=None,
            max_waiting=self.config.max_waiting, now=self.clock.now(),
            refuse_if_paused=_PAUSED if kind == InputKind.MESSAGE and message.addressed else None,
            listen_per_minute=message.listen_per_minute, trace_context=trace,
        )
        session = result.session
        if session is None:
            return result
        if result.outcome is AcceptOutcome.QUEUED:
            if self.turns.turn_running(session.id) and message.addressed:  # nobody waits on an unaddressed one
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

    async def paused(self) -> bool:
        return await self.control.intake_paused()

    async def queue_mode(self, session_id: str) -> str:
        return await self.controls.queue_mode(session_id)

    async def set_place_queue_mode(self, place: str, mode: str, *, by: str, channel: str) -> None:
        """A place's queue mode (``/bot queue``): for approvers and admins, and for whoever asked for the
        work in progress there. Refused with NotAllowed (or InvalidInput: no such mode)."""
        await self.controls.set_place_queue_mode(place, mode, by=by, channel=channel)

    async def stop_place(self, place: str, *, by: str) -> StopReport | None:
        """``/bot stop``: stop the place's one busy conversation (None: nothing is busy). Refused with
        NotAllowed unless ``by`` may control it, and with Conflict when several are busy (no guessing)."""
        return await self.controls.stop_place(place, by=by)

    async def stop_session(self, session_id: str, *, by: str, turn_id: int | None = None,
                           started_before: datetime | None = None) -> StopReport:
        """A Stop control in one conversation (NotAllowed unless ``by`` may control it); with ``turn_id``,
        only while that turn runs (with ``started_before``, only a turn that started by then)."""
        return await self.controls.stop_session(session_id, by=by, turn_id=turn_id, started_before=started_before)

    # -- outcomes and cancellation --------------------------------------------------------------

    async def outcome(self, input_id: int) -> Outcome:
        """Wait until the input is answered, failed, cancelled or refused."""
        return await self.waiters.wait(input_id)

    async def cancel(self, session_id: str, by: str | None, *, announce: bool = True, turn_id: int | None = None,
                     started_before: datetime | None = None) -> StopReport:
        """Stop the session's running turn and drop what waits behind it, whoever asks (core.controls.Controls.cancel);
        ``stop_session`` is the one that checks who may."""
        return await self.controls.cancel(session_id, by, announce=announce, turn_id=turn_id,
                                          started_before=started_before)


def build_dispatcher(
    conversations: ConversationStore,
    inputs: InputStore,
    control: ControlStore,
    runner: AgentRunner,
    agents: AgentDirectory,
    bus: EventBus,
    clock: Clock,
    config: DispatchConfig = DispatchConfig(),
    *,
    leases: LeaseStore | None = None,
    policy: ApprovalPolicy | None = None,
    deliveries: Deliveries | None = None,
    attachments: AttachmentReader | None = None,
    tracer: Tracer = NO_TRACING,
) -> Dispatcher:
    """A dispatcher with its parts, each built before the ones that use it: leases and outcome waiters, then
    the turn drivers, then the controls that stop their turns. ``leases``: with several replicas (None: one
    process); ``policy``: who may stop or re-queue someone else's work (None: only whoever asked for it);
    ``deliveries``: whose outbox a finished answer is claimed from; ``attachments``: reads shared files;
    ``tracer``: where each message's trace begins (core.tracing)."""
    leasing = SessionLeases(leases, clock, config.lease_ttl_s)
    waiters = OutcomeWaiters(inputs, config.outcome_poll_s)
    turns = TurnDrivers(conversations, inputs, control, runner, agents, bus, clock, config, leasing, waiters,
                        outbox=deliveries.outbox if deliveries is not None else None, attachments=attachments)
    controls = Controls(conversations, inputs, control, agents, policy or ApprovalPolicy((), ()), bus, clock,
                        turns, waiters)
    return Dispatcher(conversations, inputs, control, agents, bus, clock, config,
                      leasing=leasing, waiters=waiters, turns=turns, controls=controls, tracer=tracer)


_PAUSED = "The bot is paused by an operator and is not taking new requests right now; try again later."
_INTERRUPTED_TWICE = (
    "I was restarted twice while working on this and stopped, so it may be half done. "
    "Check the state of anything I was changing, then ask again."
)


def _retrieved(task: asyncio.Future[Accepted]) -> None:
    if not task.cancelled():
        task.exception()
