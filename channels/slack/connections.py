"""Connection requests in Slack: the thread is told what is missing, and only the person who may complete
it gets a URL. The thread message's **Connect …** button asks core for a personal link and answers the
clicker privately with a URL button; the principal is sent one at once. The message is updated when the
request ends."""

from __future__ import annotations

import logging
from typing import Any

from slack_bolt.async_app import AsyncApp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from channels.slack.api import TRANSPORT_ERRORS, Later, PrivateReplies, best_effort, error_code
from channels.slack.formatting import escape
from channels.slack.payloads import channel_id, user_id
from channels.slack.request_cards import (
    Button,
    CardMessages,
    RequestCard,
    by_mention,
    card_blocks,
    carried_id,
    outcome,
    section,
    until,
)
from channels.slack.threads import SessionThreads
from core.errors import NotFound
from core.gateway import Gateway
from core.model import ConnectionRequestInfo, ConnectionStatus

log = logging.getLogger(__name__)

ACTION = "connection:connect"
LINK_ACTION = "connection:open"  # the URL button (Slack still sends its click: acknowledged, nothing else)


class SlackConnections:
    def __init__(self, app: AsyncApp, client: AsyncWebClient, gateway: Gateway,
                 threads: SessionThreads | None = None) -> None:
        self.client = client
        self.gateway = gateway
        self._private = PrivateReplies(client)
        self._later = Later()
        self.threads = threads or SessionThreads(gateway)
        self._cards = CardMessages(client, "connection request", self.threads)
        app.action(ACTION)(self._on_connect_clicked)
        app.action(LINK_ACTION)(self._on_link_clicked)

    async def announce(self, request: ConnectionRequestInfo) -> None:
        where = await self._cards.post(request, request.ask(), request_blocks(request))
        if where is None:
            return
        await self.gateway.connection_shown(request.id, where)
        if request.principal:  # their own account: they get their link at once, privately
            await self._send_link(request.id, request.principal, str(where["channel"]),
                                  (await self.threads.place(request.session))[1])

    async def resolve(self, request: ConnectionRequestInfo) -> None:
        where = request.announcement or (await self.gateway.connection_request(request.id) or request).announcement
        if where:
            await self._cards.update(request, where, request.summary(), request_blocks(request))

    async def _on_connect_clicked(self, ack: Any, body: dict[str, Any], action: dict[str, Any]) -> None:
        await ack()
        user, channel = user_id(body), channel_id(body)
        message = body.get("message")
        thread_ts = message.get("thread_ts") if isinstance(message, dict) else None
        request_id = carried_id(action.get("value"))
        self._later.run(self._send_link(request_id or 0, user, channel, thread_ts if isinstance(thread_ts, str)
                                        else None))

    async def _on_link_clicked(self, ack: Any) -> None:
        await ack()  # the browser opens the URL; nothing to do here

    async def _send_link(self, request_id: int, user: str, channel: str, thread_ts: Any) -> None:
        """A fresh personal link for ``user``, privately; core refuses anyone else (the same words for an
        unknown request and someone else's)."""
        try:
            url = await self.gateway.connect_link(request_id, user, channel="slack")
        except NotFound as exc:
            self._private.tell(channel, user, str(exc), thread_ts=thread_ts)
            return
        request = await self.gateway.connection_request(request_id)
        name = request.connection if request is not None else "the account"
        blocks = link_blocks(name, url)
        text = f"Connect {name}: this link is yours alone, works once, and expires soon."
        if not await best_effort(self.client, "chat_postEphemeral", channel=channel, user=user, text=text,
                                 blocks=blocks, thread_ts=thread_ts):
            await self._direct(user, text, blocks)  # not in that channel (or Slack refused): a DM instead

    async def _direct(self, user: str, text: str, blocks: list[dict[str, Any]]) -> None:
        try:
            opened = await self.client.conversations_open(users=user)
            await self.client.chat_postMessage(channel=opened["channel"]["id"], text=text, blocks=blocks)
        except SlackApiError as exc:
            log.warning("could not send a connect link to %s: %s", user, error_code(exc))
        except TRANSPORT_ERRORS as exc:
            log.warning("could not send a connect link to %s: %s", user, type(exc).__name__)


def request_blocks(request: ConnectionRequestInfo) -> list[dict[str, Any]]:
    pending = request.status == ConnectionStatus.PENDING
    who = f"<@{request.principal}>" if request.principal else "an admin"
    answer = (f"Only {who} can connect it (the link is sent privately) · the agent waits until "
              f"{until(request.expires_at)}" if pending
              else outcome(request, by_mention(escape(request.summary()), request.settled_by)))
    return card_blocks(RequestCard("connection", request.id, [section(f":link: *{escape(request.ask())}*")], pending,
                                   answer, (Button(f"Connect {request.connection}"[:75], ACTION, "primary"),)))


def link_blocks(name: str, url: str) -> list[dict[str, Any]]:
    return [
        {"type": "section", "text": {"type": "mrkdwn", "text": (
            f"Connect *{escape(name)}*: this link is yours alone, works once, and expires soon. Open it in the "
            "browser you finish in.")}},
        {"type": "actions", "elements": [
            {"type": "button", "action_id": LINK_ACTION, "style": "primary", "url": url,
             "text": {"type": "plain_text", "text": f"Connect {name}"[:75]}}]},
    ]
