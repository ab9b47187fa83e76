"""The web chat as a plug-in channel (entry point ``web`` of ``bot.channels``): on unless BOT_WEB_CHAT=false."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from pydantic import field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from channels.web.port import WEB_USER
from core.plugins import ChannelContext, ChannelPlugin

if TYPE_CHECKING:
    from channels.web.adapter import WebChannel


class WebSettings(BaseSettings):
    """BOT_WEB_CHAT and BOT_WEB_TOKEN (the server's settings read the token too: it also guards /metrics, and
    HOST decides whether it is required)."""

    model_config = SettingsConfigDict(env_prefix="BOT_WEB_", env_file=".env", env_file_encoding="utf-8",
                                      extra="ignore")
    SECRETS: ClassVar[tuple[str, ...]] = ("token",)

    chat: bool = True
    token: str | None = None

    @field_validator("token", mode="before")
    @classmethod
    def _blank_is_unset(cls, value: object) -> object:
        return None if isinstance(value, str) and not value.strip() else value

    @property
    def enabled(self) -> bool:
        return self.chat

    def secrets(self) -> dict[str, str | None]:
        return {"BOT_WEB_TOKEN": self.token}


def build(settings: WebSettings, context: ChannelContext) -> WebChannel:
    # Imported here: commands that only read settings (bot doctor, bot credentials …) need none of the adapter.
    from channels.web.adapter import WebChannel, WebConfig
    from core.store.web_sessions import WebSessionStore

    secure_cookie = (context.public_url or "").startswith("https://")
    return WebChannel(WebConfig(token=settings.token, secure_cookie=secure_cookie), context.gateway,
                      logins=WebSessionStore(context.db))


def announce(settings: WebSettings, url: str) -> list[str]:
    if not settings.chat:
        return []
    login = " (log in with BOT_WEB_TOKEN)" if settings.token else ""
    return [f"bot: web chat: {url}/{login}"]


plugin = ChannelPlugin(name="web", settings=WebSettings, build=build, announce=announce, shared=False,
                       people=lambda entry: entry == WEB_USER, ids=lambda person: person == WEB_USER)
