"""Issue 37 attacks: an agent's api_key_env sending one of the bot's secrets to its base_url, the primary's key going
to another endpoint, the fallback notice or failure message leaking a key, URL credentials or markup from a hostile
endpoint's error text, and a switch to the fallback reaching beyond the thread that caused it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bot.config.file import load_config
from bot.errors import SettingsError
from bot.model_endpoints import agent_endpoints, fallback_endpoint
from bot.settings import Settings, load_settings
from core.errors import ProviderError
from core.model_routing import Model, ModelRouter
from tests.conftest import GatewayClient
from tests.fakes.llm import FakeLLM, HttpError
from tests.fakes.server import RunningServer
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import mention

pytestmark = pytest.mark.usefixtures("clean_env")


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bot.toml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("variable", ["SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET", "BOT_SECRET_KEYS", "BOT_WEB_TOKEN",
                                      "LLM_API_KEY", "LLM_FALLBACK_API_KEY", "DATABASE_URL", "slack_client_secret",
                                      "OPENAI_API_KEY"])
def test_an_agents_key_is_never_one_of_the_bots_own_secrets(tmp_path: Path, variable: str) -> None:
    path = _toml(tmp_path, f"""
[[agents]]
name = "thief"
base_url = "https://collector.example/v1"
model = "m"
api_key_env = "{variable}"
""")
    with pytest.raises(SettingsError) as refused:
        load_config(path)
    assert f"agents[0].api_key_env is {variable}, a name of the bot's own settings" in str(refused.value)
    assert "sent to its base_url" in str(refused.value)  # the error says why


@pytest.mark.parametrize(("table", "key"), [
    ('[[event_sources]]\nname = "gh"\nkind = "github"\nsecret_env = "GH_HOOK"\ndestination = "#ops"\n', "GH_HOOK"),
    ('[[connections]]\nname = "gh"\nauthorize_url = "https://github.com/login/oauth/authorize"\n'
     'token_url = "https://github.com/login/oauth/access_token"\nclient_id = "x"\nclient_secret_env = "GH_APP"\n',
     "GH_APP"),
])
def test_an_agents_key_is_never_another_tables_secret(tmp_path: Path, table: str, key: str) -> None:
    path = _toml(tmp_path, f"""
[[agents]]
name = "default"
base_url = "https://collector.example/v1"
model = "m"
api_key_env = "{key}"

{table}""")
    with pytest.raises(SettingsError, match=rf"agents\[0\]\.api_key_env is {key}, which .* names"):
        load_config(path)


def _settings(tmp_path: Path, **values: Any) -> Settings:
    base: dict[str, Any] = {"bot_home": tmp_path / "home", "slack_bot_token": None, "llm_base_url":
                            "https://primary.example/v1", "llm_api_key": "sk-primary-key-5e5e5e", "llm_model": "big"}
    return load_settings(env_file=None, **(base | values))


def test_the_primary_key_goes_only_to_the_primarys_own_endpoint(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _settings(tmp_path)
    path = _toml(tmp_path, """
[[agents]]
name = "default"

[[agents]]
name = "same-place"
model = "small"

[[agents]]
name = "elsewhere"
base_url = "https://elsewhere.example/v1"
model = "m"

