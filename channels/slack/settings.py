"""Slack's settings (``SLACK_*`` in the environment and ``.env``), checked as one: a bot token (one workspace,
HTTP or Socket Mode), or the OAuth client id and secret (many workspaces, HTTP mode)."""

from __future__ import annotations

import re
from typing import ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from channels.slack.manifest import BOT_SCOPES

_SHAPES: dict[str, tuple[str, str]] = {  # setting → (one value's pattern, what it must be)
    "bot_token": (r"xoxb-.*", "must be a bot token starting with 'xoxb-'"),
    "app_token": (r"xapp-.*", "must be an app-level token starting with 'xapp-'"),
    "client_id": (r"[0-9]+\.[0-9]+", "must be the app's Client ID from Basic Information (digits, a dot, digits)"),
    "scopes": (r"[a-z][a-z0-9_.:-]*", "is not a Slack scope (comma-separated, e.g. chat:write,commands)"),
    "allowed_teams": (r"T[A-Z0-9]{1,31}", "is not a Slack workspace id (T…, comma-separated)"),
}
_LISTS = ("scopes", "allowed_teams")


class SlackSettings(BaseSettings):
    """``SLACK_BOT_TOKEN`` is ``bot_token`` here (the prefix is the model's)."""

    model_config = SettingsConfigDict(env_prefix="SLACK_", env_file=".env", env_file_encoding="utf-8",
                                      extra="ignore")
    # Values masked in every log line and reply, and never echoed in a settings error.
    SECRETS: ClassVar[tuple[str, ...]] = ("bot_token", "signing_secret", "app_token", "client_secret")

    bot_token: str | None = None
    signing_secret: str | None = None
    app_token: str | None = None
    api_url: str = "https://slack.com/api/"
    # Multi-workspace (OAuth) mode: the app's client id and secret, instead of SLACK_BOT_TOKEN; SLACK_SCOPES
    # (comma list) defaults to what the manifest asks for.
    client_id: str | None = None
    client_secret: str | None = None
    scopes: str | None = None
    # Multi-workspace mode: the workspaces (T…) that may install the bot and be served; unset: any workspace
    # installed from this machine (the install page then serves only local requests).
    allowed_teams: str | None = None
    command: str = "/bot"
    max_retries: int = Field(default=3, ge=0, le=10)
    # A turn shows its progress reaction once it has run this long (0: at once); a quicker answer is its own sign.
    progress_delay_s: float = Field(default=0.2, ge=0, le=60)
    # Answers stream into the thread while the model writes, once it has written for SLACK_STREAM_DELAY_S
    # (an answer complete sooner is posted whole); needs LLM_STREAM.
    streaming: bool = True
    stream_delay_s: float = Field(default=0.3, ge=0, le=60)
    stop_offer_s: float = Field(default=10.0, ge=0, le=3600)  # a longer turn offers its asker a Stop

    @field_validator("bot_token", "signing_secret", "app_token", "client_id", "client_secret", "scopes",
                     "allowed_teams", mode="before")
    @classmethod
    def _blank_is_unset(cls, value: object) -> object:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("bot_token", "app_token", "client_id", "scopes", "allowed_teams")
    @classmethod
    def _shape(cls, value: str | None, info: ValidationInfo) -> str | None:
        problem = shape_problem(str(info.field_name), value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("api_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value if value.endswith("/") else value + "/"

    @field_validator("command")
    @classmethod
    def _command_shape(cls, value: str) -> str:
        if not value.startswith("/") or len(value) < 2 or " " in value:
            raise ValueError("must look like '/bot'")
        return value

    @model_validator(mode="after")
    def _one_mode(self) -> SlackSettings:
        problem = mode_problem(self)
        if problem is not None:
            raise ValueError(problem)
        return self

    # -- derived --------------------------------------------------------------------------------

    @property
    def enabled(self) -> bool:
        return self.mode is not None

    @property
    def mode(self) -> Literal["socket", "http"] | None:
        if self.oauth:
            return "http"
        if not self.bot_token:
            return None
        return "socket" if self.app_token else "http"

    @property
    def oauth(self) -> bool:
        """Multi-workspace (OAuth) mode: installed into workspaces through /slack/install, a token per workspace."""
        return bool(self.client_id and self.client_secret and self.signing_secret)

    @property
    def allowed_team_set(self) -> frozenset[str] | None:
        """SLACK_ALLOWED_TEAMS as a set; None: not limited (installs only from this machine)."""
        return frozenset(_split(self.allowed_teams)) if self.allowed_teams else None

    @property
    def scope_list(self) -> list[str]:
        """The bot scopes an install asks for (OAuth mode): SLACK_SCOPES, else what the manifest asks for."""
        return _split(self.scopes) if self.scopes else list(BOT_SCOPES)

    def secrets(self) -> dict[str, str | None]:
        """The secret settings by their variable's name (SLACK_BOT_TOKEN, …)."""
        return {f"SLACK_{name.upper()}": getattr(self, name) for name in self.SECRETS}


def _split(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def shape_problem(name: str, value: str | None) -> str | None:
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


def mode_problem(s: SlackSettings) -> str | None:
    """What is inconsistent in the Slack settings, in one line; None when they describe one mode."""
    if bool(s.client_id) != bool(s.client_secret):
        have, lack = (("SLACK_CLIENT_ID", "SLACK_CLIENT_SECRET") if s.client_id
                      else ("SLACK_CLIENT_SECRET", "SLACK_CLIENT_ID"))
        return f"{have} is set but {lack} is not: multi-workspace (OAuth) mode needs both"
    if s.client_id:
        if s.bot_token:
            return ("SLACK_BOT_TOKEN and SLACK_CLIENT_ID/SLACK_CLIENT_SECRET are both set: keep the bot token for "
                    "one workspace, or the client id and secret for many, not both")
        if s.app_token:
            return ("SLACK_APP_TOKEN (Socket Mode) cannot serve multi-workspace (OAuth) mode: unset it and set "
                    "SLACK_SIGNING_SECRET (HTTP mode)")
        if not s.signing_secret:
            return "SLACK_SIGNING_SECRET is required in multi-workspace (OAuth) mode (SLACK_CLIENT_ID is set)"
        return None
    if s.allowed_teams:
        return ("SLACK_ALLOWED_TEAMS is only used in multi-workspace (OAuth) mode: set SLACK_CLIENT_ID and "
                "SLACK_CLIENT_SECRET, or unset it")
    if s.scopes:
        return ("SLACK_SCOPES is only used in multi-workspace (OAuth) mode: set SLACK_CLIENT_ID and "
                "SLACK_CLIENT_SECRET, or unset it")
    if s.bot_token and not (s.signing_secret or s.app_token):
        return ("SLACK_BOT_TOKEN is set but neither SLACK_SIGNING_SECRET (HTTP mode) nor SLACK_APP_TOKEN "
                "(Socket Mode) is")
    if (s.signing_secret or s.app_token) and not s.bot_token:
        return ("SLACK_BOT_TOKEN is required when SLACK_SIGNING_SECRET or SLACK_APP_TOKEN is set (or, for many "
                "workspaces, SLACK_CLIENT_ID and SLACK_CLIENT_SECRET)")
    return None
