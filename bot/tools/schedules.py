"""``schedule_create`` (gated), ``schedule_list`` and ``schedule_cancel`` over core's schedule service."""

from __future__ import annotations

from typing import Any

from core.errors import InvalidInput, NotAllowed, ToolError
from core.people import Person
from core.schedules import ScheduleService
from core.store import ConversationStore
from core.tools import SUBAGENT_CANNOT_ASK, Risk, Tool, ToolContext
from core.triggers import TriggerSpec


def schedule_tools(service: ScheduleService, conversations: ConversationStore, *, channel: str) -> list[Tool]:
    """``channel``: the channel whose destinations (``#name`` or an id) the model's schedules post to."""

    async def _channel_of(ctx: ToolContext) -> str:
        """The channel of the person the model acts for: that of the conversation it serves."""
        session = await conversations.get_session(ctx.session_id)
        if session is None:
            raise ToolError("this conversation is not stored")
        return session.channel

    async def create(ctx: ToolContext, args: dict[str, Any]) -> str:
        if ctx.subagent:  # its destination is asked of a person, in the conversation: a sub-agent has none
            raise ToolError(f"a schedule's destination needs a person's approval, and {SUBAGENT_CANNOT_ASK}")
        if ctx.sender is not None and ctx.requester is None:  # an event's turn: nobody would own it, or answer for it
            raise ToolError("only a person can create a schedule; this turn was started by an event, not by a person")
        origin = await conversations.get_session(ctx.session_id)
        if origin is None:
            raise ToolError("this conversation is not stored")
        trigger = TriggerSpec(cron=args.get("cron"), every_seconds=args.get("every_seconds"), at=args.get("at"),
                              timezone=args.get("timezone") or "UTC")
        try:
            schedule = await service.create(prompt=str(args["prompt"]), trigger=trigger,
                                            destination=str(args["destination"]), agent=ctx.agent,
                                            creator=ctx.sender or "unknown", origin=origin, channel=channel,
                                            trust=ctx.trust)
        except (InvalidInput, NotAllowed) as exc:
            raise ToolError(str(exc)) from None
        return (f"schedule {schedule.id} created ({schedule.describe()}, posting to {schedule.destination}); "
                "it becomes active once someone approves that destination (asked in this conversation)")

    async def list_(ctx: ToolContext, _args: dict[str, Any]) -> str:
        # What the person asking may see: this conversation's place (asked for here or posting here),
        # or everything for an admin. The model never widens that.
        rows = await service.list(place=ctx.place, viewer=Person(await _channel_of(ctx), ctx.sender or ""),
                                  trust=ctx.trust)
        if not rows:
            return "no schedules here"
        return "\n".join(
            f"{r.id}: {r.describe()} → {r.destination} [{r.status}] "
            f"by {r.creator}; firings {r.firings}; last: {r.last_outcome or 'none yet'}; prompt: {r.prompt[:80]}"
            for r in rows)

    async def cancel(ctx: ToolContext, args: dict[str, Any]) -> str:
        try:
            return await service.change(int(args["schedule_id"]), "cancel", by=ctx.sender or "",
                                        channel=await _channel_of(ctx), place=ctx.place or "", trust=ctx.trust)
        except InvalidInput as exc:
            raise ToolError(str(exc)) from None

    return [
        Tool(
            name="schedule_create",
            description=("Run a prompt on a schedule and post each answer to a channel. Give exactly one of cron "
                         "(5 fields), every_seconds, or at (ISO 8601). A person approves the call, then the "
                         "destination."),
            parameters={
                "type": "object",
                "properties": {
                    "prompt": {"type": "string", "minLength": 1},
                    "cron": {"type": "string"},
                    "every_seconds": {"type": "integer", "minimum": 1},
                    "at": {"type": "string"},
                    "timezone": {"type": "string", "default": "UTC"},
                    "destination": {"type": "string", "description": "#name or channel id"},
                },
                "required": ["prompt", "destination"],
                "additionalProperties": False,
            },
            risk=Risk.GATED, function=create, timeout_s=60, pattern_arg="destination",
            editable=False,  # the schedule is its creator's, the asker: never a prompt an approver wrote
        ),
        Tool(name="schedule_list", description=("List the schedules asked for in or posting to this channel (every "
                                                 "one for an admin), their status and last outcome."),
             parameters={"type": "object", "properties": {}, "additionalProperties": False},
             risk=Risk.SAFE, function=list_, timeout_s=30),
        Tool(name="schedule_cancel", description="Cancel a schedule (its creator or an admin only).",
             parameters={"type": "object", "properties": {"schedule_id": {"type": "integer"}},
                         "required": ["schedule_id"], "additionalProperties": False},
             risk=Risk.SAFE, function=cancel, timeout_s=30),
    ]
