"""Slack as a plug-in channel (entry point ``slack`` of ``bot.channels``): its settings, its ``build``, its
doctor checks, its tools (``message_send``, and those acting in the workspace: channels.slack.workspace_tools),
and its sealed table of workspace installs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from channels.slack.doctor import slack_checks
from channels.slack.payloads import PERSON
from channels.slack.settings import SlackSettings
from channels.slack.toml import SlackSection, listening_of, prompts_of
from core.errors import InvalidInput
from core.plugins import ChannelContext, ChannelPlugin

if TYPE_CHECKING:
    from channels.slack.adapter import SlackChannel
    from core.ports import Channel
    from core.sealed_values import SealedKind
    from core.store.database import Database
    from core.tools import Tool


def build(settings: SlackSettings, context: ChannelContext) -> SlackChannel:
    """``context.section``: the ``[slack]`` table (the assistant pane's prompts), None when bot.toml has none."""
    # Imported here: commands that only read settings (bot doctor, bot credentials …) need none of the adapter.
    from channels.slack.adapter import SlackChannel, SlackConfig
    from channels.slack.installs import slack_install

    install = (slack_install(settings, context.db, context.keys, context.learn_secret, context.clock,
                             context.public_url) if settings.oauth else None)
    listen_channels, listen_rate = listening_of(context.section)
    config = SlackConfig(
        bot_token=settings.bot_token,
        signing_secret=settings.signing_secret,
        app_token=settings.app_token,
        api_url=settings.api_url,
        command=settings.command,
        rate_limit_retries=settings.max_retries,
        progress_delay_s=settings.progress_delay_s,
        streaming=settings.streaming,
        suggested_prompts=prompts_of(context.section),
        listen_channels=listen_channels,
        listen_rate_per_minute=listen_rate,
        stream_delay_s=settings.stream_delay_s,
        stop_offer_s=settings.stop_offer_s,
    )
    return SlackChannel(config, context.gateway, install=install)


def announce(settings: SlackSettings, url: str) -> list[str]:
    if settings.mode == "http":
        return [f"bot: Slack HTTP mode — point the app's request URL at {url}/slack/events"]
    if settings.mode == "socket":
        return ["bot: Slack Socket Mode connected"]
    return ["bot: no Slack settings; set SLACK_BOT_TOKEN and SLACK_SIGNING_SECRET (or SLACK_APP_TOKEN) "
            "to connect Slack"]


def people(entry: str) -> bool:
    """A user (U…, W… for Enterprise Grid) or a user group (S…)."""
    return PERSON.fullmatch(entry) is not None


def sealed(db: Database) -> list[SealedKind[Any]]:
    from channels.slack.store import sealed_installs

    return sealed_installs(db)


def tools(channel: Channel) -> list[Tool]:
    from channels.slack.adapter import SlackChannel
    from channels.slack.message_tool import message_send_tool
    from channels.slack.workspace_tools import WorkspaceTools

    assert isinstance(channel, SlackChannel)
    return [message_send_tool(channel.port.send_message), *WorkspaceTools(channel.port).tools()]


async def resolve_destination(settings: SlackSettings, destination: str) -> str:
    """An event source's destination (``bot doctor``): the channel id, if the bot can post there."""
    if settings.oauth or not settings.bot_token:
        raise InvalidInput("needs SLACK_BOT_TOKEN (one workspace): with several, which one would it post to?")
    from slack_sdk.web.async_client import AsyncWebClient

    from channels.slack.port import SlackPort

    return await SlackPort(AsyncWebClient(token=settings.bot_token, base_url=settings.api_url)).resolve_destination(
        destination)


plugin = ChannelPlugin(name="slack", settings=SlackSettings, build=build, checks=slack_checks, announce=announce,
                       tools=tools, people=people, ids=people, destinations=True, sealed=sealed,
                       section=SlackSection, resolve_destination=resolve_destination)
