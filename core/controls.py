"""Stopping and re-queueing work (SPEC §5): who may, and the commands said in a conversation.

``stop`` (or ``cancel``) stops the conversation's running turn and drops what waits behind it;
``queue`` shows its queue mode and ``queue <mode>`` sets it. Whoever asked for the work may do either,
and so may approvers and admins; ``/bot stop`` and ``/bot queue`` do the same for a whole place.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from core.agents import AgentDirectory
from core.approval_policy import ApprovalPolicy
from core.clock import Clock
from core.errors import Conflict, InvalidInput, NotAllowed
from core.events import EventBus, Notice
from core.model import QUEUE_MODES, SessionInfo
from core.outcomes import OutcomeWaiters
from core.store import ControlStore, ConversationStore, InputStore
from core.turns import TurnDrivers

_QUEUE_COMMAND = re.compile(r"^queue(?:\s+(\w+))?$", re.IGNORECASE)
_STOP_WORDS = {"stop", "stop!", "cancel"}


def is_command(text: str) -> bool:
    """Whether an addressed message is a control command rather than a request for the agent."""
    return text.lower() in _STOP_WORDS or _QUEUE_COMMAND.match(text) is not None


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


class Controls:
    def __init__(
        self,
        conversations: ConversationStore,
        inputs: InputStore,
        control: ControlStore,
        agents: AgentDirectory,
        policy: ApprovalPolicy,  # who may stop or re-queue someone else's work: approvers and admins
        bus: EventBus,
        clock: Clock,
        turns: TurnDrivers,
        waiters: OutcomeWaiters,
    ) -> None:
        self.conversations = conversations
        self.inputs = inputs
        self.control = control
        self.agents = agents
        self.policy = policy
        self.bus = bus
        self.clock = clock
        self.turns = turns
        self.waiters = waiters

    async def queue_mode(self, session_id: str) -> str:
        return await self.turns.queue_mode(session_id)

    async def obey(self, session: SessionInfo, text: str, sender: str) -> str:
        """Carry out a control command said in a conversation; returns the reply."""
        if text.lower() in _STOP_WORDS:
            if not await self.may_control(sender, session.id):
                return STOP_REFUSED
            report = await self.cancel(session.id, by=sender, announce=False)
            return report.describe(sender)
        match = _QUEUE_COMMAND.match(text)
        assert match is not None
        mode = (match.group(1) or "").lower()
        if not mode:
            return f"Queue mode here: {await self.queue_mode(session.id)} (steer, collect or followup)."
        if mode not in QUEUE_MODES:
            return f"Unknown queue mode {mode!r}: use steer, collect or followup."
        if not await self.may_control(sender, session.id):
            return QUEUE_REFUSED
        await self.control.set_session_queue_mode(session.id, mode, self.clock.now())
        return f"Queue mode for this conversation is now {mode}."

    async def set_place_queue_mode(self, place: str, mode: str, *, by: str, channel: str) -> None:
        if mode not in QUEUE_MODES:
            raise InvalidInput(f"unknown queue mode {mode!r}: use steer, collect or followup")
        if not await self.may_control(by, await self.inputs.latest_live_session(place), channel=channel):
            raise NotAllowed(QUEUE_REFUSED)
        await self.control.set_place_queue_mode(place, mode, self.clock.now())

    async def stop_place(self, place: str, *, by: str) -> StopReport | None:
        """``/bot stop`` in a place (which does not say which thread): its one busy conversation. None when
        nothing is busy there; with several, nothing is guessed: Conflict, naming the exact ways."""
        busy = await self.inputs.live_sessions(place, limit=2)
        if not busy:
            return None
        if len(busy) > 1:
            raise Conflict(SEVERAL_BUSY)
        return await self.stop_session(busy[0], by=by)

    async def stop_session(self, session_id: str, *, by: str, turn_id: int | None = None,
                           started_before: datetime | None = None) -> StopReport:
        """Stop one conversation's running turn (and what waits behind it), for someone who may. With
        ``turn_id`` (a Stop button under that turn's work), only while that very turn runs: a click that
        comes after it ended stops nothing, not the turn that came next; with ``started_before`` (a platform's
        stop event, which may come late or twice), only a turn that had started by then. Both are checked
        again where the turn is cancelled, after the permission check (which may ask the platform)."""
        if turn_id is not None and await self.conversations.running_turn(session_id) != turn_id:
            return StopReport(running=False, waiting=0)
        if not await self.may_control(by, session_id):
            raise NotAllowed(STOP_REFUSED)
        return await self.cancel(session_id, by=by, turn_id=turn_id, started_before=started_before)

    async def cancel(self, session_id: str, by: str | None, *, announce: bool = True, turn_id: int | None = None,
                     started_before: datetime | None = None) -> StopReport:
        """Stop the session's running turn at its next await, and drop the messages waiting behind it. With
        ``turn_id`` (or ``started_before``), only if the running turn is that one (or started before then): a
        stop meant for a turn that has ended meanwhile stops nothing, not the turn that came next."""
        if turn_id is not None or started_before is not None:
            current = await self.conversations.running_turn_started(session_id)
            if current is None or (turn_id is not None and current[0] != turn_id) or (
                    started_before is not None and (current[1] is None or current[1] > started_before)):
                return StopReport(running=False, waiting=0)
        note = f"stopped by {by}" if by else "stopped"
        waiting = await self.inputs.cancel_waiting(session_id, note)
        self.waiters.wake(waiting)
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

    async def may_control(self, user: str, session_id: str | None, *, channel: str | None = None) -> bool:
        """``channel``: the person's, where no conversation says it (``/bot queue`` where nothing is live)."""
        if not user:
            return False
        requester = await self.inputs.requester(session_id) if session_id is not None else None
        if session_id is not None and requester is None:
            return True
        if user == requester:
            return True
        session = await self.conversations.get_session(session_id) if session_id is not None else None
        agent = self.agents.get(session.agent if session is not None else None)
        return await self.policy.may_decide(user, requester, agent.approvers,
                                            channel=session.channel if session is not None else channel)


STOP_REFUSED = ("You can't stop this: only whoever asked for it, an approver or an admin can. "
                "Nothing was stopped.")
SEVERAL_BUSY = ("Several threads here are busy, and I won't guess which one you mean: click Stop on the working "
                "message, use the message shortcut \"Stop this turn\" on a message in that thread, or reply `stop` "
                "to me there.")
QUEUE_REFUSED = ("You can't change the queue mode here: only whoever asked for the work in progress, an approver "
                 "or an admin can. Nothing was changed.")
