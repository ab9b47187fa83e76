"""The Slack app manifest: exactly the scopes and events this code uses (kept in ``manifests/``)."""

from __future__ import annotations

import json
from typing import Any, Literal

from channels.slack.blocks import STOP_SHORTCUT

Mode = Literal["socket", "http"]

BOT_SCOPES = [
    "app_mentions:read",  # app_mention events
    "channels:history",  # message.channels: thread replies as context
    "groups:history",  # message.groups (private channels)
    "im:history",  # message.im: direct messages
    "mpim:history",  # message.mpim
    "chat:write",  # replies in threads
    "reactions:write",  # the progress and queued signs on messages
    "assistant:write",  # a working turn's thread status line ("is thinking…")
    "commands",  # the /bot slash command
    "channels:read",  # message_send, the Slack tools: find a public channel by #name; its members
    "groups:read",  # the same for private channels the bot is in
    "channels:manage",  # channel_create, channel_invite, channel_archive (public channels)
    "groups:write",  # the same for private channels
    "channels:join",  # conversations.join: asked for by SPEC §17; no tool joins a channel yet
    "pins:write",  # message_pin
    "usergroups:read",  # BOT_APPROVERS may name user groups (S…): read their members
    "im:write",  # tell a schedule's creator by DM when it keeps failing
    "files:write",  # attach an approval request's arguments in full when they do not fit on the card
    "users:read",  # names in the status line; senders' trust levels (guest, external, bot: core.trust)
    "files:read",  # files shared with a mention: images and text files go to the model
]
# Only when approvers name oncall:<PagerDuty schedule id>: the people on call are found by e-mail
# (users.lookupByEmail). Not asked for otherwise: every member's address is more than the bot needs.
ONCALL_SCOPES = ["users:read.email"]
# The scopes each Slack tool needs (channels.slack.tools): a tool whose scopes the token lacks is not offered, and
# ``bot doctor`` names it. History and read scopes of both kinds: a tool may act in a public or a private channel.
TOOL_SCOPES = {
    "message_read": ("channels:history", "groups:history", "channels:read", "groups:read", "users:read"),
    "channel_create": ("channels:manage", "groups:write", "channels:read", "groups:read"),
    "channel_invite": ("channels:manage", "groups:write", "channels:read", "groups:read", "users:read"),
    "channel_archive": ("channels:manage", "groups:write", "channels:read", "groups:read"),
    "message_pin": ("pins:write", "channels:history", "groups:history", "channels:read", "groups:read"),
}


def tools_lacking(granted: set[str]) -> list[str]:
    """The Slack tools a token with ``granted`` scopes cannot serve (each lacks a scope it needs)."""
    return [tool for tool, needs in TOOL_SCOPES.items() if not set(needs) <= granted]


BOT_EVENTS = [
    "app_mention", "message.channels", "message.groups", "message.im", "message.mpim",
    "assistant_thread_started",  # a new chat in the assistant pane: suggested prompts
    "assistant_thread_context_changed",  # which channel the person is looking at, for the agent
    "agent_session_stopped",  # Slack's own stop button on a working answer: stop that thread's turn
]


# Multi-workspace (distributed) app: these events remove a workspace's install (its token is dead).
DISTRIBUTION_EVENTS = ["app_uninstalled", "tokens_revoked"]


def build_manifest(mode: Mode, *, name: str = "Chat-ops bot", command: str = "/bot",
                   request_url: str = "https://bot.example.com/slack/events",
                   distribution: bool = False, oncall: bool = False) -> dict[str, Any]:
    """``distribution``: the multi-workspace (OAuth) app, installed through ``/slack/install`` (HTTP mode only):
    the redirect URL Slack sends installers back to, and the uninstall events. ``oncall``: approvers name
    PagerDuty rotas (``ONCALL_SCOPES``)."""
    socket = mode == "socket"
    if distribution and socket:
        raise ValueError("a distributed (multi-workspace) app runs in HTTP mode, not Socket Mode")
    slash: dict[str, Any] = {"command": command, "description": "Talk to the chat-ops bot",
                             "usage_hint": "help | status | stop | queue <mode> | approvals | schedule | schedules",
                             "should_escape": False}
    events: dict[str, Any] = {"bot_events": BOT_EVENTS + (DISTRIBUTION_EVENTS if distribution else [])}
    # Buttons (Approve / Deny / Always allow, Stop, feedback), the Deny reason modal, the message shortcut.
    interactivity: dict[str, Any] = {"is_enabled": True}
    if not socket:
        slash["url"] = request_url
        events["request_url"] = request_url
        interactivity["request_url"] = request_url
    oauth: dict[str, Any] = {"scopes": {"bot": BOT_SCOPES + (ONCALL_SCOPES if oncall else [])}}
    if distribution:
        base = request_url.removesuffix("/slack/events")
        oauth = {"redirect_urls": [f"{base}/slack/oauth_redirect"]} | oauth
    return {
        "display_information": {"name": name, "description": "Answers mentions in threads with an LLM agent"},
        "features": {
            "bot_user": {"display_name": name, "always_online": True},
            "app_home": {"messages_tab_enabled": True, "messages_tab_read_only_enabled": False},
            "slash_commands": [slash],
            # The assistant pane: chats with the bot in their own threads (channels.slack.assistant).
            "assistant_view": {"assistant_description": "Ask the chat-ops agent; risky steps wait for approval"},
            "shortcuts": [{"name": "Stop this turn", "type": "message", "callback_id": STOP_SHORTCUT,
                           "description": "Stop the bot's work in this message's thread"}],
        },
        "oauth_config": oauth,
        "settings": {
            "event_subscriptions": events,
            "interactivity": interactivity,
            "org_deploy_enabled": False,
            "socket_mode_enabled": socket,
            "token_rotation_enabled": False,
        },
    }


def render_manifest(mode: Mode, *, distribution: bool = False, oncall: bool = False) -> str:
    return json.dumps(build_manifest(mode, distribution=distribution, oncall=oncall), indent=2) + "\n"
