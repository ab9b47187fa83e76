"""``time_now``: the current date and time, optionally in a named time zone."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from core.clock import Clock, SystemClock
from core.errors import ToolError
from core.tools import Risk, Tool, ToolContext


def time_now_tool(clock: Clock | None = None) -> Tool:
    source = clock or SystemClock()

    async def time_now(_ctx: ToolContext, args: dict[str, Any]) -> str:
        name = args.get("timezone") or "UTC"
        try:
            zone = UTC if name.upper() == "UTC" else ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError):
            raise ToolError(f"unknown time zone {name!r}; use an IANA name such as Europe/Paris") from None
        now: datetime = source.now().astimezone(zone)
        return f"{now.isoformat(timespec='seconds')} ({name}, {now:%A})"

    return Tool(
        name="time_now",
        description="The current date and time. Optionally give an IANA time zone such as 'Europe/Paris'.",
        parameters={
            "type": "object",
            "properties": {"timezone": {"type": "string", "description": "IANA time zone, default UTC"}},
            "additionalProperties": False,
        },
        risk=Risk.SAFE,
        function=time_now,
        timeout_s=5,
        outside_text=False,  # the clock: nothing anyone wrote
    )
