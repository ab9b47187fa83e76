"""Block Kit for answers: the text as a ``markdown`` block, the feedback buttons under it, a working turn's Stop.

Action ids are this adapter's contract with its own listeners (``channels.slack.feedback``,
``channels.slack.stopping``); button values carry only a turn id, which core checks against where the
click came from.
"""

from __future__ import annotations

from typing import Any

from channels.slack.formatting import defused

FEEDBACK_ACTION = "answer_feedback"
STOP_ACTION = "turn_stop"
STOP_SHORTCUT = "stop_turn"  # the message shortcut "Stop this turn" (manifests)
_GOOD, _BAD = "positive", "negative"
MAX_ID = 2**31 - 1  # the largest id a table holds (INTEGER on PostgreSQL)


def answer_blocks(text: str, *, feedback_for: int | None = None) -> list[dict[str, Any]]:
    """One part of an answer: its Markdown as a ``markdown`` block (lists, code and tables survive), and under
    the last part the feedback buttons for turn ``feedback_for``."""
    blocks: list[dict[str, Any]] = [{"type": "markdown", "text": defused(text)}] if text.strip() else []
    if feedback_for is not None:
        blocks.append(feedback_block(feedback_for))
    return blocks


def feedback_block(turn_id: int) -> dict[str, Any]:
    return {"type": "context_actions", "elements": [{
        "type": "feedback_buttons", "action_id": FEEDBACK_ACTION,
        "positive_button": {"text": {"type": "plain_text", "text": "Good answer"},
                            "accessibility_label": "This answer helped", "value": f"{_GOOD}:{turn_id}"},
        "negative_button": {"text": {"type": "plain_text", "text": "Bad answer"},
                            "accessibility_label": "This answer missed", "value": f"{_BAD}:{turn_id}"},
    }]}


def stop_block(turn_id: int) -> dict[str, Any]:
    return {"type": "actions", "elements": [{
        "type": "button", "action_id": STOP_ACTION, "style": "danger", "value": str(turn_id),
        "text": {"type": "plain_text", "text": "Stop"},
    }]}


def parse_feedback(value: object) -> tuple[str, int] | None:
    """(verdict, turn id) from a feedback button's value, or None if it is not one of ours."""
    if not isinstance(value, str):
        return None
    verdict, _, turn = value.partition(":")
    turn_id = parse_turn(turn)
    return (verdict, turn_id) if verdict in (_GOOD, _BAD) and turn_id is not None else None


def parse_turn(value: object) -> int | None:
    """A Stop button's turn id, or None if the value is not one."""
    if not isinstance(value, str) or not value.isascii() or not value.isdigit() or len(value) > 10:
        return None
    turn_id = int(value)
    return turn_id if 0 < turn_id <= MAX_ID else None
