"""Settings: defaults, environment and ``.env`` reading, and validation messages (SPEC §2, §13)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from bot.errors import SettingsError
from bot.settings import Settings, load_settings
from tests.bot_process import run_to_exit

SIGNING = "signing-secret-abcdef"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No variable from the outer environment, and no stray ``.env`` in the working directory."""
    fields = {name.upper() for name in Settings.model_fields}
    for key in list(os.environ):
        upper = key.upper()
        if upper in fields or upper.startswith(("SLACK_", "LLM_", "BOT_", "DATABASE_")):
            monkeypatch.delenv(key, raising=False)
    for key in ("PORT", "HOST", "DATABASE_URL"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)


def error_of(**overrides: object) -> str:
    with pytest.raises(SettingsError) as info:
        load_settings(env_file=None, **overrides)
    return str(info.value)


def test_defaults() -> None:
    s = load_settings(env_file=None)
    assert s.host == "127.0.0.1"
    assert s.port == 3000
    assert s.bot_home == Path("./.bot")
    assert s.provider == "demo"
    assert (s.llm_base_url, s.llm_model, s.llm_api_key) == (None, None, None)
    assert s.channels["slack"].mode is None
    assert s.channels["slack"].api_url == "https://slack.com/api/"
    assert s.approvers == ("requester",)
    assert s.admins == ()
    assert s.queue_mode == "steer"


