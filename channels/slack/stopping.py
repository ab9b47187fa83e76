"""Stop controls in Slack: the Stop button on a working answer, Slack's own stop button
(``agent_session_stopped``) and the message shortcut "Stop this turn". Each names one thread exactly.

Who may stop is core's rule (whoever asked, approvers, admins): a refusal is told privately.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from slack_bolt.async_app import AsyncApp

from channels.slack.api import PrivateReplies
from channels.slack.blocks import STOP_ACTION, STOP_SHORTCUT, parse_turn
from channels.slack.payloads import (
    channel_id,
    clicked_thread,
    clicked_ts,
    is_id,
    is_ts,
    team_id,
    thread_session,
    user_id,
)
from core.errors import InvalidInput
from core.gateway import Gateway, StopReport

log = logging.getLogger(__name__)

CLOCK_MARGIN = timedelta(seconds=30)
_NOT_A_THREAD = "That is not a thread I work in; nothing was stopped."


class SlackStopping:
    def __init__(self, app: AsyncApp, private: PrivateReplies, gateway: Gateway) -> None:
        self.private = private
        self.gateway = gateway
        app.action(STOP_ACTION)(self._on_button)
        app.shortcut(STOP_SHORTCUT)(self._on_shortcut)
        app.event("agent_session_stopped")(self._on_session_stopped)

    async def _on_button(self, ack: Any, body: dict[str, Any], action: dict[str, Any]) -> None:
        await ack()
        user, channel, session = user_id(body), channel_id(body), clicked_thread(body)
        turn = parse_turn(action.get("value"))
        if session is None or turn is None:
            self.private.tell(channel, user, _NOT_A_THREAD, thread_ts=clicked_ts(body))
            return
        await self._stop(session, user, channel, turn_id=turn, thread_ts=clicked_ts(body))

    async def _on_shortcut(self, ack: Any, body: dict[str, Any]) -> None:
        await ack()
        user, channel, session = user_id(body), channel_id(body), clicked_thread(body)
        if session is None:
            self.private.tell(channel, user, _NOT_A_THREAD, thread_ts=clicked_ts(body))
            return
        await self._stop(session, user, channel, thread_ts=clicked_ts(body))

    async def _on_session_stopped(self, body: dict[str, Any], event: dict[str, Any]) -> None:
        """Slack's native stop button on a working agent session: stop that thread's turn. Its streams
        end with the turn (the renderer ends them, and clears the status)."""
        team, channel = team_id(body), event.get("channel")
        user, thread_ts, clicked = event.get("user"), event.get("thread_ts"), event.get("event_ts")
        if not (team and is_id(channel) and is_id(user) and is_ts(thread_ts) and is_ts(clicked)):
            log.warning("agent_session_stopped without a thread, a user or a time: ignored")
            return
        # Only a turn that had started when the person clicked: a late redelivery never stops the next one
        # (with room for the difference between Slack's clock and ours; Slack redelivers after a minute).
        before = datetime.fromtimestamp(float(clicked), UTC) + CLOCK_MARGIN
        await self._stop(thread_session(team, channel, thread_ts), user, channel, started_before=before,
                         thread_ts=thread_ts)

    async def _stop(self, session: str, user: str, channel: str, *, turn_id: int | None = None,
                    started_before: datetime | None = None, thread_ts: str | None = None) -> None:
        try:
            report = await self.gateway.stop_thread(session, by=user, turn_id=turn_id, started_before=started_before)
        except InvalidInput as exc:  # not allowed: said only to whoever asked
            self.private.tell(channel, user, str(exc), thread_ts=thread_ts)
            return
        if not (report.running or report.waiting):
            self.private.tell(channel, user, _nothing(turn_id), thread_ts=thread_ts)
        # A stop that did something is announced in the thread by core (a notice).


def _nothing(turn_id: int | None) -> str:
    if turn_id is not None:
        return "That turn has already ended; nothing was stopped."
    return StopReport(running=False, waiting=0).describe(None)
