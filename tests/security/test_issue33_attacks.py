"""Attacks on issue 33's restructuring: channel plug-ins, people named with their channel, one request lifecycle,
bot.toml as pydantic models.

What an outsider could do after the change that they could not before, or what the change could have dropped:
an id that crosses channels, a bare id two channels claim, a secret echoed by a settings error or a bot.toml error.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bot import people as bot_people
from bot.channels import installed_channels
from bot.config.file import load_config
from bot.errors import SettingsError
from bot.people import is_person, people
from bot.settings import load_settings
from core.plugins import ChannelPlugin

SECRET = "sEcReT-VaLuE-0123456789"


pytestmark = pytest.mark.usefixtures("clean_env")  # tests/conftest.py


# -- an id that crosses channels --------------------------------------------------------------------------------


async def _slack_request(tmp_path: Path, approvers: tuple[str, ...], admins: tuple[str, ...],
                         channel: str = "slack") -> tuple[Any, Any, int]:
    from datetime import UTC, datetime

    from core.agents import Agent, AgentDirectory
    from core.approval_policy import ApprovalPolicy
    from core.approvals import ApprovalBroker
    from core.clock import SystemClock
    from core.events import EventBus
    from core.store import ApprovalStore, Database
    from core.store.tables import SessionRow, TurnRow

    db = Database(f"sqlite:///{tmp_path}/x.db")
    await db.migrate()
    now = datetime.now(UTC)
    async with db.write() as s:
        s.add(SessionRow(id="s", channel=channel, agent="default", status="idle", reply_ref="{}", place="p",
                         created_at=now, updated_at=now))
        await s.flush()
        s.add(TurnRow(id=1, session_id="s", agent="default", status="running", created_at=now))
    # As the wiring builds it: entries compared with the person's channel (bot.people).
    broker = ApprovalBroker(ApprovalStore(db), EventBus(), SystemClock(),
                            ApprovalPolicy((), admins, people=people()),
                            AgentDirectory([Agent(approvers=approvers)]), timeout_s=60)
    request = await broker.request(session_id="s", turn_id=1, call_id="c1", tool="shell_run",
                                   args={"command": "rm -rf /srv"}, agent="default", place="p", requester="U2")
    return db, broker, request.id


@pytest.mark.parametrize(("approvers", "admins", "session_channel"), [
    # A bot.toml contributor's "web:U0EVIL" reads as the web chat's (whose only person is "web"): harmless-looking.
    # Configuration now refuses its shape (below); core refuses it whatever the configuration let through.
    (("web:U0EVIL",), (), "slack"),
    # BOT_ADMINS names Slack's U0EVIL; a person called U0EVIL on another channel is someone else.
    ((), ("slack:U0EVIL",), "testchat"),
])
async def test_an_entry_of_one_channel_decides_nothing_on_another(
    tmp_path: Path, approvers: tuple[str, ...], admins: tuple[str, ...], session_channel: str
) -> None:
    assert all(is_person(e) for e in admins)  # accepted as configuration
    db, broker, request_id = await _slack_request(tmp_path, approvers, admins, session_channel)
    try:
        result = await broker.decide(request_id, "approve", by="U0EVIL")
        assert not result.won and result.refused is not None
    finally:
        await db.close()


# -- a bare id two channels claim -------------------------------------------------------------------------------


@pytest.fixture
def greedy_channel(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Another installed channel whose ids look like Slack's (its name sorts before "slack")."""
    from channels.web.plugin import WebSettings

    greedy = ChannelPlugin(name="rocket", settings=WebSettings, build=lambda _s, _c: None,  # type: ignore[arg-type,return-value]
                           people=lambda entry: entry[:1] in ("U", "W", "S"))
    found = (greedy, *installed_channels())
    monkeypatch.setattr(bot_people, "installed_channels", lambda: found)
    yield


def test_a_bare_id_two_channels_claim_is_refused(greedy_channel: None) -> None:
    """Before: a bare U1 could only be Slack's. Once another channel claims the same shape, "U1" in BOT_ADMINS
    would silently become the first channel's by name ("rocket" before "slack"): Slack's U1 loses admin and the
    other channel's U1 gains it. An ambiguous bare entry is refused; <channel>:<id> says whose it is."""
    assert not is_person("U1") and not is_person("S1")
    assert is_person("slack:U1") and is_person("rocket:U1") and is_person("web") and is_person("requester")