def test_default_env_file_in_cwd_is_read(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("PORT=4100\n")
    assert load_settings().port == 4100


def test_environment_variables_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PORT", "4000")
    monkeypatch.setenv("HOST", "0.0.0.0")
    monkeypatch.setenv("BOT_WEB_TOKEN", "a-long-enough-login-token")
    s = load_settings(env_file=None)
    assert s.port == 4000
    assert s.host == "0.0.0.0"
    assert not s.is_local_bind
    assert s.bot_web_token == "a-long-enough-login-token"


def test_exposed_web_chat_needs_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOST", "0.0.0.0")
    with pytest.raises(SettingsError, match="BOT_WEB_TOKEN"):
        load_settings(env_file=None)
    monkeypatch.setenv("BOT_WEB_TOKEN", "short")
    with pytest.raises(SettingsError, match="at least 16"):
        load_settings(env_file=None)
    monkeypatch.setenv("BOT_WEB_CHAT", "false")
    monkeypatch.delenv("BOT_WEB_TOKEN")
    assert load_settings(env_file=None).host == "0.0.0.0"  # no web chat, nothing to log in to


def test_env_file_is_read(tmp_path: Path) -> None:
    env = tmp_path / "custom.env"
    env.write_text("PORT=4001\nBOT_APPROVERS=U1,requester\nLLM_BASE_URL=http://llm.local/v1\nLLM_MODEL=m\n")
    s = load_settings(env_file=env)
    assert s.port == 4001
    assert s.approvers == ("U1", "requester")
    assert s.provider == "openai"


def test_environment_wins_over_env_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = tmp_path / "x.env"
    env.write_text("PORT=4001\n")
    monkeypatch.setenv("PORT", "4002")
    assert load_settings(env_file=env).port == 4002


def test_overrides_win() -> None:
    assert load_settings(env_file=None, port=5555).port == 5555


def test_bad_port_names_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PORT", "abc")
    with pytest.raises(SettingsError) as info:
        load_settings(env_file=None)
    assert "PORT" in str(info.value)


def test_port_out_of_range_refused() -> None:
    assert "PORT" in error_of(port=70000)


@pytest.mark.parametrize("url", ["not a url", "mysql://x/y", "oracle://scott:tiger@h/db"])
def test_bad_database_url(url: str) -> None:
    message = error_of(database_url=url)
    assert "DATABASE_URL" in message


def test_database_url_password_not_echoed() -> None:
    message = error_of(database_url="mysql://user:hunter2pass@h/db")
    assert "hunter2pass" not in message


@pytest.mark.parametrize("url", ["sqlite:///x.db", "postgresql://u:p@h/db", "postgresql+asyncpg://u:p@h/db"])
def test_good_database_urls(url: str) -> None:
    s = load_settings(env_file=None, database_url=url)
    assert s.resolved_database_url == url


def test_bot_token_shape_refused_without_echoing_value() -> None:
    message = error_of(slack_bot_token="secretvalue123", slack_signing_secret=SIGNING)
    assert "SLACK_BOT_TOKEN" in message
    assert "xoxb-" in message
    assert "secretvalue123" not in message
    assert SIGNING not in message


def test_app_token_shape_refused_without_echoing_value() -> None:
    message = error_of(slack_bot_token="xoxb-1-abc", slack_app_token="secretapp456")
    assert "SLACK_APP_TOKEN" in message
    assert "secretapp456" not in message


def test_bot_token_alone_refused() -> None:
    message = error_of(slack_bot_token="xoxb-only-token-value")
    assert "SLACK_SIGNING_SECRET" in message
    assert "xoxb-only-token-value" not in message


def test_signing_secret_without_bot_token_refused() -> None:
    message = error_of(slack_signing_secret=SIGNING)
    assert "SLACK_BOT_TOKEN is required" in message
    assert SIGNING not in message


def test_llm_base_url_without_model_refused() -> None:
    message = error_of(llm_base_url="http://llm.local/v1", llm_api_key="sk-topsecret-key")
    assert "LLM_MODEL" in message
    assert "sk-topsecret-key" not in message


def test_llm_base_url_must_be_http() -> None:
    assert "LLM_BASE_URL" in error_of(llm_base_url="ftp://llm.local", llm_model="m")


def test_explicit_demo_provider_needs_no_model() -> None:
    s = load_settings(env_file=None, llm_provider="demo", llm_base_url="http://llm.local/v1")
    assert s.provider == "demo"


def test_secret_values_listed() -> None:
    k1, k2 = "A" * 43 + "=", "B" * 43 + "="  # 32-byte keys, base64
    s = load_settings(env_file=None, slack_bot_token="xoxb-1-abc", slack_signing_secret=SIGNING,
                      llm_api_key="sk-key-1234", bot_secret_keys=f"k1:{k1},k2:{k2}",
                      database_url="postgresql://u:dbpassword@h/db")
    assert set(s.secret_values()) >= {"xoxb-1-abc", SIGNING, "sk-key-1234", k1, k2, "dbpassword"}


@pytest.mark.parametrize(
    "keys", ["nocolon", "k1:short", "k1:!!!notbase64", "k1:" + "A" * 43 + "=,k1:" + "B" * 43 + "="])
def test_bad_secret_keys_are_refused_without_echoing_them(keys: str) -> None:
    message = error_of(bot_secret_keys=keys)
    assert "BOT_SECRET_KEYS" in message and keys not in message


def test_approvers_accepted() -> None:
    s = load_settings(env_file=None, bot_approvers="requester,U123,S456", bot_admins="W9, U8")
    assert s.approvers == ("requester", "U123", "S456")
    assert s.admins == ("W9", "U8")


@pytest.mark.parametrize("value", ["bob", "U", "U12-3", "requester,bob"])
def test_approvers_refused(value: str) -> None:
    assert "BOT_APPROVERS" in error_of(bot_approvers=value)


def test_http_mode() -> None:
    s = load_settings(env_file=None, slack_bot_token="xoxb-1-abc", slack_signing_secret=SIGNING)
    assert s.channels["slack"].mode == "http"


def test_socket_mode() -> None:
    s = load_settings(env_file=None, slack_bot_token="xoxb-1-abc", slack_app_token="xapp-1-abc")
    assert s.channels["slack"].mode == "socket"


def test_blank_values_are_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLACK_BOT_TOKEN", "  ")
    monkeypatch.setenv("DATABASE_URL", "")
    s = load_settings(env_file=None)
    assert s.channels["slack"].mode is None
    assert s.database_url is None


def test_resolved_database_url_under_bot_home(tmp_path: Path) -> None:
    s = load_settings(env_file=None, bot_home=tmp_path / "home")
    assert s.resolved_database_url == f"sqlite:///{(tmp_path / 'home' / 'bot.db').resolve()}"


def test_relative_bot_home_resolved_against_cwd(tmp_path: Path) -> None:
    s = load_settings(env_file=None)
    assert s.resolved_database_url == f"sqlite:///{(tmp_path / '.bot' / 'bot.db').resolve()}"


def test_slack_api_url_gets_trailing_slash() -> None:
    s = load_settings(env_file=None, slack_api_url="http://localhost:9999/api")
    assert s.channels["slack"].api_url == "http://localhost:9999/api/"


def test_slack_api_url_must_be_http() -> None:
    assert "SLACK_API_URL" in error_of(slack_api_url="localhost/api")


def test_several_bad_variables_each_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PORT", "abc")
    monkeypatch.setenv("QUEUE_MODE", "sometimes")
    with pytest.raises(SettingsError) as info:
        load_settings(env_file=None)
    assert "PORT" in str(info.value)
    assert "QUEUE_MODE" in str(info.value)


def test_a_postgresql_url_without_its_drivers_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "asyncpg", None)  # as on a machine without the [postgres] extra
    message = error_of(database_url="postgresql://u:secretpw@h/db")
    assert "DATABASE_URL: needs asyncpg, which is not installed: pip install 'chatops-gateway[postgres]'" in message
    assert "secretpw" not in message


async def test_bot_run_without_the_postgres_driver_says_what_to_install_in_one_line(tmp_path: Path) -> None:
    hide = tmp_path / "hide"
    hide.mkdir()  # this interpreter cannot import the drivers (a sitecustomize that removes them)
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['asyncpg'] = None\nsys.modules['psycopg'] = None\n",
                                           encoding="utf-8")
    code, out = await run_to_exit(tmp_path, {"DATABASE_URL": "postgresql://bot:pw@127.0.0.1:1/bot", "PORT": "0",
                                             "PYTHONPATH": f"{hide}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    assert code != 0 and "Traceback" not in out, out
    assert "needs asyncpg, psycopg, which are not installed: pip install 'chatops-gateway[postgres]'" in out
