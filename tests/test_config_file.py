"""``bot.toml`` as models (bot/config/): one-line errors that name the key's path, the JSON Schema that editors use
(`bot config schema`), and the channel sections the file is composed from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, get_args

import pytest
from pydantic import BaseModel, ConfigDict

from bot.cli import main
from bot.config.file import channel_sections, config_model, config_schema, load_config
from bot.errors import SettingsError

SPEC_TABLES = {"agents", "policies", "connections", "mcp_servers", "slack"}  # SPEC §16


def _refused(tmp_path: Path, text: str) -> str:
    config = tmp_path / "bot.toml"
    config.write_text(text, encoding="utf-8")
    with pytest.raises(SettingsError) as info:
        load_config(config)
    message = str(info.value)
    assert "\n" not in message, message  # one line
    assert message.startswith(f"{config}: "), message
    return message.removeprefix(f"{config}: ")


@pytest.mark.parametrize(("text", "said"), [
    # a typo names its path and says it is unknown, with the key it most likely meant
    ('[[policies]]\ntool = "shell_run"\nquorom = 2\n', "policies[0].quorom is not a known key; did you mean 'quorum'?"),
    ('[[policies]]\ntool = "a"\n[[policies]]\ntool = "b"\n[[policies]]\ntool = "c"\nquorum = 99\n',
     "policies[2].quorum must be a whole number from 1 to 20"),
    ('[[policies]]\ntool = "shell_run"\napprovers = ["U1", "bob"]\n',
     "policies[0].approvers[1] is not a user id, group id, 'requester' or 'web'"),
    ('[[policies]]\ntool = "shell_run"\nescalate_to = ["U3"]\n', "policies[0].escalate_to needs remind_after_s"),
    ('[[agents]]\nname = "ops"\n[[agents]]\nname = "Ops"\n', "agents[1].name must match"),
    ('[[agents]]\nname = "ops"\n[[agents]]\nname = "ops"\n', "agents[1].name 'ops' is already the name of agents[0]"),
    ('[[agents]]\nname = "ops"\ntool = ["x"]\n', "agents[0].tool is not a known key; did you mean 'tools'?"),
    ('[[connections]]\nname = "gh"\nclient_id = "c"\ntoken_url = "http://oauth.example/token"\n',
     "connections[0].token_url must be an https:// URL"),
    ('[[connections]]\nname = "gh"\nclient_id = "c"\ntoken_url = "https://x.example/t"\nhosts = ["*.github.io"]\n',
     "connections[0].hosts: Allowed hosts: entry 1 covers names anyone can register"),
    ('[[mcp_servers]]\nname = "gh"\ncommand = ["x"]\ntimeout_s = 0\n', "mcp_servers[0].timeout_s must be a number"),
    ('[[mcp_servers]]\nname = "gh"\ncommand = ["x"]\nurl = "https://x.example/mcp"\n',
     "mcp_servers[0]: give either command"),
    ('[[mcp_servers]]\nname = "a"\ncommand = ["x"]\n[[mcp_servers]]\nname = "a"\nurl = "https://x.example/mcp"\n',
     "mcp_servers[1].name 'a' is already the name of mcp_servers[0]"),
    ('[slack]\nsuggested_prompts = [{ title = "", message = "m" }]\n',
     "[slack].suggested_prompts[0].title must be text of 1 to 75 characters"),
    ('[slack]\nsugested_prompts = []\n',
     "[slack].sugested_prompts is not a known key; did you mean 'suggested_prompts'?"),
    ("slack = 3\n", "[slack] must be a table"),
    ("policies = 3\n", "[[policies]] must be an array of tables"),
    ('[[agent]]\nname = "ops"\n', "unknown tables ['agent']"),
])
def test_a_mistake_is_one_line_that_names_its_path(tmp_path: Path, text: str, said: str) -> None:
    assert _refused(tmp_path, text).startswith(said)


def test_unknown_keys_are_refused_in_every_table(tmp_path: Path) -> None:
    entries = {"agents": 'name = "ops"', "policies": 'tool = "shell_run"', "mcp_servers": 'name = "a"\ncommand = ["x"]',
               "connections": 'name = "gh"\nclient_id = "c"\ntoken_url = "https://x.example/t"'}
    for table, entry in entries.items():
        said = _refused(tmp_path, f"[[{table}]]\n{entry}\ncolour = 1\n")
        assert said.startswith(f"{table}[0].colour is not a known key"), said
        assert "unknown keys are refused" in said
    assert _refused(tmp_path, "[slack]\ncolour = 1\n").startswith("[slack].colour is not a known key")


def test_no_file_is_every_table_empty(tmp_path: Path) -> None:
    config = load_config(tmp_path / "absent.toml")
    assert (config.agents, config.policies, config.connections, config.mcp_servers) == (None, [], [], [])
    assert config.section("slack") is None


class _PagerSection(BaseModel):
    """A test channel's section."""

    model_config = ConfigDict(extra="forbid", strict=True)
    escalation: str = "default"