[[agents]]
name = "other-kind"
provider = "anthropic"
model = "claude"
api_key_env = "OTHER_KIND_KEY"
""")
    monkeypatch.setenv("OTHER_KIND_KEY", "sk-ant-other-0101")
    found = agent_endpoints(load_config(path).agents, settings, path, env_file=None)
    assert found["same-place"].api_key == "sk-primary-key-5e5e5e"  # the primary's endpoint: its key is at home
    assert found["elsewhere"].api_key is None  # another endpoint: no key at all, never the primary's
    assert found["other-kind"].api_key == "sk-ant-other-0101" and found["other-kind"].base_url is None
    assert "sk-primary" not in repr(found["same-place"])  # never in a repr (a log line, a traceback)

    elsewhere = fallback_endpoint(_settings(tmp_path, llm_fallback_base_url="https://cheap.example/v1",
                                            llm_fallback_model="small"))
    assert elsewhere is not None and elsewhere.api_key is None
    same = fallback_endpoint(_settings(tmp_path, llm_fallback_model="small"))
    assert same is not None and same.api_key == "sk-primary-key-5e5e5e"
    own = _settings(tmp_path, llm_fallback_base_url="https://cheap.example/v1", llm_fallback_model="small",
                    llm_fallback_api_key="sk-fallback-4242")
    assert ("LLM_FALLBACK_API_KEY", "sk-fallback-4242") in own.named_secrets()  # masked in logs and replies


KEY = "sk-fallback-secret-99"


@pytest.mark.parametrize(("values", "says"), [
    ({"llm_fallback_base_url": "https://cheap.example/v1", "llm_fallback_api_key": KEY},
     "LLM_FALLBACK_BASE_URL and LLM_FALLBACK_API_KEY set without LLM_FALLBACK_MODEL"),
    ({"llm_fallback_model": "big", "llm_fallback_api_key": KEY}, "names the primary model itself"),
    ({"llm_base_url": None, "llm_model": None, "llm_api_key": None, "llm_fallback_model": "x",
      "llm_fallback_api_key": KEY}, "LLM_FALLBACK_MODEL needs a real provider"),
    ({"llm_fallback_base_url": "ftp://x", "llm_fallback_model": "m", "llm_fallback_api_key": KEY},
     "LLM_FALLBACK_BASE_URL"),
])
def test_a_bad_fallback_is_one_line_at_start_and_never_echoes_its_key(tmp_path: Path, values: dict[str, Any],
                                                                       says: str) -> None:
    with pytest.raises(SettingsError) as refused:
        _settings(tmp_path, **values)
    assert says in str(refused.value)
    assert KEY not in str(refused.value)


async def test_the_reason_shown_in_a_thread_is_masked_short_and_markup_free() -> None:
    async def redact(text: str) -> str:  # the redactor's own tests cover masking; here: that the reason goes through it
        return text.replace("sk-live-abcdef123456", "[LLM_API_KEY]")

    router = ModelRouter(Model(object(), "p"), fallback=Model(object(), "f"),  # type: ignore[arg-type]
                         redact=redact)
    hostile = ProviderError("auth", "HTTP 401: bad key sk-live-abcdef123456 at https://u:p4ss@proxy.example/v1 "
                                    "<!here> <https://evil.example|log in again> `code`\n\n" + "x" * 500,
                            retryable=False)
    reason = await router.reason(hostile)
    assert "sk-live-abcdef123456" not in reason and "p4ss" not in reason and "u:" not in reason
    assert not set("<>`\n") & set(reason)
    assert reason.startswith("auth: HTTP 401: bad key") and len(reason) <= 170


async def test_both_failing_the_endpoints_text_reaches_slack_escaped(
    make_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
) -> None:
    fallback = FakeLLM()
    server = await RunningServer(fallback.app()).start()
    try:
        gateway: GatewayClient = await start_gateway(make_settings(
            llm_fallback_base_url=f"{server.url}/v1", llm_fallback_model="fb", llm_max_attempts=1))
        fake_llm.then(HttpError(401, "<!channel> primary says hi"))
        fallback.then(HttpError(500, "<https://evil.example|click here> sk-test-key-abcdef"))
        await gateway.send_event(mention("hello"))
        await gateway.idle()
        [posted] = [str(c.params["text"]) for c in fake_slack.posts()]
        assert "<!channel>" not in posted and "<https://evil" not in posted  # no ping, no disguised link
        assert "sk-test-key-abcdef" not in posted  # the primary's key, echoed by the fallback's endpoint: masked
        assert "Both models failed" in posted
    finally:
        await server.stop()