@pytest.mark.parametrize("entry", ["slack:u1", "slack:requester", "slack:web", "web:U1", "web:S1", "slack:U1\n",
                                   "nochannel:U1"])
def test_a_channel_qualified_id_must_have_that_channels_shape(entry: str) -> None:
    """Found by the attack review: "web:U0EVIL" read as harmless (the web chat's only person is "web") and was
    accepted, as were "slack:u1" and "web:S1" (which the quorum check took for a user group). Each is refused where
    settings and bot.toml are read, like a bare id of the wrong shape."""
    assert not is_person(entry)
    assert is_person("slack:U1") and is_person("slack:S1") and is_person("web:web")

# -- secrets never echoed ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("values", [
    {"slack_client_secret": SECRET},  # not in the old list of secret names: now each model names its own
    {"slack_client_secret": [SECRET]},
    {"slack_signing_secret": [SECRET]},
    {"slack_bot_token": "xoxp-" + SECRET, "slack_signing_secret": SECRET},
    {"slack_app_token": SECRET, "slack_bot_token": "xoxb-1"},
    {"bot_web_token": [SECRET]},
    {"llm_api_key": [SECRET]},
    {"bot_secret_keys": SECRET},
])
def test_settings_errors_never_echo_a_secret(values: dict[str, object]) -> None:
    with pytest.raises(SettingsError) as raised:
        load_settings(env_file=None, **values)
    assert SECRET not in str(raised.value)


@pytest.mark.parametrize("toml", [
    f'[[policies]]\ntool = "http_request"\nheaders = ["Authorization Bearer {SECRET}"]\n',
    f'[[policies]]\ntool = "http_request"\nheaders = ["Authorization: Bearer {SECRET}\\n"]\n',
    f'[[mcp_servers]]\nname = "x"\nurl = "ftp://u:{SECRET}@h/"\n',
    f'[[connections]]\nname = "gh"\ntoken_url = "http://u:{SECRET}@example.com/"\nclient_id = "x"\n',
    f'[[policies]]\ntool = "x"\napprovers = ["U1{SECRET}\\n"]\n',
])
def test_bot_toml_errors_never_echo_header_values_or_urls(tmp_path: Path, toml: str) -> None:
    path = tmp_path / "bot.toml"
    path.write_text(toml)
    with pytest.raises(SettingsError) as raised:
        load_config(path)
    assert SECRET not in str(raised.value)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "true", '"60"', "1e400", "0"])
def test_bot_toml_numbers_are_taken_as_written(tmp_path: Path, value: str) -> None:
    """Strict models: no string, boolean, NaN or infinity becomes a wait or a timeout."""
    for toml in (f'[[policies]]\ntool = "x"\ntimeout_s = {value}\n',
                 f'[[mcp_servers]]\nname = "x"\ncommand = ["y"]\ntimeout_s = {value}\n',
                 f'[[policies]]\ntool = "x"\nquorum = {value}\n'):
        path = tmp_path / "bot.toml"
        path.write_text(toml)
        with pytest.raises(SettingsError):
            load_config(path)


# -- bot doctor: approvers that stop nobody ---------------------------------------------------------------------


@pytest.mark.parametrize(("approvers", "warned"), [
    ("requester", True),
    ("requester,web", True),
    ("requester,web:web", True),  # the same people, written with their channel: still nobody else decides
    ("requester,U1", False),
    ("requester,slack:U1", False),
    ("requester,slack:S1", False),
])
def test_doctor_warns_when_only_the_requester_approves_in_a_shared_channel(approvers: str, warned: bool) -> None:
    from bot.doctor import _approvers

    settings = load_settings(env_file=None, bot_approvers=approvers)
    assert bool(_approvers(settings)) is warned


def test_a_quorum_counts_one_person_once_however_written(tmp_path: Path) -> None:
    """Before, quorum = 2 with approvers ["U1", "U1"] was refused (never reachable). "U1" and "slack:U1" are the
    same person too: the rule would wait for a second approver who does not exist (only admins could settle it)."""
    path = tmp_path / "bot.toml"
    path.write_text('[[policies]]\ntool = "shell_run"\napprovers = ["U1", "slack:U1"]\nquorum = 2\n')
    with pytest.raises(SettingsError, match="only 1 approvers are named"):
        load_config(path)
    path.write_text('[[policies]]\ntool = "shell_run"\napprovers = ["U1", "slack:U2"]\nquorum = 2\n')
    assert load_config(path).policies[0].quorum == 2
