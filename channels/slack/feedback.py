"""The feedback buttons under an answer: who found it good or bad, recorded by core, thanked privately."""

from __future__ import annotations

from typing import Any

from slack_bolt.async_app import AsyncApp

from channels.slack.api import PrivateReplies
from channels.slack.blocks import FEEDBACK_ACTION, parse_feedback
from channels.slack.payloads import channel_id, clicked_ts, user_id
from core.errors import InvalidInput
from core.gateway import Gateway


class SlackFeedback:
    def __init__(self, app: AsyncApp, private: PrivateReplies, gateway: Gateway, channel: str) -> None:
        self.private = private
        self.gateway = gateway
        self.channel = channel  # the channel's name in core ("slack")
        app.action(FEEDBACK_ACTION)(self._on_click)

    async def _on_click(self, ack: Any, body: dict[str, Any], action: dict[str, Any]) -> None:
        await ack()
        user, channel, thread_ts = user_id(body), channel_id(body), clicked_ts(body)
        parsed = parse_feedback(action.get("value"))
        if not user or not channel or parsed is None:
            self.private.tell(channel, user, "That button does not belong to an answer I know; nothing was recorded.",
                              thread_ts=thread_ts)
            return
        verdict, turn_id = parsed
        try:
            result = await self.gateway.feedback(turn_id, verdict, by=user, channel=self.channel, posted_in=channel)
        except InvalidInput as exc:  # an unknown answer, or one posted elsewhere
            self.private.tell(channel, user, f"{exc}; nothing was recorded.", thread_ts=thread_ts)
            return
        self.private.tell(channel, user, result.describe(), thread_ts=thread_ts)
