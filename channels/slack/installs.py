"""slack_sdk's installation and OAuth-state stores on the bot's own database (multi-workspace mode).

Bot tokens are sealed with the vault (``BOT_SECRET_KEYS``), bound to their row, and opened only when a request
needs one; slack_sdk's SQLAlchemy store would keep them in clear. User tokens are never stored (the bot asks for
no user scopes).
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from slack_sdk.oauth.installation_store import Bot, Installation
from slack_sdk.oauth.installation_store.async_installation_store import AsyncInstallationStore
from slack_sdk.oauth.state_store.async_state_store import AsyncOAuthStateStore

from channels.slack.settings import SlackSettings
from channels.slack.store import SlackInstallStore, install_context, install_label
from channels.slack.tables import SlackInstallationRow
from core.clock import Clock, SystemClock
from core.vault import KeyRing, Sealed

if TYPE_CHECKING:
    from channels.slack.install import SlackInstall
    from core.store import Database

log = logging.getLogger(__name__)

STATE_TTL_S = 600  # an install link works for ten minutes (bolt's default)


class VaultInstallationStore(AsyncInstallationStore):
    """Workspaces the app is installed in. ``learn`` is told each token it opens or seals (the redactor: a token
    is masked in anything that leaves the bot)."""

    def __init__(self, store: SlackInstallStore, keys: KeyRing, *, clock: Clock | None = None,
                 learn: Callable[[str, str], None] | None = None) -> None:
        self.store = store
        self.keys = keys
        self.clock = clock or SystemClock()
        self._learn = learn
        # Told the team when an install is replaced or removed (cached clients are dropped).
        self.changed: list[Callable[[str], None]] = []

    @property
    def logger(self) -> logging.Logger:
        return log

    async def async_save(self, installation: Installation) -> None:
        if installation.is_enterprise_install:
            # Events name the workspace, and each workspace's answers take its own token: an org-wide install
            # would serve many workspaces through one row. Install into each workspace instead.
            raise ValueError("org-wide (Enterprise Grid) installs are not supported: install into each workspace")
        if not installation.bot_token:
            raise ValueError("the install gave no bot token (the app asks for bot scopes)")
        await self._save(installation.to_bot(), installer=installation.user_id)

    async def async_save_bot(self, bot: Bot) -> None:
        await self._save(bot, installer=None)

    async def _save(self, bot: Bot, *, installer: str | None) -> None:
        tokens = json.dumps({"bot_token": bot.bot_token, "bot_refresh_token": bot.bot_refresh_token})
        expires = (datetime.fromtimestamp(bot.bot_token_expires_at, UTC)
                   if bot.bot_token_expires_at is not None else None)
        row = SlackInstallationRow(
            enterprise_id=bot.enterprise_id or "", team_id="" if bot.is_enterprise_install else (bot.team_id or ""),
            is_enterprise_install=bool(bot.is_enterprise_install), app_id=bot.app_id, team_name=bot.team_name,
            bot_id=bot.bot_id, bot_user_id=bot.bot_user_id, bot_scopes=",".join(bot.bot_scopes or []),
            installer=installer, key_id="", ciphertext="", bot_token_expires_at=expires,
            installed_at=self.clock.now(), updated_at=self.clock.now())

        def seal(stored: SlackInstallationRow) -> None:
            sealed = self.keys.seal(tokens, install_context(stored))
            stored.key_id, stored.ciphertext = sealed.key_id, sealed.blob

        saved = await self.store.save(row, seal=seal, now=self.clock.now())
        self._learned(saved, bot.bot_token)
        log.info("installed into Slack workspace %s (%s)", saved.team_id or saved.enterprise_id, saved.team_name)
        self._tell(saved.team_id or saved.enterprise_id)

    async def async_find_bot(self, *, enterprise_id: str | None, team_id: str | None,
                             is_enterprise_install: bool | None = False) -> Bot | None:
        row = await self._find(enterprise_id, team_id, is_enterprise_install)
        return self.bot_of(row) if row is not None else None

    async def async_find_installation(self, *, enterprise_id: str | None, team_id: str | None,
                                      user_id: str | None = None,
                                      is_enterprise_install: bool | None = False) -> Installation | None:
        row = await self._find(enterprise_id, team_id, is_enterprise_install)
        if row is None:
            return None
        bot = self.bot_of(row)
        return Installation(
            app_id=bot.app_id, enterprise_id=bot.enterprise_id, team_id=bot.team_id, team_name=bot.team_name,
            bot_token=bot.bot_token, bot_id=bot.bot_id, bot_user_id=bot.bot_user_id, bot_scopes=bot.bot_scopes,
            bot_refresh_token=bot.bot_refresh_token, bot_token_expires_at=bot.bot_token_expires_at,
            user_id=row.installer or "", is_enterprise_install=bot.is_enterprise_install,
            installed_at=row.installed_at.timestamp())

    async def async_delete_bot(self, *, enterprise_id: str | None, team_id: str | None) -> None:
        await self.remove(enterprise_id, team_id, by="slack", why="deleted")

    async def async_delete_installation(self, *, enterprise_id: str | None, team_id: str | None,
                                        user_id: str | None = None) -> None:
        if user_id is None:  # a user's tokens are never stored: only the whole install can go
            await self.remove(enterprise_id, team_id, by="slack", why="deleted")

    async def workspace_bot(self, team: str) -> Bot | None:
        row = await self.store.find_team(team) if team else None
        return self.bot_of(row) if row is not None else None

    async def uninstalled(self, enterprise_id: str | None, team_id: str | None, *, why: str) -> bool:
        # By the team alone (team ids are unique across Slack): an enterprise id that disagrees must not keep a
        # dead install around.
        row = await self.store.find_team(team_id) if team_id else None
        if row is None:
            return False
        return await self.remove(row.enterprise_id, row.team_id, by="slack", why=why) is not None

    async def remove(self, enterprise_id: str | None, team_id: str | None, *, by: str,
                     why: str) -> SlackInstallationRow | None:
        """Forget one workspace's install (its token with it); its history stays."""
        row = await self.store.remove(enterprise_id or "", team_id or "", by=by, why=why, now=self.clock.now())
        if row is not None:
            log.info("removed the install of Slack workspace %s (%s)", row.team_id or row.enterprise_id, why)
            self._tell(row.team_id or row.enterprise_id)
        return row

    async def installations(self) -> list[SlackInstallationRow]:
        return await self.store.listed()

    def bot_of(self, row: SlackInstallationRow) -> Bot:
        """The row with its tokens opened (VaultError if its key is not configured)."""
        tokens: dict[str, Any] = json.loads(self.keys.open(Sealed(row.key_id, row.ciphertext), install_context(row),
                                                           label=install_label(row)))
        self._learned(row, str(tokens["bot_token"]))
        return Bot(app_id=row.app_id, enterprise_id=row.enterprise_id or None, team_id=row.team_id or None,
                   team_name=row.team_name, bot_token=str(tokens["bot_token"]), bot_id=row.bot_id or "",
                   bot_user_id=row.bot_user_id or "", bot_scopes=row.bot_scopes,
                   bot_refresh_token=tokens.get("bot_refresh_token"),
                   bot_token_expires_at=(int(row.bot_token_expires_at.timestamp())
                                         if row.bot_token_expires_at is not None else None),
                   is_enterprise_install=row.is_enterprise_install, installed_at=row.installed_at.timestamp())

    async def _find(self, enterprise_id: str | None, team_id: str | None,
                    is_enterprise_install: bool | None) -> SlackInstallationRow | None:
        team = "" if is_enterprise_install else (team_id or "")
        return await self.store.find(enterprise_id or "", team)

    def _learned(self, row: SlackInstallationRow, token: str | None) -> None:
        if self._learn is not None and token:
            self._learn(f"slack bot token ({row.team_id or row.enterprise_id})", token)

    def _tell(self, team: str) -> None:
        for listener in self.changed:
            listener(team)


