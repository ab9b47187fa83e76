"""The ``[slack]`` table of ``bot.toml``: what the assistant pane offers when a person opens a new chat."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bot.config_file import read_config
from bot.errors import SettingsError

MAX_PROMPTS = 4  # Slack shows at most four suggested prompts
_TITLE_MAX, _MESSAGE_MAX = 75, 2_000

DEFAULT_PROMPTS: tuple[tuple[str, str], ...] = (
    ("What can you do?", "What can you do for me here, and what needs someone's approval?"),
    ("Check a service", "Check whether our services look healthy and tell me what you find."),
    ("Explain an error", "I'll paste an error message next: tell me what it means and how to fix it."),
)


def load_suggested_prompts(path: Path) -> tuple[tuple[str, str], ...]:
    """``[slack] suggested_prompts = [{ title = "…", message = "…" }, …]``: (title, message) pairs, at most
    four; the defaults when the file or the key is absent; an empty list offers none."""
    table = read_config(path).get("slack", {})
    if not isinstance(table, dict):
        raise SettingsError(f"{path}: [slack] must be a table")
    unknown = set(table) - {"suggested_prompts"}
    if unknown:
        raise SettingsError(f"{path}: [slack]: unknown keys {sorted(unknown)}")
    if "suggested_prompts" not in table:
        return DEFAULT_PROMPTS
    return _prompts(path, table["suggested_prompts"])


def _prompts(path: Path, value: Any) -> tuple[tuple[str, str], ...]:
    where = f"{path}: [slack].suggested_prompts"
    if not isinstance(value, list) or len(value) > MAX_PROMPTS:
        raise SettingsError(f"{where} must be a list of at most {MAX_PROMPTS} tables with title and message")
    prompts = []
    for index, item in enumerate(value):
        if not isinstance(item, dict) or set(item) != {"title", "message"}:
            raise SettingsError(f"{where}[{index}] must be a table with exactly title and message")
        title, message = item["title"], item["message"]
        if not (isinstance(title, str) and 0 < len(title.strip()) <= _TITLE_MAX):
            raise SettingsError(f"{where}[{index}].title must be text of 1 to {_TITLE_MAX} characters")
        if not (isinstance(message, str) and 0 < len(message.strip()) <= _MESSAGE_MAX):
            raise SettingsError(f"{where}[{index}].message must be text of 1 to {_MESSAGE_MAX} characters")
        prompts.append((title.strip(), message.strip()))
    return tuple(prompts)
