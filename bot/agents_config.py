"""Agents from an optional ``bot.toml``; without one, a single default agent from the settings."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from bot.errors import SettingsError
from core.agents import DEFAULT_INSTRUCTIONS, Agent

KNOWN_TABLES = frozenset({"agents", "slack"})
_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")
_PERSON = re.compile(r"^(requester|web|[UWS][A-Z0-9]+)$")


def load_agents(path: Path, *, default_instructions: str | None) -> list[Agent]:
    """Read ``[[agents]]`` tables (name, instructions, tools, approvers); the first is the default. Without
    any, one default agent (the file may hold only other tables)."""
    if not path.exists():
        return [Agent(instructions=default_instructions or DEFAULT_INSTRUCTIONS)]
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"{path}: {exc}") from None
    unknown = set(data) - KNOWN_TABLES
    if unknown:  # a misspelt table (``[[agent]]``) must not quietly drop an agent's limits
        raise SettingsError(f"{path}: unknown tables {sorted(unknown)} (known: {sorted(KNOWN_TABLES)})")
    if "agents" not in data:  # a file with other tables only ([slack]…): the one default agent
        return [Agent(instructions=default_instructions or DEFAULT_INSTRUCTIONS)]
    entries = data["agents"]
    if not isinstance(entries, list) or not entries:
        raise SettingsError(f"{path}: [[agents]] must hold at least one agent table")
    agents: list[Agent] = []
    for index, entry in enumerate(entries):
        agents.append(_agent(path, index, entry, default_instructions))
    names = [a.name for a in agents]
    if len(set(names)) != len(names):
        raise SettingsError(f"{path}: agent names must be unique (got {names})")
    return agents


def _agent(path: Path, index: int, entry: Any, default_instructions: str | None) -> Agent:
    where = f"{path}: agents[{index}]"
    if not isinstance(entry, dict):
        raise SettingsError(f"{where} must be a table")
    unknown = set(entry) - {"name", "instructions", "tools", "approvers"}
    if unknown:
        raise SettingsError(f"{where}: unknown keys {sorted(unknown)}")
    name = entry.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise SettingsError(f"{where}.name must match {_NAME.pattern}")
    tools = _strings(where, "tools", entry.get("tools", ["*"]))
    approvers = _strings(where, "approvers", entry.get("approvers", []))
    for person in approvers:
        if not _PERSON.match(person):
            raise SettingsError(f"{where}.approvers: {person!r} is not a user id, group id, 'requester' or 'web'")
    instructions = entry.get("instructions", default_instructions or DEFAULT_INSTRUCTIONS)
    if not isinstance(instructions, str) or not instructions.strip():
        raise SettingsError(f"{where}.instructions must be a non-empty string")
    return Agent(name=name, instructions=instructions, tools=tuple(tools), approvers=tuple(approvers))


def _strings(where: str, key: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise SettingsError(f"{where}.{key} must be a list of non-empty strings")
    return list(value)
