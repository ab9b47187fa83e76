"""Rows as the views core passes around: a session, a turn with every input it took, a turn's outcome."""

from __future__ import annotations

import json
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from sqlalchemy import Row
from sqlmodel import Session

from core.model import MessageRef, Outcome, OutcomeStatus, SessionInfo, SessionStatus, TurnInfo, TurnStatus
from core.store import statements as st
from core.store.tables import MessageRow, SessionRow, TurnRow


def session_info(row: SessionRow | Row[Any] | SimpleNamespace) -> SessionInfo:
    """From an ORM row, a Core row of the sessions table or the values just inserted (same attribute names)."""
    return SessionInfo(
        id=row.id,
        channel=row.channel,
        agent=row.agent,
        status=SessionStatus(row.status),
        reply_ref=SessionInfo.parse_reply_ref(row.reply_ref),
        place=row.place,
        preapproved=tuple((str(t), str(s)) for t, s in json.loads(row.preapproved)) if row.preapproved else (),
        model=getattr(row, "model", None),  # not among the values a new session is inserted with
    )


def turn_info(s: Session, turn_id: int, input_message_id: int | None, session: SessionInfo) -> TurnInfo:
    """A turn as events carry it, with every input it took (steered ones too) in arrival order."""
    inputs = s.connection().execute(st.TURN_INPUTS, {"b_turn": turn_id}).all()
    refs = tuple(MessageRef(i.platform_channel, i.platform_ts) for i in inputs)
    ids = tuple(i.id for i in inputs)
    sender = next((i.sender for i in inputs if i.kind == "message"), inputs[0].sender if inputs else None)
    asked = tuple(i.message_id for i in inputs if i.kind == "message" and i.message_id is not None)
    if not inputs and input_message_id is not None:  # a turn from before merged turns existed
        msg = s.get(MessageRow, input_message_id)
        if msg is not None:
            refs, sender, asked = (MessageRef(msg.platform_channel, msg.platform_ts),), msg.sender, (input_message_id,)
    senders = tuple(dict.fromkeys(i.sender for i in inputs if i.sender and i.kind != "control"))
    if not senders and sender is not None:
        senders = (sender,)
    return TurnInfo(id=turn_id, session=session, inputs=refs, sender=sender, input_ids=ids, senders=senders,
                    asked=asked, answer_optional=answer_optional(inputs), trace_context=trace_context(inputs))


def answer_optional(inputs: Sequence[Any]) -> bool:
    """A turn's answer is optional when every message it took is (unaddressed, in a listening place): one that asked
    makes it an answer owed."""
    messages = [i for i in inputs if i.kind == "message"]
    return bool(messages) and all(i.answer_optional for i in messages)


def trace_context(inputs: Sequence[Any]) -> str | None:
    """The trace a turn joins: its first message's (the one that started it), else its first input's that has one."""
    first = next((i.trace_context for i in inputs if i.kind == "message" and i.trace_context), None)
    return first or next((i.trace_context for i in inputs if i.trace_context), None)


def turn_outcome(turn: TurnRow) -> Outcome | None:
    if turn.status == TurnStatus.FINISHED:
        return Outcome(OutcomeStatus.ANSWERED, turn.answer or "", turn.id)
    if turn.status == TurnStatus.FAILED:
        return Outcome(OutcomeStatus.FAILED, turn.error or "failed", turn.id)
    if turn.status == TurnStatus.CANCELLED:
        return Outcome(OutcomeStatus.CANCELLED, turn.error or "stopped", turn.id)
    return None
