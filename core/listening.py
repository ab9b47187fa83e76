"""Turns nobody asked for (SPEC §17, listening channels): the model may stay silent.

A turn whose every message came unaddressed, in a place the bot listens in (``TurnInfo.answer_optional``), is
offered ``no_reply`` and told it may use it. It ends silently when the model calls it or answers with nothing: the
turn is finished with no answer, and no outbox row is written in that commit, so nothing is ever posted for it (not
after a crash either). ``no_reply`` is the runner's own, never a registered tool: no policy, approval or agent's
tool list can give it to a turn that owes an answer, or take it from one that does not.
"""

from __future__ import annotations

from typing import Any

NO_REPLY = "no_reply"

NO_REPLY_SPEC: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": NO_REPLY,
        "description": "End this turn without posting anything: nobody addressed you, and you have nothing useful "
                       "to add.",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
    },
}

LISTENING_NOTE = (
    "\n\nNobody addressed you in the latest message: you are listening in this channel. Answer only if you have "
    f"something useful to add. Otherwise call `{NO_REPLY}` (or answer with nothing), and nothing is posted."
)


def silent(answer: str) -> bool:
    """An answer that says nothing: in a turn whose answer is optional, it ends the turn silently."""
    return not answer.strip()
