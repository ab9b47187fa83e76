"""What core calls on the web chat: an answer is already in the transcript and on the stream when it is delivered."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from core.errors import FetchFailed, InvalidInput
from core.model import SessionInfo
from core.ports import DeliveryId, Receipt

WEB_USER = "web"  # whoever uses the web chat (local, or holding BOT_WEB_TOKEN): one person



class WebPort:
    name = "web"

    def __init__(self, publish: Callable[[str, dict[str, Any]], None]) -> None:
        self._publish = publish  # to the browsers watching a conversation

    async def deliver(self, session: SessionInfo, text: str, *, delivery_id: DeliveryId,
                      resume: bool = False) -> Receipt:
        # The browser reads the answer from the transcript (and saw it on the stream): nothing to send.
        return Receipt(f"turn:{delivery_id.turn_id}")

    async def find_delivered(self, session: SessionInfo, delivery_id: DeliveryId) -> Receipt | None:
        return Receipt(f"turn:{delivery_id.turn_id}")

    async def resolve_destination(self, destination: str) -> str:
        raise InvalidInput("the web chat cannot be a schedule's destination: name a Slack channel")

    async def group_members(self, group_id: str) -> set[str]:
        return set()

    async def sender_trust(self, sender: str, place: str | None) -> str | None:
        # Whoever reaches the web chat is on this machine or holds its token: a member (BOT_ADMINS=web: an admin).
        return "member"

    async def post_notice(self, session: SessionInfo, text: str) -> bool:
        self._publish(session.id, {"type": "notice", "text": text})
        return True

    async def fetch_file(self, source: str, max_bytes: int) -> bytes:
        raise FetchFailed("the web chat does not take files")
