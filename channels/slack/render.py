"""Slack rendering of core events: progress reactions, notices, failures, approval and credential cards, DMs.

Answers are not posted here: core delivers them through the port (``channels.slack.port``).
"""

from __future__ import annotations

import logging

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from channels.slack.api import error_code
from channels.slack.approvals import SlackApprovals
from channels.slack.credentials import SlackCredentials
from channels.slack.port import SlackPort
from core.events import (
    ApprovalRequested,
    ApprovalResolved,
    CredentialRequested,
    CredentialResolved,
    DirectNotice,
    Event,
    InputQueued,
    InputsTaken,
    Notice,
    TurnCancelled,
    TurnFailed,
    TurnFinished,
)
from core.model import MessageRef

log = logging.getLogger(__name__)

PROGRESS_REACTION = "eyes"  # a turn is working on this message
QUEUED_REACTION = "hourglass_flowing_sand"  # this message waits behind the running turn


class SlackRenderer:
    def __init__(self, client: AsyncWebClient, port: SlackPort, approvals: SlackApprovals,
                 credentials: SlackCredentials) -> None:
        self.client = client
        self.port = port
        self.approvals = approvals
        self.credentials = credentials
        # Which messages show the "queued" sign (a rendering detail, so memory is enough: after a
        # restart a leftover sign is only cosmetic).
        self._queued_signs: set[MessageRef] = set()

    async def render(self, event: Event) -> None:
        if isinstance(event, DirectNotice):
            await self._direct(event.user, event.text)
            return
        ref = event.session.reply_ref
        channel, thread_ts = ref.get("channel"), ref.get("thread_ts")
        if not channel:
            return
        if isinstance(event, InputQueued):
            self._queued_signs.add(event.ref)
            await self._react("reactions_add", event.ref, QUEUED_REACTION)
        elif isinstance(event, InputsTaken):
            for item in event.refs:
                if item in self._queued_signs:
                    self._queued_signs.discard(item)
                    await self._react("reactions_remove", item, QUEUED_REACTION)
                await self._react("reactions_add", item, PROGRESS_REACTION)
        elif isinstance(event, TurnFinished | TurnCancelled):
            await self._clear(event.turn.inputs)
        elif isinstance(event, TurnFailed):
            await self.port.post(channel, thread_ts, f":warning: {event.message}")
            await self._clear(event.turn.inputs)
        elif isinstance(event, Notice):
            await self.port.post_notice(event.session, event.text)
        elif isinstance(event, ApprovalRequested):
            await self.approvals.announce(event.request)
        elif isinstance(event, ApprovalResolved):
            await self.approvals.resolve(event.request)
        elif isinstance(event, CredentialRequested):
            await self.credentials.announce(event.request)
        elif isinstance(event, CredentialResolved):
            await self.credentials.resolve(event.request)

    async def _clear(self, refs: tuple[MessageRef, ...]) -> None:
        for item in refs:
            await self._react("reactions_remove", item, PROGRESS_REACTION)

    async def _direct(self, user: str, text: str) -> None:
        try:
            opened = await self.client.conversations_open(users=user)
            await self.client.chat_postMessage(channel=opened["channel"]["id"], text=text)
        except SlackApiError as exc:
            log.error("could not DM %s: %s", user, error_code(exc))

    async def _react(self, method: str, item: MessageRef, name: str) -> None:
        if not item.channel or not item.ts:
            return
        try:
            await getattr(self.client, method)(channel=item.channel, timestamp=item.ts, name=name)
        except SlackApiError as exc:
            code = error_code(exc)
            if code not in ("already_reacted", "no_reaction"):
                log.warning("%s failed: %s", method, code)