class DatabaseStateStore(AsyncOAuthStateStore):
    """Install links' ``state``: random, stored only as its SHA-256, usable once and for ``ttl_s``."""

    def __init__(self, store: SlackInstallStore, *, clock: Clock | None = None, ttl_s: int = STATE_TTL_S) -> None:
        self.store = store
        self.clock = clock or SystemClock()
        self.ttl_s = ttl_s

    @property
    def logger(self) -> logging.Logger:
        return log

    async def async_issue(self, *args: Any, **kwargs: Any) -> str:
        state = secrets.token_urlsafe(32)
        now = self.clock.now()
        await self.store.add_state(_hash(state), now=now, expires_at=now + timedelta(seconds=self.ttl_s))
        return state

    async def async_consume(self, state: str) -> bool:
        if not state:
            return False
        return await self.store.consume_state(_hash(state), now=self.clock.now())


def _hash(state: str) -> str:
    return hashlib.sha256(state.encode()).hexdigest()


def slack_install(settings: SlackSettings, db: Database, keys: KeyRing, learn: Callable[[str, str], None],
                  clock: Clock, public_url: str | None) -> SlackInstall:
    """Multi-workspace mode: the install routes on the bot's own stores (tokens sealed with the vault)."""
    from channels.slack.install import InstallConfig, SlackInstall

    assert settings.client_id is not None and settings.client_secret is not None
    store = SlackInstallStore(db)
    installations = VaultInstallationStore(store, keys, clock=clock, learn=learn)
    config = InstallConfig(client_id=settings.client_id, client_secret=settings.client_secret,
                           scopes=settings.scope_list, api_url=settings.api_url,
                           public_url=public_url, allowed_teams=settings.allowed_team_set)
    return SlackInstall(config, installations, DatabaseStateStore(store, clock=clock))
