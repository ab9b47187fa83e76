"""The ``/bot`` slash command in Slack: check the payload's shape, hand it to core, answer with core's reply.

The grammar, every rule (who may stop, revoke, see or change a schedule) and every word of the reply
are core's (``core.commands``); Slack adds only its marks (``SLACK_MARKS``: escaping, mentions, links).
"""

from __future__ import annotations

from typing import Any

from slack_bolt.async_app import AsyncApp

from channels.errors import MalformedPayload
from channels.slack.formatting import SLACK_MARKS
from channels.slack.payloads import is_id, is_ts, thread_session
from core.gateway import Command, Gateway


class SlackCommands:
    def __init__(self, app: AsyncApp, command: str, channel: str, gateway: Gateway) -> None:
        self.command = command
        self.channel = channel  # the channel's name, for the sessions a command starts
        self.gateway = gateway
        app.command(command)(self._on_command)

    async def _on_command(self, ack: Any, command: dict[str, Any]) -> None:
        team, channel, user = command.get("team_id"), command.get("channel_id"), command.get("user_id")
        text = command.get("text") or ""
        if not is_id(team) or not is_id(channel) or not is_id(user) or not isinstance(text, str):
            raise MalformedPayload("team_id, channel_id or user_id is not a Slack id")  # before any ack
        trigger = command.get("trigger_id")  # shape-checked before bolt: [A-Za-z0-9._-]
        thread_ts = command.get("thread_ts")  # typed in a thread (where Slack says so): that thread exactly
        reply = await self.gateway.command(Command(
            text=text, user=user, channel=self.channel, place=f"slack:{team}:{channel}",
            reply_ref={"channel": channel},  # what the command starts is posted here, at the top level
            trigger=trigger if isinstance(trigger, str) and trigger else None, name=self.command,
            session=thread_session(team, channel, thread_ts) if is_ts(thread_ts) else None,
        ), SLACK_MARKS)
        await ack(text=reply)
