"""Agents from an optional ``bot.toml``; without one, a single default agent from the settings."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from bot.config_file import read_config, strings
from bot.errors import SettingsError
from bot.people import is_person
from core.agents import DEFAULT_INSTRUCTIONS, Agent

# One plain path component too: an agent's work folder is $BOT_HOME/work/<name> (bot.tools.shell).
AGENT_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")


def load_agents(path: Path, *, default_instructions: str | None) -> list[Agent]:
    """Read ``[[agents]]`` tables (name, instructions, tools, approvers); the first is the default. Without
    any, one default agent (the file may hold only other tables)."""
    data = read_config(path)
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
    if not isinstance(name, str) or not AGENT_NAME.fullmatch(name):
        raise SettingsError(f"{where}.name must match {AGENT_NAME.pattern}")
    tools = strings(where, "tools", entry.get("tools", ["*"]))
    approvers = strings(where, "approvers", entry.get("approvers", []))
    for person in approvers:
        if not is_person(person):
            raise SettingsError(f"{where}.approvers: {person!r} is not a user id, group id, 'requester', 'web' "
                                "or <channel>:<id>")
    instructions = entry.get("instructions", default_instructions or DEFAULT_INSTRUCTIONS)
    if not isinstance(instructions, str) or not instructions.strip():
        raise SettingsError(f"{where}.instructions must be a non-empty string")
    return Agent(name=name, instructions=instructions, tools=tuple(tools), approvers=tuple(approvers))
