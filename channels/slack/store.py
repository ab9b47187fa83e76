"""Multi-workspace Slack installs: one row per workspace (its bot token sealed by the caller, never plaintext
here) and the single-use states of install links; and that table as one of the vault's sealed kinds."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from sqlalchemy import delete, update
from sqlalchemy.exc import IntegrityError
from sqlmodel import col, select

from channels.slack.tables import SlackInstallationRow, SlackOAuthStateRow
from core.sealed_values import SealedKind
from core.store.approvals import audit_row
from core.store.database import Database
from core.vault import Sealed

_COPIED = ("is_enterprise_install", "app_id", "team_name", "bot_id", "bot_user_id", "bot_scopes", "installer",
           "bot_token_expires_at")


class SlackInstallStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    # -- installations ----------------------------------------------------------------------------

    async def save(self, row: SlackInstallationRow, *, seal: Callable[[SlackInstallationRow], None],
                   now: datetime) -> SlackInstallationRow:
        """Store a workspace's install, replacing an earlier one of the same workspace (a re-install: new
        scopes, a new token). ``seal`` sets ``key_id`` and ``ciphertext`` once the row has its id (the id is part
        of what the token is bound to)."""
        try:
            return await self._save(row, seal=seal, now=now)
        except IntegrityError:  # installed through another replica at the same moment: replace that one
            return await self._save(row, seal=seal, now=now)

    async def _save(self, row: SlackInstallationRow, *, seal: Callable[[SlackInstallationRow], None],
                    now: datetime) -> SlackInstallationRow:
        async with self.db.write() as s:
            existing = (await s.exec(select(SlackInstallationRow).where(
                SlackInstallationRow.enterprise_id == row.enterprise_id,
                SlackInstallationRow.team_id == row.team_id))).first()
            if existing is not None:
                for key in _COPIED:
                    setattr(existing, key, getattr(row, key))
                row = existing
            else:
                row.installed_at = now
                row.key_id, row.ciphertext = "", ""  # sealed below, in the same transaction
            row.updated_at = now
            s.add(row)
            await s.flush()
            seal(row)
            s.add(row)
            s.add(audit_row(now, row.installer or "slack", "slack.install", _subject(row),
                            {"team_name": row.team_name, "scopes": row.bot_scopes}))
            await s.flush()
            await s.refresh(row)
            return row

    async def reseal(self, row_id: int, *, expected_ciphertext: str, key_id: str, ciphertext: str) -> bool:
        """The same tokens under another key (``bot credentials rotate``), only if they are still the ones read: a
        re-install or a token refresh meanwhile stands."""
        async with self.db.write() as s:
            result = await s.exec(update(SlackInstallationRow).where(
                col(SlackInstallationRow.id) == row_id, col(SlackInstallationRow.ciphertext) == expected_ciphertext)
                .values(key_id=key_id, ciphertext=ciphertext))
            return bool(result.rowcount)

    async def find(self, enterprise_id: str, team_id: str) -> SlackInstallationRow | None:
        """The install serving this workspace: its own, else its org's org-wide install."""
        async with self.db.read() as s:
            own = (await s.exec(select(SlackInstallationRow).where(
                SlackInstallationRow.enterprise_id == enterprise_id,
                SlackInstallationRow.team_id == team_id))).first()
            if own is not None or not enterprise_id:
                return own
            return (await s.exec(select(SlackInstallationRow).where(
                SlackInstallationRow.enterprise_id == enterprise_id, SlackInstallationRow.team_id == "",
                col(SlackInstallationRow.is_enterprise_install).is_(True)))).first()

    async def find_team(self, team_id: str) -> SlackInstallationRow | None:
        """The install of workspace ``team_id`` (team ids are unique across Slack, in an org or not)."""
        async with self.db.read() as s:
            return (await s.exec(select(SlackInstallationRow).where(
                SlackInstallationRow.team_id == team_id))).first()

    async def listed(self) -> list[SlackInstallationRow]:
        async with self.db.read() as s:
            return list((await s.exec(select(SlackInstallationRow).order_by(
                col(SlackInstallationRow.enterprise_id), col(SlackInstallationRow.team_id)))).all())

    async def remove(self, enterprise_id: str, team_id: str, *, by: str, why: str,
                     now: datetime) -> SlackInstallationRow | None:
        """Forget a workspace's install (its history stays): the row as it was, None if there was none."""
        async with self.db.write() as s:
            row = (await s.exec(select(SlackInstallationRow).where(
                SlackInstallationRow.enterprise_id == enterprise_id,
                SlackInstallationRow.team_id == team_id))).first()
            if row is None:
                return None
            await s.exec(delete(SlackInstallationRow).where(col(SlackInstallationRow.id) == row.id))
            s.add(audit_row(now, by, "slack.uninstall", _subject(row), {"why": why}))
            return row

    # -- install states ---------------------------------------------------------------------------

    async def add_state(self, state_hash: str, *, now: datetime, expires_at: datetime) -> None:
        async with self.db.write() as s:
            s.add(SlackOAuthStateRow(state_hash=state_hash, created_at=now, expires_at=expires_at))
            # Expired states go as new ones come: the table stays as small as the installs in flight.
            await s.exec(delete(SlackOAuthStateRow).where(col(SlackOAuthStateRow.expires_at) <= now))

    async def consume_state(self, state_hash: str, *, now: datetime) -> bool:
        """Use a state once: True only for the one caller that deletes it before it expired."""
        async with self.db.write() as s:
            result = await s.exec(delete(SlackOAuthStateRow).where(
                col(SlackOAuthStateRow.state_hash) == state_hash, col(SlackOAuthStateRow.expires_at) > now))
            return bool(result.rowcount)


def _subject(row: SlackInstallationRow) -> str:
    return f"slack:{row.team_id or row.enterprise_id}"


def install_context(row: SlackInstallationRow) -> str:
    """The associated data a Slack workspace's tokens are sealed with: the blob opens only in its own row."""
    return f"slack-install|v1|{row.enterprise_id}|{row.team_id}|{row.id}"


def install_label(row: SlackInstallationRow) -> str:
    return f"the Slack install of {row.team_id or row.enterprise_id}"


def sealed_installs(db: Database) -> list[SealedKind[SlackInstallationRow]]:
    """Workspaces' tokens, for ``bot credentials rotate`` and the doctor (``core.sealed_values``)."""
    installs = SlackInstallStore(db)

    async def replace(row: SlackInstallationRow, sealed: Sealed, now: datetime) -> bool:
        assert row.id is not None
        return await installs.reseal(row.id, expected_ciphertext=row.ciphertext, key_id=sealed.key_id,
                                     ciphertext=sealed.blob)

    return [SealedKind("slack installs", installs.listed, install_label, install_context, install_context, replace)]
