"""``[[event_sources]]`` (bot/config/event_sources.py): what the file may say, the one-line error when it is wrong,
and the core values the wiring takes."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.config.file import config_schema, load_config
from bot.errors import SettingsError
from core.webhooks.model import EventSource

GOOD = '[[event_sources]]\nname = "gh"\nkind = "github"\nsecret_env = "GH_SECRET"\ndestination = "#ops"\n'


def _load(tmp_path: Path, text: str) -> list[EventSource]:
    config = tmp_path / "bot.toml"
    config.write_text(text, encoding="utf-8")
    return load_config(config).event_source_list()


def test_defaults_and_the_default_agent(tmp_path: Path) -> None:
    assert _load(tmp_path, GOOD) == [EventSource(name="gh", kind="github", secret_env="GH_SECRET", destination="#ops",
                                                 agent="default")]
    sources = _load(tmp_path, '[[agents]]\nname = "ops"\n[[agents]]\nname = "ci"\n' + GOOD + 'events = ["push"]\n'
                    'thread = "{repository.full_name}"\nrate_per_minute = 5\ntrust = "member"\nprompt = "Look."\n'
                    + GOOD.replace('"gh"', '"gh2"') + 'agent = "ci"\n')
    assert [(s.agent, s.events, s.thread, s.rate_per_minute, s.trust, s.prompt) for s in sources] == [
        ("ops", ("push",), "{repository.full_name}", 5, "member", "Look."),
        ("ci", ("*",), None, 60, "external", None)]


@pytest.mark.parametrize(("extra", "said"), [
    ('agent = "nope"\n', "event_sources[0].agent is 'nope', which is not an agent of [[agents]] (known: default)"),
    ('trust = "admin"\n', "event_sources[0].trust must be one of member, guest, external, bot"),
    ('thread = "{a b}"\n', "event_sources[0].thread has the field {a b}"),
    ('thread = "pr-{number"\n', "event_sources[0].thread has a '{' or '}' that opens or closes no field"),
    ('rate_per_minute = 0\n', "event_sources[0].rate_per_minute must be a whole number from 1 to 10000"),
    ('rate_per_minute = "5"\n', "event_sources[0].rate_per_minute must be"),
    ('events = []\n', "event_sources[0].events must be a list of globs"),
    ('prompt = "' + "x" * 4001 + '"\n', "event_sources[0].prompt must be text put before each event"),
    ('colour = "red"\n', "event_sources[0].colour is not a known key"),
    ('[[event_sources]]\nname = "gh"\nkind = "bearer"\nsecret_env = "T"\ndestination = "C0123"\n',
     "event_sources[1].name 'gh' is already the name of event_sources[0]"),
])
def test_mistakes_are_one_line_naming_the_key(tmp_path: Path, extra: str, said: str) -> None:
    with pytest.raises(SettingsError) as info:
        _load(tmp_path, GOOD + extra)
    assert said in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(("key", "value", "said"), [
    ("name", '"GH"', "event_sources[0].name must match"),
    ("kind", '"gitlab"', "event_sources[0].kind must be one of github"),
    ("secret_env", '"not a name"', "event_sources[0].secret_env must be the name of the environment variable"),
    ("destination", '"ops"', "event_sources[0].destination must be a Slack channel '#name' or a channel id"),
])
def test_required_keys_are_checked(tmp_path: Path, key: str, value: str, said: str) -> None:
    text = "".join(line + "\n" for line in GOOD.splitlines() if not line.startswith(key))
    with pytest.raises(SettingsError) as info:
        _load(tmp_path, text + f"{key} = {value}\n")
    assert said in str(info.value)
    with pytest.raises(SettingsError):  # and left out
        _load(tmp_path, text)


def test_the_schema_has_the_table() -> None:
    schema = config_schema()
    assert "event_sources" in schema["properties"]
    table = schema["$defs"]["EventSourceTable"]
    assert set(table["required"]) == {"name", "kind", "secret_env", "destination"}
    assert table["properties"]["trust"]["enum"] == ["member", "guest", "external", "bot"]
