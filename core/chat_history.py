"""The stored transcript as the model's messages: rows to chat messages, user runs merged, and where a turn's
own messages begin in that history (core.runner)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from core.providers import ChatMessage, ToolCall


def turn_start(rows: Sequence[Any], turn_id: int, history: list[ChatMessage]) -> int:
    """Where this turn's messages begin in the merged history: after what the rows before its first row
    (by ``turn_id``) make; a resumed turn's own calls and results are its too."""
    first = next((i for i, row in enumerate(rows) if getattr(row, "turn_id", None) == turn_id), len(rows))
    # What to_chat makes of the rows before it, counted without parsing them again: it drops leading non-user rows.
    lead = next((i for i, row in enumerate(rows) if row.role == "user"), len(rows))
    before = max(0, first - lead)
    start = len(merge_user_runs(history[:before]))
    # The last message before it and its first are both the user's: merged into one, which is this turn's.
    if before and before < len(history) and history[before - 1].role == "user" and history[before].role == "user":
        start -= 1
    return max(0, start)


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


def to_chat(rows: Sequence[Any]) -> list[ChatMessage]:
    """Transcript rows (role, content, tool_calls, tool_call_id) as the model's messages."""
    messages: list[ChatMessage] = []
    for row in rows:
        calls = tuple(ToolCall(**c) for c in json.loads(row.tool_calls)) if row.tool_calls else ()
        messages.append(ChatMessage(row.role, row.content, calls, row.tool_call_id))
    # A window that starts mid-exchange would hand the model results without their calls.
    while messages and messages[0].role != "user":
        messages.pop(0)
    return messages
