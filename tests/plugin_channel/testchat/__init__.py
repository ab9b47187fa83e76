"""A chat channel that lives only in the test suite, installed by its entry point (``testchat-1.0.dist-info``
beside it, found once this folder is on sys.path): the proof that a channel is a plug-in. It touches nothing in
bot/ or core/: it is built from its own settings (``TESTCHAT_*``), takes messages through the ``Gateway``, and
answers what core asks of a channel through its port.

Its person answers every approval request with Approve and every credential request with ``SECRET``."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any, ClassVar

from aiohttp import web
from pydantic_settings import BaseSettings, SettingsConfigDict

from core.errors import FetchFailed
from core.events import ApprovalRequested, CredentialRequested, Event
from core.gateway import Gateway
from core.model import Inbound, SessionInfo
from core.plugins import ChannelContext, ChannelPlugin
from core.ports import DeliveryId, Receipt

PERSON = "P1"
SECRET = "s3cret-from-testchat"


class TestChatSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TESTCHAT_", extra="ignore")
    SECRETS: ClassVar[tuple[str, ...]] = ("token",)

    on: bool = False
    token: str | None = None

    @property
    def enabled(self) -> bool:
        return self.on

    def secrets(self) -> dict[str, str | None]:
        return {"TESTCHAT_TOKEN": self.token}


class TestChatPort:
    """What core calls on the channel: answers land in ``delivered``."""

    def __init__(self) -> None:
        self.delivered: list[tuple[str, str]] = []
        self.answered = asyncio.Event()

    @property
    def name(self) -> str:
        return "testchat"

    async def deliver(self, session: SessionInfo, text: str, *, delivery_id: DeliveryId,
                      resume: bool = False) -> Receipt:
        self.delivered.append((session.id, text))
        self.answered.set()
        return Receipt(f"m{len(self.delivered)}")

    async def find_delivered(self, session: SessionInfo, delivery_id: DeliveryId) -> Receipt | None:
        return None

    async def resolve_destination(self, destination: str) -> str:
        return destination

    async def group_members(self, group_id: str) -> set[str]:
        return set()

    async def post_notice(self, session: SessionInfo, text: str) -> bool:
        return True

    async def sender_trust(self, sender: str, place: str | None) -> str | None:
        return "member"

    async def fetch_file(self, source: str, max_bytes: int) -> bytes:
        raise FetchFailed("testchat shares no files")


class TestChatChannel:
    name = "testchat"

    def __init__(self, settings: TestChatSettings, gateway: Gateway) -> None:
        self.settings = settings
        self.gateway = gateway
        self.started = False
        self.port = TestChatPort()
        self.announced: list[Event] = []  # what core asked this channel to show, in order
        self.answers: list[Any] = []  # what the person's answers achieved
        gateway.subscribe(self._on_event, channel=self.name)

    def routes(self) -> list[web.RouteDef]:
        return []

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.started = False

    async def close(self) -> None:
        return None

    async def say(self, text: str, *, thread: str = "t1") -> None:
        """The person writes to the bot."""
        session = f"testchat:{thread}"
        await self.gateway.accept(Inbound(session_id=session, channel=self.name, sender=PERSON, text=text,
                                          addressed=True, idempotency_key=f"{session}:{datetime.now().isoformat()}",
                                          place=session))

    async def _on_event(self, event: Event) -> None:
        if isinstance(event, ApprovalRequested):
            self.announced.append(event)
            self.answers.append(await self.gateway.decide(event.request.id, "approve", by=PERSON,
                                                          channel=self.name))
        elif isinstance(event, CredentialRequested):
            self.announced.append(event)
            self.answers.append(await self.gateway.provide(event.request.id, SECRET, by=PERSON, channel=self.name))


def build(settings: TestChatSettings, context: ChannelContext) -> TestChatChannel:
    return TestChatChannel(settings, context.gateway)


plugin = ChannelPlugin(name="testchat", settings=TestChatSettings, build=build)
