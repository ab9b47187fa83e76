"""The stored transcript as the model's messages: rows to chat messages (the ones that addressed the bot marked),
where a turn's own messages begin in that history, and user runs merged once it is fitted (core.runner)."""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import replace
from typing import Any

from core.providers import ChatMessage, ToolCall


def turn_start(rows: Sequence[Any], turn_id: int, history: list[ChatMessage]) -> int:
    """Where this turn's messages begin in ``history`` (``to_chat`` of ``rows``, not merged): at its first row
    (by ``turn_id``); a resumed turn's own calls and results are its too."""
    first = next((i for i, row in enumerate(rows) if getattr(row, "turn_id", None) == turn_id), len(rows))
    # What to_chat makes of the rows before it, counted without parsing them again: it drops leading non-user rows.
    lead = next((i for i, row in enumerate(rows) if row.role == "user"), len(rows))
    return min(max(0, first - lead), len(history))


def merge_user_runs(messages: list[ChatMessage]) -> list[ChatMessage]:
    """Consecutive user messages (context, a merged batch, steered input) reach the model as one,
    joined by a blank line, in arrival order."""
    merged: list[ChatMessage] = []
    for message in messages:
        if merged and message.role == "user" and merged[-1].role == "user":
            last = merged[-1]
            text = "\n\n".join(t for t in (last.content, message.content) if t)
            merged[-1] = replace(last, content=text, images=last.images + message.images)
        else:
            merged.append(message)
    return merged


def to_chat(rows: Sequence[Any], asked: Collection[int] = ()) -> list[ChatMessage]:
    """Transcript rows (role, content, tool_calls, tool_call_id) as the model's messages; those whose id is in
    ``asked`` (the turn's inputs that addressed the bot, ``TurnInfo.asked``) are marked so."""
    messages: list[ChatMessage] = []
    for row in rows:
        calls = tuple(ToolCall(**c) for c in json.loads(row.tool_calls)) if row.tool_calls else ()
        messages.append(ChatMessage(row.role, row.content, calls, row.tool_call_id))
    unmarked = set(asked)
    for index in range(len(rows) - 1, -1, -1):  # the turn's own rows are the newest: a few steps back
        if not unmarked:
            break
        ident = getattr(rows[index], "id", None)
        if ident in unmarked:
            unmarked.discard(ident)
            messages[index] = replace(messages[index], asked=True)
    # A window that starts mid-exchange would hand the model results without their calls.
    while messages and messages[0].role != "user":
        messages.pop(0)
    return messages
