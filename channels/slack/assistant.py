"""The assistant pane (Slack's AI app surface): a new chat gets suggested prompts, and the channel the person
is looking at is recorded in that chat's conversation, so the agent knows it.

Messages typed in the pane are direct messages in the chat's own thread: the adapter's intake answers them
in that thread like any DM, with the same dispatcher, approvals and credentials. Bolt's ``Assistant``
middleware is not used: it would take those messages away from that one intake, and it keeps the context in
message metadata (more Web API calls per message), where here the database keeps it.
"""

from __future__ import annotations

import logging
from typing import Any

from slack_bolt.async_app import AsyncApp
from slack_sdk.web.async_client import AsyncWebClient

from channels.slack.api import Later, best_effort
from channels.slack.payloads import is_id, is_ts, team_id, thread_session
from core.errors import InvalidInput
from core.gateway import Gateway
from core.model import Inbound

log = logging.getLogger(__name__)

PROMPTS_TITLE = "Try one of these:"
TITLE_MAX = 60  # characters of the first question that title a chat


class SlackAssistant:
    def __init__(self, app: AsyncApp, client: AsyncWebClient, gateway: Gateway, channel: str,
                 prompts: tuple[tuple[str, str], ...]) -> None:
        self.client = client
        self.gateway = gateway
        self.channel = channel  # the channel's name in core ("slack")
        self.prompts = prompts
        self._later = Later()
        # Chats opened since this process started that have no title yet: the first question names them
        # (a title is cosmetic: one opened before a restart keeps Slack's default).
        self._untitled: dict[tuple[str, str], None] = {}
        app.event("assistant_thread_started")(self._on_started)
        app.event("assistant_thread_context_changed")(self._on_context_changed)

    async def _on_started(self, body: dict[str, Any], event: dict[str, Any]) -> None:
        thread = _thread(body, event)
        if thread is None:
            return
        await self._record_context(body, thread)
        self._untitled[(thread["channel_id"], thread["thread_ts"])] = None
        if len(self._untitled) > 10_000:
            del self._untitled[next(iter(self._untitled))]
        if self.prompts:  # after the ack: Slack's API never delays it
            self._later.run(self._suggest(thread["channel_id"], thread["thread_ts"]))

    def asked(self, channel: str, thread_ts: str, text: str) -> None:
        """A person's message in a chat: the first one in a chat opened here becomes its title."""
        if (channel, thread_ts) not in self._untitled:
            return
        del self._untitled[(channel, thread_ts)]
        title = " ".join(text.split())[:TITLE_MAX] or "New chat"
        self._later.run(best_effort(self.client, "assistant_threads_setTitle", channel_id=channel, thread_ts=thread_ts,
                                    title=title))

    async def _on_context_changed(self, body: dict[str, Any], event: dict[str, Any]) -> None:
        thread = _thread(body, event)
        if thread is not None:
            await self._record_context(body, thread)

    async def _record_context(self, body: dict[str, Any], thread: dict[str, Any]) -> None:
        """What the person is looking at, as context in the chat's conversation (the agent reads it with
        the next question). Stored before the ack; a redelivered event is stored once."""
        context = thread.get("context")
        viewed = context.get("channel_id") if isinstance(context, dict) else None
        if not is_id(viewed):
            return
        team, channel, thread_ts, user = team_id(body), thread["channel_id"], thread["thread_ts"], thread["user_id"]
        event_id = body.get("event_id")
        try:
            await self.gateway.accept(Inbound(
                session_id=thread_session(team, channel, thread_ts), channel=self.channel, sender=user,
                text=f"(Context: I am looking at channel <#{viewed}> (id {viewed}) in Slack.)",
                addressed=False, view_context=True,
                reply_ref={"channel": channel, "thread_ts": thread_ts},
                idempotency_key=f"context:{viewed}:{event_id}" if isinstance(event_id, str) else None,
                delivery_key=f"slack:{event_id}" if isinstance(event_id, str) else None,
                place=f"slack:{team}:{channel}",
            ))
        except InvalidInput as exc:
            log.warning("assistant context not recorded: %s", exc)

    async def _suggest(self, channel: str, thread_ts: str) -> None:
        prompts = [{"title": title, "message": message} for title, message in self.prompts]
        await best_effort(self.client, "assistant_threads_setSuggestedPrompts", channel_id=channel,
                          thread_ts=thread_ts, prompts=prompts, title=PROMPTS_TITLE)


def _thread(body: dict[str, Any], event: dict[str, Any]) -> dict[str, Any] | None:
    """The event's assistant thread (its DM channel, thread ts and user), if it is well formed."""
    thread = event.get("assistant_thread") if isinstance(event, dict) else None
    if not isinstance(thread, dict) or not team_id(body):
        log.warning("assistant event without a thread: ignored")
        return None
    if not (is_id(thread.get("channel_id")) and is_ts(thread.get("thread_ts")) and is_id(thread.get("user_id"))):
        log.warning("assistant event with a malformed thread: ignored")
        return None
    return thread
