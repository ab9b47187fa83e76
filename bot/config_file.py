"""``bot.toml`` (``BOT_CONFIG``): read once per use, every table optional (SPEC §16)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from bot.errors import SettingsError

KNOWN_TABLES = frozenset({"agents", "connections", "mcp_servers", "policies", "slack"})


def read_config(path: Path) -> dict[str, Any]:
    """The file's tables; empty when there is no file. A misspelt table (``[[agent]]``) is refused: it must
    not quietly drop an agent's limits or a policy."""
    if not path.exists():
        return {}
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"{path}: {exc}") from None
    unknown = set(data) - KNOWN_TABLES
    if unknown:
        raise SettingsError(f"{path}: unknown tables {sorted(unknown)} (known: {sorted(KNOWN_TABLES)})")
    return data


def strings(where: str, key: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise SettingsError(f"{where}.{key} must be a list of non-empty strings")
    return list(value)
