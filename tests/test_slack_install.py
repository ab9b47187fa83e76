"""Multi-workspace (OAuth) installs (issue 20): settings, the sealed installation and state stores on SQLite and
PostgreSQL, and the install routes over HTTP against the fake Slack."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aiohttp
import pytest
from slack_sdk.oauth.installation_store import Installation
from sqlmodel import select

from bot.errors import SettingsError
from bot.settings import Settings, load_settings
from channels.slack.installs import DatabaseStateStore, VaultInstallationStore
from channels.slack.store import SlackInstallStore, install_context
from channels.slack.tables import SlackInstallationRow, SlackOAuthStateRow
from core.errors import VaultError
from core.store import Database
from core.vault import KeyRing, Sealed
from tests.fakes.slack_api import FakeSlack

SIGNING = "signing-secret-abcdef"
CLIENT_ID, CLIENT_SECRET = "1111.2222", "fake-client-secret"


class FixedClock:
    def __init__(self) -> None:
        self.at = datetime(2030, 1, 1, tzinfo=UTC)

    def now(self) -> datetime:
        return self.at


pytestmark = pytest.mark.usefixtures("clean_env")  # tests/conftest.py


def _error(**values: object) -> str:
    with pytest.raises(SettingsError) as info:
        load_settings(env_file=None, llm_model="m", **values)
    return str(info.value)


# -- settings -----------------------------------------------------------------------------------


def test_client_id_and_secret_with_signing_secret_turn_on_oauth_mode() -> None:
    s = load_settings(env_file=None, llm_model="m", slack_client_id=CLIENT_ID, slack_client_secret=CLIENT_SECRET,
                      slack_signing_secret=SIGNING)
    assert s.channels["slack"].oauth and s.channels["slack"].mode == "http"
    assert "chat:write" in s.channels["slack"].scope_list
    assert CLIENT_SECRET in s.secret_values()
    custom = load_settings(env_file=None, llm_model="m", slack_client_id=CLIENT_ID, slack_client_secret=CLIENT_SECRET,
                           slack_signing_secret=SIGNING, slack_scopes="chat:write, commands")
    assert (custom.channels["slack"].scope_list == ["chat:write", "commands"]
            and custom.channels["slack"].allowed_team_set is None)
    limited = load_settings(env_file=None, llm_model="m", slack_client_id=CLIENT_ID, slack_client_secret=CLIENT_SECRET,
                            slack_signing_secret=SIGNING, slack_allowed_teams="T1, T2")
    assert limited.channels["slack"].allowed_team_set == {"T1", "T2"}


@pytest.mark.parametrize(("values", "says"), [
    ({"slack_client_id": CLIENT_ID, "slack_signing_secret": SIGNING}, "SLACK_CLIENT_ID is set but SLACK_CLIENT_SECRET"),
    ({"slack_client_secret": CLIENT_SECRET, "slack_signing_secret": SIGNING},
     "SLACK_CLIENT_SECRET is set but SLACK_CLIENT_ID"),
    ({"slack_client_id": CLIENT_ID, "slack_client_secret": CLIENT_SECRET, "slack_signing_secret": SIGNING,
      "slack_bot_token": "xoxb-1-2"}, "SLACK_BOT_TOKEN and SLACK_CLIENT_ID/SLACK_CLIENT_SECRET are both set"),
    ({"slack_client_id": CLIENT_ID, "slack_client_secret": CLIENT_SECRET, "slack_app_token": "xapp-1"},
     "SLACK_APP_TOKEN (Socket Mode) cannot serve multi-workspace"),
    ({"slack_client_id": CLIENT_ID, "slack_client_secret": CLIENT_SECRET},
     "SLACK_SIGNING_SECRET is required in multi-workspace"),
    ({"slack_scopes": "chat:write"}, "SLACK_SCOPES is only used in multi-workspace"),
    ({"slack_allowed_teams": "T1"}, "SLACK_ALLOWED_TEAMS is only used in multi-workspace"),
    ({"slack_client_id": CLIENT_ID, "slack_client_secret": CLIENT_SECRET, "slack_signing_secret": SIGNING,
      "slack_allowed_teams": "T1,general"}, "'general' is not a Slack workspace id"),
    ({"slack_client_id": "abc", "slack_client_secret": CLIENT_SECRET, "slack_signing_secret": SIGNING},
     "Client ID"),
    ({"slack_signing_secret": SIGNING}, "for many workspaces, SLACK_CLIENT_ID and SLACK_CLIENT_SECRET"),
])
def test_bad_combinations_say_what_to_fix_in_one_line(values: dict[str, Any], says: str) -> None:
    error = _error(**values)
    assert says in error
    assert len([line for line in error.splitlines() if line.strip()]) == 2  # the heading and one line


# -- stores -------------------------------------------------------------------------------------


def _installation(team: str = "T1", token: str = "xoxb-t1-secret-token", **extra: Any) -> Installation:
    values: dict[str, Any] = dict(app_id="A0APP", team_id=team, team_name=f"Team {team}", bot_token=token,
                                  bot_id="BBOT", bot_user_id="UBOT", bot_scopes="chat:write,commands",
                                  user_id="UINSTALLER")
    return Installation(**(values | extra))


def _stores(db: Database, learned: list[str] | None = None) -> tuple[VaultInstallationStore, FixedClock]:
    clock = FixedClock()
    keys = KeyRing.parse(KeyRing.generate_spec("k1"))
    learn = (lambda _name, value: learned.append(value)) if learned is not None else None
    return VaultInstallationStore(SlackInstallStore(db), keys, clock=clock, learn=learn), clock


async def _rows(db: Database) -> list[SlackInstallationRow]:
    async with db.read() as s:
        return list((await s.exec(select(SlackInstallationRow))).all())


async def test_installations_are_sealed_found_replaced_and_removed(store_db: Database) -> None:
    learned: list[str] = []
    store, _clock = _stores(store_db, learned)
    told: list[str] = []
    store.changed.append(told.append)
    await store.async_save(_installation())
    await store.async_save(_installation("T2", "xoxb-t2-other-token"))
    rows = await _rows(store_db)
    assert {r.team_id for r in rows} == {"T1", "T2"}
    assert all("xoxb" not in r.ciphertext and r.key_id == "k1" for r in rows)  # never plaintext
    bot = await store.async_find_bot(enterprise_id=None, team_id="T1")
    assert bot is not None and bot.bot_token == "xoxb-t1-secret-token" and bot.bot_user_id == "UBOT"
    found = await store.async_find_installation(enterprise_id=None, team_id="T2")
    assert found is not None and found.bot_token == "xoxb-t2-other-token" and found.user_id == "UINSTALLER"
    assert await store.async_find_bot(enterprise_id=None, team_id="T9") is None
    assert "xoxb-t1-secret-token" in learned  # the redactor masks it from then on

    await store.async_save(_installation(token="xoxb-t1-reinstalled"))  # a re-install replaces the token
    assert len(await _rows(store_db)) == 2
    bot = await store.async_find_bot(enterprise_id=None, team_id="T1")
    assert bot is not None and bot.bot_token == "xoxb-t1-reinstalled"

    await store.async_delete_installation(enterprise_id=None, team_id="T1")
    assert await store.async_find_bot(enterprise_id=None, team_id="T1") is None
    assert [r.team_id for r in await _rows(store_db)] == ["T2"]
    assert told == ["T1", "T2", "T1", "T1"]


async def test_a_sealed_token_moved_to_another_row_does_not_open(store_db: Database) -> None:
    store, _clock = _stores(store_db)
    await store.async_save(_installation())
    await store.async_save(_installation("T2", "xoxb-t2-other-token"))
    one, two = sorted(await _rows(store_db), key=lambda r: r.team_id)
    two.ciphertext, two.key_id = one.ciphertext, one.key_id
    with pytest.raises(VaultError, match="Slack install of T2"):
        store.bot_of(two)
    assert store.keys.open(Sealed(one.key_id, one.ciphertext), install_context(one)).startswith("{")


async def test_an_org_wide_install_is_refused_and_a_workspace_is_found_by_its_team(store_db: Database) -> None:
    # Answers take the token of the workspace that asked: one org-wide row would serve many workspaces.
    store, _clock = _stores(store_db)
    with pytest.raises(ValueError, match="install into each workspace"):
        await store.async_save(_installation("", enterprise_id="E1", is_enterprise_install=True))
    assert await _rows(store_db) == []
    await store.async_save(_installation("T5", "xoxb-t5-grid-workspace", enterprise_id="E1"))
    found = await store.workspace_bot("T5")
    assert found is not None and found.bot_token == "xoxb-t5-grid-workspace" and found.bot_user_id == "UBOT"
    assert await store.workspace_bot("T6") is None and await store.workspace_bot("") is None
    assert await store.uninstalled("E1", "T5", why="app_uninstalled")
    assert await store.workspace_bot("T5") is None
    assert not await store.uninstalled("E1", "T5", why="app_uninstalled")


async def test_states_work_once_and_only_until_they_expire(store_db: Database) -> None:
    clock = FixedClock()
    states = DatabaseStateStore(SlackInstallStore(store_db), clock=clock, ttl_s=600)
    first, second = await states.async_issue(), await states.async_issue()
    async with store_db.read() as s:
        stored = [r.state_hash for r in (await s.exec(select(SlackOAuthStateRow))).all()]
    assert first not in stored and len(stored) == 2  # only hashes are kept
    assert await states.async_consume(first)
    assert not await states.async_consume(first)
    assert not await states.async_consume("made-up")
    clock.at += timedelta(seconds=601)
    assert not await states.async_consume(second)


# -- routes -------------------------------------------------------------------------------------


@pytest.fixture
def oauth_settings(make_settings: Callable[..., Settings], fake_slack: FakeSlack) -> Callable[..., Settings]:
    def make(**overrides: Any) -> Settings:
        values: dict[str, Any] = {"slack_bot_token": None, "slack_client_id": fake_slack.client_id,
                                  "slack_client_secret": fake_slack.client_secret}
        return make_settings(**(values | overrides))

    return make


def _cookie(response: aiohttp.ClientResponse) -> tuple[str, str]:
    header = response.headers.getall("Set-Cookie")[0]
    return header.split(";")[0], header


async def _install_page(http: aiohttp.ClientSession, base: str) -> tuple[str, str, str]:
    """(the Add-to-Slack URL, the cookie as the browser sends it, the Set-Cookie line)."""
    async with http.get(f"{base}/slack/install") as resp:
        assert resp.status == 200
        page = await resp.text()
        sent, line = _cookie(resp)
    match = re.search(r'<a id="add-to-slack" href="([^"]+)">Add to Slack</a>', page)
    assert match is not None, page
    return match.group(1).replace("&amp;", "&"), sent, line


async def test_install_page_and_redirect_store_the_workspace(oauth_settings: Callable[..., Settings],
                                                             start_gateway: Any, fake_slack: FakeSlack) -> None:
    gw = await start_gateway(oauth_settings())
    base = gw.base
    fake_slack.redirect_to = f"{base}/slack/oauth_redirect"
    link, cookie, line = await _install_page(gw.http, base)
    # On plain http the cookie must not be Secure (a browser would drop it); Lax goes along with the redirect.
    assert "Secure" not in line and "SameSite=Lax" in line and "HttpOnly" in line
    assert link.startswith(f"{fake_slack.url}/oauth/v2/authorize?")  # type: ignore[attr-defined]
    query = parse_qs(urlsplit(link).query)
    assert query["client_id"] == [fake_slack.client_id] and "chat:write" in query["scope"][0].split(",")
    async with gw.http.get(link, allow_redirects=False) as resp:  # Slack approves and sends the browser back
        back = resp.headers["Location"]
    async with gw.http.get(back, headers={"Cookie": cookie}, allow_redirects=False) as resp:
        assert resp.status == 200, await resp.text()
        assert "deleted" in resp.headers.get("Set-Cookie", "")
    exchanged = fake_slack.of("oauth.v2.access")
    assert len(exchanged) == 1  # at SLACK_API_URL, not at slack.com
    rows = await _rows(gw.app.db)
    assert [(r.team_id, r.team_name, r.installer) for r in rows] == [("T1", "Team", "UINSTALLER")]
    token = fake_slack.token_of("T1")
    assert token not in rows[0].ciphertext
    async with gw.app.db.engine.connect() as conn:  # nowhere in the table in clear
        dumped = json.dumps([list(map(str, r)) for r in (await conn.exec_driver_sql(
            "SELECT * FROM slack_installations")).all()])
    assert token not in dumped
    # The same state and cookie again: refused (a state works once).
    async with gw.http.get(back, headers={"Cookie": cookie}, allow_redirects=False) as resp:
        assert resp.status == 401


async def test_the_state_check_needs_this_browsers_cookie(oauth_settings: Callable[..., Settings],
                                                          start_gateway: Any, fake_slack: FakeSlack) -> None:
    gw = await start_gateway(oauth_settings())
    fake_slack.redirect_to = f"{gw.base}/slack/oauth_redirect"
    link, _cookie_sent, _line = await _install_page(gw.http, gw.base)
    async with gw.http.get(link, allow_redirects=False) as resp:
        back = resp.headers["Location"]
    async with gw.http.get(back, allow_redirects=False) as resp:  # another browser: no cookie
        assert resp.status == 400
    async with gw.http.get(back, headers={"Cookie": "slack-app-oauth-state=forged"}, allow_redirects=False) as resp:
        assert resp.status == 400
    async with gw.http.get(f"{gw.base}/slack/oauth_redirect?error=access_denied", allow_redirects=False) as resp:
        assert resp.status == 200  # the installer said no: a page that says so
    assert fake_slack.of("oauth.v2.access") == [] and await _rows(gw.app.db) == []


async def test_behind_https_the_cookie_is_secure_and_the_redirect_url_named(
        oauth_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack) -> None:
    gw = await start_gateway(oauth_settings(bot_public_url="https://bot.example.com/chatops"))
    link, _cookie_sent, line = await _install_page(gw.http, gw.base)
    assert "; Secure" in line and "Path=/chatops/slack/oauth_redirect" in line
    assert parse_qs(urlsplit(link).query)["redirect_uri"] == ["https://bot.example.com/chatops/slack/oauth_redirect"]


async def test_single_workspace_mode_serves_no_install_routes(make_settings: Callable[..., Settings],
                                                              start_gateway: Any) -> None:
    gw = await start_gateway(make_settings())
    async with gw.http.get(f"{gw.base}/slack/install") as resp:
        assert resp.status in (404, 405)


def test_distribution_manifest_names_the_redirect_url_and_uninstall_events() -> None:
    from channels.slack.manifest import build_manifest

    plain = build_manifest("http")
    assert "redirect_urls" not in plain["oauth_config"]
    assert "app_uninstalled" not in plain["settings"]["event_subscriptions"]["bot_events"]
    shared = build_manifest("http", distribution=True)
    assert shared["oauth_config"]["redirect_urls"] == ["https://bot.example.com/slack/oauth_redirect"]
    assert shared["oauth_config"]["scopes"] == plain["oauth_config"]["scopes"]
    assert {"app_uninstalled", "tokens_revoked"} <= set(shared["settings"]["event_subscriptions"]["bot_events"])
    with pytest.raises(ValueError, match="HTTP mode"):
        build_manifest("socket", distribution=True)


async def test_doctor_runs_auth_test_for_every_installation(oauth_settings: Callable[..., Settings]) -> None:
    from bot.doctor import doctor_context
    from bot.keys import load_keyring
    from channels.slack.doctor import installation_checks as checks_of

    def installation_checks(settings: Settings) -> Any:
        return checks_of(settings.channels["slack"], doctor_context(settings))

    settings = oauth_settings(bot_secret_keys=KeyRing.generate_spec("k1"), slack_allowed_teams="T1,T2")
    # Who may install, then: no tables yet, a warning, not a crash.
    assert [(c.name, c.warning) for c in await installation_checks(settings)] == [
        ("slack allowed teams", False), ("slack installs", True)]
    opened = await installation_checks(oauth_settings(bot_secret_keys=KeyRing.generate_spec("k1")))
    assert opened[0].warning and "counts as a guest" in opened[0].detail
    db = Database(settings.resolved_database_url)
    try:
        await db.migrate()
        store = VaultInstallationStore(SlackInstallStore(db), load_keyring(settings))
        await store.async_save(_installation("T1", "xoxb-good-token"))
        await store.async_save(_installation("T2", "xoxb-revoked-bad"))
    finally:
        await db.close()
    checks = {c.name: c for c in await installation_checks(settings)}
    assert checks["slack T1 (Team T1)"].ok and "scopes match" in checks["slack T1 (Team T1)"].detail
    assert not checks["slack T2 (Team T2)"].ok and "invalid_auth" in checks["slack T2 (Team T2)"].detail
    narrowed = {c.name: c for c in await installation_checks(
        oauth_settings(bot_secret_keys=settings.bot_secret_keys, slack_allowed_teams="T1"))}
    assert narrowed["slack T2 (Team T2)"].warning and "not served" in narrowed["slack T2 (Team T2)"].detail
