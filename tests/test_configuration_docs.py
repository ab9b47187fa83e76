"""docs/configuration.md is the configuration reference: it names every environment variable the settings models
read (the server's and each installed channel's) and every key the bot.toml models accept, so a setting added
without its line in the reference fails here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic_settings import BaseSettings

from bot.channels import installed_channels
from bot.config.file import config_schema
from bot.settings import Settings

REFERENCE = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


def _variables(model: type[BaseSettings]) -> set[str]:
    prefix = str(model.model_config.get("env_prefix", "")).upper()
    names = set()
    for name, info in model.model_fields.items():
        alias = info.validation_alias
        names.add(alias.upper() if isinstance(alias, str) else prefix + name.upper())
    return names


def _keys(schema: dict[str, Any]) -> set[str]:
    """Every key path of the schema: ``policies[].quorum``, ``slack.suggested_prompts[].title``."""
    defs = schema.get("$defs", {})

    def resolve(node: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in node:
            node = defs[node["$ref"].rsplit("/", 1)[1]]
        for choice in node.get("anyOf", []):  # an optional table: its model, not the "absent" branch
            if "$ref" in choice or "properties" in choice or "items" in choice:
                return resolve(choice)
        return node

    found: set[str] = set()

    def walk(node: dict[str, Any], prefix: str) -> None:
        for key, value in resolve(node).get("properties", {}).items():
            value = resolve(value)
            found.add(prefix + key)
            if value.get("type") == "array" and "items" in value:
                walk(value["items"], f"{prefix}{key}[].")
            elif "properties" in value:
                walk(value, f"{prefix}{key}.")

    walk(schema, "")
    return found


def test_every_environment_variable_is_in_the_reference() -> None:
    text = REFERENCE.read_text(encoding="utf-8")
    named = set(re.findall(r"`([A-Z][A-Z0-9_]+)`", text))
    variables = _variables(Settings)
    for plugin in installed_channels():
        variables |= _variables(plugin.settings)
    assert "SLACK_BOT_TOKEN" in variables and "BOT_WEB_TOKEN" in variables and "PORT" in variables
    assert sorted(variables - named) == []


def test_every_bot_toml_key_is_in_the_reference() -> None:
    text = REFERENCE.read_text(encoding="utf-8")
    named = set(re.findall(r"^\| `([a-z_.\[\]]+)` \|", text, flags=re.M))
    keys = _keys(config_schema())
    assert {"agents[].name", "policies[].quorum", "mcp_servers[].sandbox", "slack.suggested_prompts[].title"} <= keys
    assert sorted(keys - named) == []
