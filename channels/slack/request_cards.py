"""One request card in Slack, whatever it asks: an approval, a budget's Continue, a credential, a connection.

Every card has the same shape: what is asked (the kind's own sections); then, while it waits, one line
saying who may answer and until when, and its buttons (in block ``<kind>:<id>``, each carrying only the
request id: the request itself is in the database); once settled, one line saying how it ended. A card
is posted in its request's thread, where it landed is recorded through the Gateway, and it is updated in
place once the request is settled.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from channels.slack.api import error_code
from channels.slack.threads import SessionThreads
from core.requests import PersonRequest

log = logging.getLogger(__name__)

# How a settled card begins, by its status (every kind's statuses are these strings).
OUTCOME_ICON = {"approved": ":white_check_mark:", "provided": ":white_check_mark:", "connected": ":white_check_mark:",
                "denied": ":x:", "expired": ":hourglass:", "cancelled": ":no_entry_sign:"}


@dataclass(frozen=True)
class Button:
    label: str
    action_id: str
    style: str | None = None  # "primary", "danger"; None: a plain button


@dataclass(frozen=True)
class RequestCard:
    kind: str  # what its block id begins with: approval, credential, connection
    request_id: int
    asked: list[dict[str, Any]]  # what is asked: the kind's own blocks
    pending: bool
    answer: str  # while pending: who may answer and until when; once settled: how it ended
    buttons: tuple[Button, ...] = ()  # while pending


def card_blocks(card: RequestCard) -> list[dict[str, Any]]:
    blocks = [*card.asked, context(card.answer)]
    if card.pending:
        value = str(card.request_id)
        blocks.append({"type": "actions", "block_id": f"{card.kind}:{card.request_id}",
                       "elements": [button_element(b, value) for b in card.buttons]})
    return blocks


def outcome(request: PersonRequest, text: str) -> str:
    """A settled card's last line: its icon, then ``text``."""
    return f"{OUTCOME_ICON.get(request.status, '')} {text}"


def by_mention(summary: str, user: str | None) -> str:
    """Mention whoever answered when it is a Slack user id."""
    if user and user[:1] in ("U", "W") and user[1:].isalnum():
        return summary.replace(f"by {user}", f"by <@{user}>")
    return summary


def until(when: datetime) -> str:
    """When a request expires, as the reader's own clock time."""
    return f"<!date^{int(when.timestamp())}^{{time}}|{when:%H:%M} UTC>"


def section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text}}


def context(text: str) -> dict[str, Any]:
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": text}]}


def carried_id(value: Any) -> int | None:
    """The request id our own buttons carry: a string of digits, nothing else (not a JSON number, not "+1")."""
    if not isinstance(value, str) or re.fullmatch(r"[0-9]{1,18}", value) is None:
        return None
    return int(value)


def button_element(button: Button, value: str) -> dict[str, Any]:
    shown: dict[str, Any] = {"type": "button", "action_id": button.action_id,
                             "text": {"type": "plain_text", "text": button.label}, "value": value}
    if button.style is not None:
        shown["style"] = button.style
    return shown


class CardMessages:
    """Posting a kind's cards in their requests' threads, and updating them in place (``what`` names the
    kind in logs)."""

    def __init__(self, client: AsyncWebClient, what: str, threads: SessionThreads) -> None:
        self.client = client
        self.what = what
        self.threads = threads

    async def post(self, request: PersonRequest, text: str, blocks: list[dict[str, Any]]) -> dict[str, Any] | None:
        """In the request's thread (a conversation's first post opens it); where it landed (None: Slack refused,
        already logged)."""
        async def send(channel: str, thread_ts: str | None) -> dict[str, Any] | None:
            try:
                posted = await self.client.chat_postMessage(channel=channel, thread_ts=thread_ts, text=text,
                                                            blocks=blocks)
            except SlackApiError as exc:
                log.error("could not post %s %s: %s", self.what, request.id, error_code(exc))
                return None
            return {"channel": posted["channel"], "ts": posted["ts"]}

        return await self.threads.post(request.session, send, lambda where: where["ts"] if where else None)

    async def update(self, request: PersonRequest, where: dict[str, Any], text: str,
                     blocks: list[dict[str, Any]]) -> None:
        try:
            await self.client.chat_update(channel=where["channel"], ts=where["ts"], text=text, blocks=blocks)
        except (SlackApiError, KeyError) as exc:
            log.error("could not update %s %s: %s", self.what, request.id,
                      error_code(exc) if isinstance(exc, SlackApiError) else "no such message")
