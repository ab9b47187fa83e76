"""Encryption keys: BOT_SECRET_KEYS, or on the embedded default a key generated into BOT_HOME."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from bot.errors import SettingsError
from bot.settings import Settings
from core.errors import VaultError
from core.vault import KeyRing

log = logging.getLogger(__name__)
KEY_FILE = "secret.key"


def load_keyring(settings: Settings) -> KeyRing:
    if settings.bot_secret_keys:
        return KeyRing.parse(settings.bot_secret_keys)
    path = settings.bot_home / KEY_FILE
    if not path.exists():
        _generate(path)
        log.warning("generated an encryption key in %s for stored credentials; in production set "
                    "BOT_SECRET_KEYS (and keep a copy: without the key, stored credentials cannot be opened)", path)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise SettingsError(f"{path} is readable by other users (mode {mode:o}); run: chmod 600 {path}")
    try:
        return KeyRing.parse(path.read_text(encoding="utf-8").strip())
    except VaultError as exc:
        raise SettingsError(f"{path}: {exc}") from None


def _generate(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(KeyRing.generate_spec("local") + "\n")
