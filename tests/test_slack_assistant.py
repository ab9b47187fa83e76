"""The assistant pane (issue 15): a new chat gets suggested prompts, the channel the person looks at reaches
the agent with the next question, and messages typed in the pane are answered in their own thread."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bot.config.file import load_config
from bot.errors import SettingsError
from channels.slack.toml import DEFAULT_PROMPTS, SlackSection, prompts_of
from tests.conftest import GatewayClient
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import message, next_ts


def load_suggested_prompts(path: Path) -> tuple[tuple[str, str], ...]:
    """What the Slack channel is built with: its [slack] section of the checked file."""
    section = load_config(path).section("slack")
    assert section is None or isinstance(section, SlackSection)
    return prompts_of(section)

def _thread_event(kind: str, *, channel: str = "D1", thread_ts: str, viewed: str | None = "C9") -> dict[str, Any]:
    context = {"channel_id": viewed, "team_id": "T1", "enterprise_id": None} if viewed else {}
    return {"type": kind, "event_ts": next_ts(),
            "assistant_thread": {"user_id": "U1", "context": context, "channel_id": channel, "thread_ts": thread_ts}}


async def test_a_new_chat_gets_prompts_and_the_agent_knows_the_channel_being_looked_at(
        gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    thread = next_ts()
    started = _thread_event("assistant_thread_started", thread_ts=thread)
    assert (await gateway.send_event(started, event_id="EvStart1")).status == 200
    assert (await gateway.send_event(started, event_id="EvStart1", retry_num=1)).status == 200  # Slack's retry
    [prompts] = await fake_slack.wait_for("assistant.threads.setSuggestedPrompts")
    assert (prompts.params["channel_id"], prompts.params["thread_ts"]) == ("D1", thread)
    assert [(p["title"], p["message"]) for p in prompts.params["prompts"]] == list(DEFAULT_PROMPTS)
    assert prompts.params["title"]
    assert fake_llm.requests == []  # opening a chat asks the model nothing

    await gateway.send_event(_thread_event("assistant_thread_context_changed", thread_ts=thread, viewed="C7"))
    fake_llm.then(Reply("Here is what is happening there."))
    await gateway.send_event(message("what is going on here?", channel="D1", channel_type="im", thread_ts=thread))
    await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()
    question = fake_llm.requests[0]["messages"][-1]["content"]
    # The newest view replaced the one still waiting (and the redelivered start stored nothing).
    assert question.count("I am looking at channel") == 1 and "<#C9>" not in question
    assert question.index("<#C7>") < question.index("what is going on here?")
    [post] = fake_slack.posts()
    assert (post.params["channel"], post.params["thread_ts"]) == ("D1", thread)  # answered in its own thread
    [title] = await fake_slack.wait_for("assistant.threads.setTitle")  # the first question names the chat
    assert (title.params["thread_ts"], title.params["title"]) == (thread, "what is going on here?")
    fake_llm.then(Reply("more"))
    await gateway.send_event(message("and now?", channel="D1", channel_type="im", thread_ts=thread))
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    assert len(fake_slack.of("assistant.threads.setTitle")) == 1  # named once


async def test_prompts_come_from_bot_toml_and_none_are_offered_for_an_empty_list(
        make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, tmp_path: Path) -> None:
    config = tmp_path / "bot.toml"
    config.write_text('[slack]\nsuggested_prompts = [{ title = "Deploy status", message = "Is the deploy done?" }]\n')
    gateway: GatewayClient = await start_gateway(make_settings(bot_config=config))
    await gateway.send_event(_thread_event("assistant_thread_started", thread_ts=next_ts(), viewed=None))
    [prompts] = await fake_slack.wait_for("assistant.threads.setSuggestedPrompts")
    assert prompts.params["prompts"] == [{"title": "Deploy status", "message": "Is the deploy done?"}]
    config.write_text("[slack]\nsuggested_prompts = []\n")
    assert load_suggested_prompts(config) == ()


@pytest.mark.parametrize("text", [
    "[slack]\nsuggested_prompts = \"ask me\"\n",
    "[slack]\nsuggested_prompts = [{ title = \"t\" }]\n",
    "[slack]\nsuggested_prompts = [{ title = \"\", message = \"m\" }]\n",
    "[slack]\nsuggested_prompts = [{ title = \"t\", message = \"m\", extra = 1 }]\n",
    "[slack]\nprompts = []\n",
    "slack = 3\n",
    "[slack]\nsuggested_prompts = [" + ", ".join(['{ title = "t", message = "m" }'] * 5) + "]\n",
])
def test_a_bad_slack_table_is_refused_with_where(tmp_path: Path, text: str) -> None:
    config = tmp_path / "bot.toml"
    config.write_text(text)
    with pytest.raises(SettingsError, match=r"bot.toml: \[slack\]|bot.toml: .*slack"):
        load_suggested_prompts(config)


async def test_no_view_is_recorded_where_the_operator_turned_thread_context_off(
        make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    gateway: GatewayClient = await start_gateway(make_settings(bot_record_thread_context=False))
    thread = next_ts()
    await gateway.send_event(_thread_event("assistant_thread_started", thread_ts=thread))
    await fake_slack.wait_for("assistant.threads.setSuggestedPrompts")  # the prompts still come
    fake_llm.then(Reply("ok"))
    await gateway.send_event(message("what now?", channel="D1", channel_type="im", thread_ts=thread))
    await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()
    assert "looking at" not in fake_llm.requests[0]["messages"][-1]["content"]


def test_a_config_file_that_is_not_utf8_is_refused_with_where(tmp_path: Path) -> None:
    from bot.config.file import load_agents

    config = tmp_path / "bot.toml"
    config.write_bytes(b"[slack]\nsuggested_prompts = []\n# \xff\xfe\n")
    for load in (load_suggested_prompts, lambda path: load_agents(path, default_instructions=None)):
        with pytest.raises(SettingsError, match=r"bot\.toml"):
            load(config)


def test_a_misspelt_table_is_refused_not_ignored(tmp_path: Path) -> None:
    from bot.config.file import load_agents

    config = tmp_path / "bot.toml"
    config.write_text('[[agent]]\nname = "ops"\ntools = ["time_now"]\n')  # [[agents]] misspelt
    with pytest.raises(SettingsError, match=r"unknown tables \['agent'\]"):
        load_agents(config, default_instructions=None)


def test_a_file_with_only_a_slack_table_keeps_the_default_agent(tmp_path: Path) -> None:
    from bot.config.file import load_agents

    config = tmp_path / "bot.toml"
    config.write_text("[slack]\nsuggested_prompts = []\n")
    [agent] = load_agents(config, default_instructions=None)
    assert agent.name == "default"


async def test_malformed_assistant_events_are_acknowledged_and_ignored(
        gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    for event in ({"type": "assistant_thread_started", "event_ts": next_ts()},
                  {"type": "assistant_thread_started", "assistant_thread": {"channel_id": "D1", "thread_ts": "x",
                                                                            "user_id": "U1"}},
                  {"type": "assistant_thread_context_changed",
                   "assistant_thread": {"channel_id": "D1", "thread_ts": next_ts(), "user_id": "U1",
                                        "context": {"channel_id": "<!channel>"}}}):
        assert (await gateway.send_event(event)).status == 200
    await gateway.idle()
    assert fake_slack.of("assistant.threads.setSuggestedPrompts") == []
    assert await gateway.app.gateway.sessions("slack") == []