def test_a_channel_contributes_its_own_section(tmp_path: Path) -> None:
    config = tmp_path / "bot.toml"
    config.write_text('[pager]\nescalation = "night"\n[slack]\nsuggested_prompts = []\n', encoding="utf-8")
    sections = {**channel_sections(), "pager": _PagerSection}
    section = load_config(config, sections).section("pager")
    assert isinstance(section, _PagerSection) and section.escalation == "night"
    with pytest.raises(SettingsError, match=r"unknown tables \['pager'\]"):
        load_config(config)  # without that channel, its table is a typo
    config.write_text("[pager]\nescalate = 1\n", encoding="utf-8")
    with pytest.raises(SettingsError, match=r"\[pager\]\.escalate is not a known key; did you mean 'escalation'\?"):
        load_config(config, sections)
    assert "pager" in config_schema(sections)["properties"]


# -- the JSON Schema -------------------------------------------------------------------------------------------


def test_bot_config_schema_prints_the_schema_of_every_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["$schema"].startswith("https://json-schema.org/") and schema["type"] == "object"
    assert set(schema["properties"]) >= SPEC_TABLES and schema["additionalProperties"] is False
    for table in SPEC_TABLES - {"slack"}:
        assert schema["properties"][table]["type"] == "array", table
    assert "required" not in schema  # every table is optional


def _models(model: type[BaseModel], seen: dict[str, type[BaseModel]]) -> dict[str, type[BaseModel]]:
    """Every model reachable from ``model`` through its fields, by name."""
    seen[model.__name__] = model
    for info in model.model_fields.values():
        stack: list[Any] = [info.annotation]
        while stack:
            kind = stack.pop()
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                if kind.__name__ not in seen:
                    _models(kind, seen)
            else:
                stack.extend(get_args(kind))
    return seen


def test_the_schema_covers_every_key_the_models_accept_and_no_other() -> None:
    schema = config_schema()
    models = _models(config_model(), {})
    assert {"AgentTable", "PolicyTable", "ConnectionTable", "McpServerTable", "SlackSection",
            "SuggestedPrompt"} <= set(models)
    for name, model in models.items():
        part = schema if model is config_model() else schema["$defs"][name]
        assert set(part["properties"]) == set(model.model_fields), name
        assert part["additionalProperties"] is False, name  # as the model: unknown keys are refused
        for key, prop in part["properties"].items():
            assert prop.get("description"), f"{name}.{key} has no description (it is also its error text)"
            assert "null" not in json.dumps(prop), f"{name}.{key}: TOML has no null"


def test_the_schema_keeps_the_rules_an_editor_can_check() -> None:
    policy = config_schema()["$defs"]["PolicyTable"]["properties"]
    assert policy["quorum"]["minimum"] == 1 and policy["quorum"]["maximum"] == 20
    assert policy["action"]["enum"] == ["ask", "allow", "deny"]
    assert policy["approvers"]["items"]["pattern"].startswith("^(requester|web|")
    assert config_schema()["$defs"]["PolicyTable"]["required"] == ["tool"]


# -- bot config check ------------------------------------------------------------------------------------------


def test_bot_config_check_says_what_the_file_holds_or_its_mistake(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "bot.toml"
    config.write_text('[[agents]]\nname = "ops"\n[[policies]]\ntool = "shell_run"\naction = "deny"\n',
                      encoding="utf-8")
    assert main(["config", "check", "--config", str(config)]) == 0
    assert "1 agent(s), 1 approval rule(s)" in capsys.readouterr().out
    config.write_text('[[policies]]\ntool = "shell_run"\nquorom = 2\n', encoding="utf-8")
    assert main(["config", "check", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bot: error: ") and "policies[0].quorom is not a known key" in err
    assert len(err.strip().splitlines()) == 1
