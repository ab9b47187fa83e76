"""Which Slack mode the settings describe, checked as one: a bot token (one workspace, HTTP or Socket Mode), or
the OAuth client id and secret (many workspaces, HTTP mode)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bot.settings import Settings


_SHAPES: dict[str, tuple[str, str]] = {  # setting → (one value's pattern, what it must be)
    "slack_bot_token": (r"xoxb-.*", "must be a bot token starting with 'xoxb-'"),
    "slack_app_token": (r"xapp-.*", "must be an app-level token starting with 'xapp-'"),
    "slack_client_id": (r"[0-9]+\.[0-9]+",
                        "must be the app's Client ID from Basic Information (digits, a dot, digits)"),
    "slack_scopes": (r"[a-z][a-z0-9_.:-]*", "is not a Slack scope (comma-separated, e.g. chat:write,commands)"),
    "slack_allowed_teams": (r"T[A-Z0-9]{1,31}", "is not a Slack workspace id (T…, comma-separated)"),
}
_LISTS = ("slack_scopes", "slack_allowed_teams")


def slack_shape_problem(name: str, value: str | None) -> str | None:
    """What is wrong with one Slack setting's value, or None."""
    if value is None:
        return None
    pattern, must = _SHAPES[name]
    if name not in _LISTS:
        return None if re.fullmatch(pattern, value, re.DOTALL) else must
    for item in (part.strip() for part in value.split(",")):
        if item and not re.fullmatch(pattern, item):
            return f"{item!r} {must}"
    return None


def slack_mode_problem(s: Settings) -> str | None:
    """What is inconsistent in the Slack settings, in one line; None when they describe one mode."""
    if bool(s.slack_client_id) != bool(s.slack_client_secret):
        have, lack = (("SLACK_CLIENT_ID", "SLACK_CLIENT_SECRET") if s.slack_client_id
                      else ("SLACK_CLIENT_SECRET", "SLACK_CLIENT_ID"))
        return f"{have} is set but {lack} is not: multi-workspace (OAuth) mode needs both"
    if s.slack_client_id:
        if s.slack_bot_token:
            return ("SLACK_BOT_TOKEN and SLACK_CLIENT_ID/SLACK_CLIENT_SECRET are both set: keep the bot token for "
                    "one workspace, or the client id and secret for many, not both")
        if s.slack_app_token:
            return ("SLACK_APP_TOKEN (Socket Mode) cannot serve multi-workspace (OAuth) mode: unset it and set "
                    "SLACK_SIGNING_SECRET (HTTP mode)")
        if not s.slack_signing_secret:
            return "SLACK_SIGNING_SECRET is required in multi-workspace (OAuth) mode (SLACK_CLIENT_ID is set)"
        return None
    if s.slack_allowed_teams:
        return ("SLACK_ALLOWED_TEAMS is only used in multi-workspace (OAuth) mode: set SLACK_CLIENT_ID and "
                "SLACK_CLIENT_SECRET, or unset it")
    if s.slack_scopes:
        return ("SLACK_SCOPES is only used in multi-workspace (OAuth) mode: set SLACK_CLIENT_ID and "
                "SLACK_CLIENT_SECRET, or unset it")
    if s.slack_bot_token and not (s.slack_signing_secret or s.slack_app_token):
        return ("SLACK_BOT_TOKEN is set but neither SLACK_SIGNING_SECRET (HTTP mode) nor SLACK_APP_TOKEN "
                "(Socket Mode) is")
    if (s.slack_signing_secret or s.slack_app_token) and not s.slack_bot_token:
        return ("SLACK_BOT_TOKEN is required when SLACK_SIGNING_SECRET or SLACK_APP_TOKEN is set (or, for many "
                "workspaces, SLACK_CLIENT_ID and SLACK_CLIENT_SECRET)")
    return None
