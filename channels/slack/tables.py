"""Tables of multi-workspace (OAuth) Slack installs: one row per workspace with its sealed bot token, and the
single-use ``state`` of each install. Every change here needs a migration too."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Column, Text, UniqueConstraint
from sqlmodel import Field, SQLModel

from core.store.columns import timestamp


class SlackInstallationRow(SQLModel, table=True):
    """The app installed into one workspace (or org-wide into an Enterprise Grid org). The tokens are sealed
    (``ciphertext``: JSON of the bot token and its refresh token); everything else is plain, so listing and
    doctor need no key."""

    __tablename__ = "slack_installations"
    __table_args__ = (UniqueConstraint("enterprise_id", "team_id", name="uq_slack_installations_workspace"),)

    id: int | None = Field(default=None, primary_key=True)
    # "" for none: NULLs never collide in a UNIQUE constraint, so one workspace could be stored twice.
    enterprise_id: str = Field(default="", max_length=32)
    team_id: str = Field(default="", max_length=32)  # "" for an org-wide install
    is_enterprise_install: bool = Field(default=False)
    app_id: str | None = Field(default=None, max_length=32)
    team_name: str | None = Field(default=None, max_length=255)
    bot_id: str | None = Field(default=None, max_length=32)
    bot_user_id: str | None = Field(default=None, max_length=32)
    bot_scopes: str = Field(default="", sa_column=Column(Text, nullable=False))  # comma list, as Slack gave it
    installer: str | None = Field(default=None, max_length=32)  # the user who installed it
    key_id: str = Field(max_length=64)
    ciphertext: str = Field(sa_column=Column(Text, nullable=False))
    bot_token_expires_at: datetime | None = timestamp(nullable=True)  # token rotation; None: the token does not expire
    installed_at: datetime = timestamp()
    updated_at: datetime = timestamp()


class SlackOAuthStateRow(SQLModel, table=True):
    """One install link's ``state``, stored as its SHA-256: the table never holds a usable state."""

    __tablename__ = "slack_oauth_states"

    state_hash: str = Field(primary_key=True, max_length=64)
    created_at: datetime = timestamp()
    expires_at: datetime = timestamp()
