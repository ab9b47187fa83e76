"""Feedback on answers: a person says an answer was good or bad (the buttons a channel shows under it).

Only an answered turn can be rated, and only from where it was posted: a click names a turn id, and a
turn of another conversation (or channel) is treated as unknown. Each person has one verdict per turn;
clicking again replaces it. The counts are read from the database (``/metrics``, ``bot feedback list``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from core.clock import Clock
from core.errors import InvalidInput, NotFound
from core.events import Event, EventBus
from core.store.conversations import ConversationStore
from core.store.feedback import FeedbackStore

VERDICTS = {"positive": True, "negative": False}
MAX_ID = 2**31 - 1  # the largest id the tables hold (INTEGER on PostgreSQL)


@dataclass(frozen=True)
class FeedbackGiven(Event):
    """A person rated an answer (``changed``: not the verdict they had already given)."""

    name: ClassVar[str] = "feedback.given"
    turn_id: int
    user: str
    positive: bool
    changed: bool


@dataclass(frozen=True)
class FeedbackResult:
    positive: bool
    changed: bool

    def describe(self) -> str:
        """The short private thank-you for whoever clicked."""
        if self.positive:
            return "Thanks for the feedback: noted that this answer helped."
        return ("Thanks for the feedback: noted that this answer missed. To have another go, ask me again "
                "and say what was wrong.")


class FeedbackBook:
    def __init__(self, store: FeedbackStore, conversations: ConversationStore, bus: EventBus, clock: Clock) -> None:
        self.store = store
        self.conversations = conversations
        self.bus = bus
        self.clock = clock

    async def give(self, turn_id: object, verdict: object, by: str, *, channel: str, posted_in: str | None = None,
                   session_id: str | None = None) -> FeedbackResult:
        """Record ``by``'s verdict (``positive`` | ``negative``) on the turn's answer. ``channel`` and
        ``posted_in`` (the place's id in that channel's reply reference, e.g. a Slack channel id) or
        ``session_id`` (the conversation, where the channel knows it) say where the click came from: a turn
        answered anywhere else is NotFound, as is an unknown or unanswered one."""
        if posted_in is None and session_id is None:
            raise InvalidInput("feedback must say where it was given")
        if type(turn_id) is not int or not 0 < turn_id <= MAX_ID:
            raise InvalidInput("the answer's id is not a number")
        if not isinstance(verdict, str) or verdict not in VERDICTS:
            raise InvalidInput("feedback must be positive or negative")
        if not by:
            raise InvalidInput("feedback needs to say who gave it")
        turn = await self.conversations.turn_info(turn_id)
        if turn is None or turn.session.channel != channel or (
                posted_in is not None and turn.session.reply_ref.get("channel") != posted_in) or (
                session_id is not None and turn.session.id != session_id):
            raise NotFound("no such answer here")
        positive = VERDICTS[verdict]
        changed = await self.store.record(turn_id, turn.session.id, by, positive, self.clock.now())
        if changed is None:
            raise NotFound("no such answer here")
        self.bus.emit(FeedbackGiven(turn.session, turn_id, by, positive, changed))
        return FeedbackResult(positive, changed)
