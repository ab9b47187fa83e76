"""``message_send``: post a message to a chat channel (Slack: ``#name`` or a channel id)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from core.tools import Risk, Tool, ToolContext

# Posts text to a channel given as "#name" or an id; returns a human-readable confirmation.
Poster = Callable[[str, str], Awaitable[str]]


def message_send_tool(post: Poster) -> Tool:
    async def message_send(_ctx: ToolContext, args: dict[str, Any]) -> str:
        return await post(str(args["channel"]), str(args["text"]))

    return Tool(
        name="message_send",
        description="Post a message to a Slack channel (#name or channel id). A person must approve it.",
        parameters={
            "type": "object",
            "properties": {
                "channel": {"type": "string", "description": "#name or channel id"},
                "text": {"type": "string", "minLength": 1, "maxLength": 40000},
            },
            "required": ["channel", "text"],
            "additionalProperties": False,
        },
        risk=Risk.GATED,
        function=message_send,
        timeout_s=30,
        pattern_arg="channel",
    )
