"""Issue 37: a sticky fallback model (LLM_FALLBACK_*), the idle watchdog (LLM_IDLE_TIMEOUT_S) and per-agent models,
with the fake model servers (a second FakeLLM is the fallback); in process, but for one SIGKILL and restart."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY
from sqlmodel import select

from bot.settings import Settings
from channels.slack.payloads import thread_session
from core.model import FALLBACK_MODEL, TurnStatus
from core.store import ConversationStore
from core.store.tables import TurnRow
from tests.bot_process import BotProcess, post_form, send_event, slack_env
from tests.conftest import GatewayClient, running_llm
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.anthropic_api import Reply as AnthropicReply
from tests.fakes.core import until
from tests.fakes.llm import FakeLLM, Gate, HttpError, Reply
from tests.fakes.server import RunningServer
from tests.fakes.slack_api import TEAM_ID, FakeSlack
from tests.slack_requests import block_action, mention

NOTICE = ":information_source: answered with the fallback model: the primary failed with"
FALLBACK_KEY = "sk-fallback-key-7d1e2f"


@pytest.fixture
async def fallback_llm() -> AsyncIterator[FakeLLM]:
    async with running_llm() as fake:
        yield fake


@pytest.fixture
def fallback_settings(make_settings: Callable[..., Settings], fallback_llm: FakeLLM) -> Callable[..., Settings]:
    def make(**overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "llm_fallback_base_url": f"{fallback_llm.url}/v1",  # type: ignore[attr-defined]
            "llm_fallback_api_key": FALLBACK_KEY,
            "llm_fallback_model": "fallback-model",
            "llm_max_attempts": 2,
            "llm_idle_timeout_s": 0.2,
        }
        return make_settings(**(values | overrides))

    return make


def _texts(fake_slack: FakeSlack) -> list[str]:
    return [str(c.params.get("text")) for c in fake_slack.posts()]


async def _ask(gateway: GatewayClient, fake_slack: FakeSlack, text: str, *, thread_ts: str | None = None
               ) -> dict[str, Any]:
    event = mention(text, thread_ts=thread_ts)
    await gateway.send_event(event)
    await gateway.idle()
    return event


async def _session_model(gateway: GatewayClient, event: dict[str, Any]) -> str | None:
    info = await ConversationStore(gateway.app.db).get_session(thread_session(TEAM_ID, "C1", event["ts"]))
    assert info is not None
    return info.model


def _switches() -> float:
    return REGISTRY.get_sample_value("chatops_model_switches_total") or 0.0


def _calls(model: str, outcome: str) -> float:
    return REGISTRY.get_sample_value("chatops_model_calls_total", {"model": model, "outcome": outcome}) or 0.0


# -- the primary down: the fallback answers, and the session stays on it -----------------------------------------


async def test_primary_5xx_after_its_retries_the_fallback_answers_and_the_thread_stays_on_it(
    fallback_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    fallback_llm: FakeLLM,
) -> None:
    gateway: GatewayClient = await start_gateway(fallback_settings())
    switches, failed = _switches(), _calls("fake-model", "model")
    fake_llm.then(HttpError(500, "upstream exploded"), HttpError(502, "still down"))
    fallback_llm.then(Reply("the fallback's answer"))
    event = await _ask(gateway, fake_slack, "hello")

    assert len(fake_llm.requests) == 2  # LLM_MAX_ATTEMPTS, then no more
    assert fallback_llm.requests[0]["model"] == "fallback-model"
    assert fallback_llm.requests[0]["messages"][1:] == fake_llm.requests[0]["messages"][1:]  # the same transcript
    assert sorted(_texts(fake_slack)) == sorted([f"{NOTICE} model: HTTP 502: still down", "the fallback's answer"])
    assert await _session_model(gateway, event) == FALLBACK_MODEL
    assert _switches() == switches + 1 and _calls("fake-model", "model") == failed + 2
    assert _calls("fallback-model", "ok") >= 1

    # The next message in that thread: only the fallback is asked, and nobody is told again.
    fallback_llm.then(Reply("still the fallback"))
    await _ask(gateway, fake_slack, "and again?", thread_ts=event["ts"])
    assert len(fake_llm.requests) == 2 and len(fallback_llm.requests) == 2
    assert _texts(fake_slack)[2:] == ["still the fallback"]

    # A new thread tries the primary first (it is back).
    fake_llm.then(Reply("the primary again"))
    other = await _ask(gateway, fake_slack, "new thread")
    assert len(fake_llm.requests) == 3 and len(fallback_llm.requests) == 2
    assert _texts(fake_slack)[-1] == "the primary again"
    assert await _session_model(gateway, other) is None
    assert _switches() == switches + 1


async def test_a_refused_key_switches_at_once_and_the_notice_never_shows_a_key_or_url_credentials(
    fallback_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    fallback_llm: FakeLLM,
) -> None:
    gateway: GatewayClient = await start_gateway(fallback_settings())
    # A hostile (or careless) endpoint echoes the key, a URL with credentials and Slack markup in its error.
    fake_llm.then(HttpError(401, "Incorrect API key sk-test-key-abcdef for https://admin:hunter2@llm.example/v1 "
                                 "<!channel> <http://evil.example|click>"))
    fallback_llm.then(Reply("answered anyway"))
    await _ask(gateway, fake_slack, "hello")

    assert len(fake_llm.requests) == 1  # not retryable: not asked again
    [notice] = [t for t in _texts(fake_slack) if NOTICE in t]
    [answer] = [t for t in _texts(fake_slack) if NOTICE not in t]
    assert notice.startswith(f"{NOTICE} auth: HTTP 401: Incorrect API key")
    assert "sk-test-key-abcdef" not in notice and "hunter2" not in notice and "admin:" not in notice
    assert "<" not in notice.removeprefix(":information_source:") and ">" not in notice  # no mention, no link
    assert answer == "answered anyway"


async def test_a_stream_that_goes_silent_is_cancelled_not_retried_and_the_fallback_answers(
    fallback_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    fallback_llm: FakeLLM,
) -> None:
    gateway: GatewayClient = await start_gateway(fallback_settings(llm_idle_timeout_s=0.1))
    stalled = Reply("this never ends", hold_after=1)
    fake_llm.then(stalled)
    fallback_llm.then(Reply("the fallback finished it"))
    try:
        await _ask(gateway, fake_slack, "write something long")
    finally:
        stalled.resume.set()
    assert len(fake_llm.requests) == 1  # a silent stream is LLM_IDLE_TIMEOUT_S's, never retried
    [notice] = [t for t in _texts(fake_slack) if NOTICE in t]
    [answer] = [t for t in _texts(fake_slack) if NOTICE not in t]
    assert notice.startswith(f"{NOTICE} stalled: the model's stream sent nothing for 0.1 s")
    assert answer == "the fallback finished it"


async def test_a_429_with_a_short_retry_after_is_waited_out_on_the_primary(
    fallback_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    fallback_llm: FakeLLM,
) -> None:
    gateway: GatewayClient = await start_gateway(fallback_settings(llm_max_attempts=3))
    fake_llm.then(HttpError(429, "slow down", retry_after=0.05), Reply("the primary, after the wait"))
    event = await _ask(gateway, fake_slack, "hello")
    assert _texts(fake_slack) == ["the primary, after the wait"]
    assert fallback_llm.requests == []
    assert await _session_model(gateway, event) is None


async def test_tool_calls_made_before_the_switch_are_not_repeated(
    fallback_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    fallback_llm: FakeLLM,
) -> None:
    gateway: GatewayClient = await start_gateway(fallback_settings())
    fake_llm.then(Reply(tool_calls=[("time_now", {})]), HttpError(500), HttpError(500))
    fallback_llm.then(Reply("it is some time"))
    event = await _ask(gateway, fake_slack, "what time is it?")
    [request] = fallback_llm.requests
    results = [m for m in request["messages"] if m["role"] == "tool"]
    assert len(results) == 1  # the primary's call ran once; the fallback goes on from its result
    assert [m["role"] for m in request["messages"][1:]] == ["user", "assistant", "tool"]
    assert _texts(fake_slack)[-1] == "it is some time"
    history = await ConversationStore(gateway.app.db).history(thread_session(TEAM_ID, "C1", event["ts"]))
    assert sum("time_now" in entry.tool_names for entry in history) == 1


async def test_both_models_down_one_honest_message_and_the_turn_failed(
    fallback_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    fallback_llm: FakeLLM,
) -> None:
    gateway: GatewayClient = await start_gateway(fallback_settings())
    fake_llm.then(HttpError(500, "primary down"), HttpError(500, "primary down"))
    fallback_llm.then(HttpError(401, "fallback key refused"))
    event = await _ask(gateway, fake_slack, "hello")
    [message] = _texts(fake_slack)  # no "answered with the fallback" notice: nothing answered
    assert message.startswith(":warning: Both models failed: the primary (model: HTTP 500: primary down) and the "
                              "fallback (auth: HTTP 401: fallback key refused).")
    assert message.endswith("nothing else was done.")
    assert (len(fake_llm.requests), len(fallback_llm.requests)) == (2, 1)  # not retried for ever
    async with gateway.app.db.read() as s:
        [turn] = (await s.exec(select(TurnRow).where(
            TurnRow.session_id == thread_session(TEAM_ID, "C1", event["ts"])))).all()
    assert turn.status == TurnStatus.FAILED
    assert await _session_model(gateway, event) is None  # nothing followed the switch: the next message tries both


# -- sub-agents and per-agent models ------------------------------------------------------------------------------

AGENTS = """
[[agents]]
name = "default"
tools = ["time_now", "delegate"]

[[agents]]
name = "researcher"
instructions = "You research."
tools = ["time_now"]

[[agents]]
name = "pinned"
instructions = "You use your own model."
model = "pinned-model"
max_steps = 1
tools = ["time_now"]
"""


@pytest.fixture
def agents_settings(fallback_settings: Callable[..., Settings], tmp_path: Path) -> Callable[..., Settings]:
    def make(toml: str = AGENTS, **overrides: Any) -> Settings:
        config = tmp_path / "bot.toml"
        config.write_text(toml, encoding="utf-8")
        return fallback_settings(bot_config=config, **overrides)

    return make


async def test_sub_agents_inherit_the_switch(
    agents_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    fallback_llm: FakeLLM,
) -> None:
    gateway: GatewayClient = await start_gateway(agents_settings())
    fake_llm.then(HttpError(503), HttpError(503))
    fallback_llm.then(
        Reply(tool_calls=[("delegate", {"agent": "researcher", "task": "find the time"})]),  # the parent
        Reply("the researcher found it"),  # the sub-agent: on the fallback too
        Reply("done"),
    )
    event = await _ask(gateway, fake_slack, "delegate it")
    assert len(fake_llm.requests) == 2  # the parent's first call only
    assert [r["model"] for r in fallback_llm.requests] == ["fallback-model"] * 3
    assert "You research." in fallback_llm.requests[1]["messages"][0]["content"]
    assert _texts(fake_slack)[-1] == "done"
    assert await _session_model(gateway, event) == FALLBACK_MODEL


async def test_a_sub_agents_failure_switches_the_whole_thread(
    agents_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    fallback_llm: FakeLLM,
) -> None:
    gateway: GatewayClient = await start_gateway(agents_settings())
    fake_llm.then(Reply(tool_calls=[("delegate", {"agent": "researcher", "task": "find the time"})]),
                  HttpError(401, "no"))  # the sub-agent's first call
    fallback_llm.then(Reply("found on the fallback"), Reply("the parent, on the fallback too"))
    event = await _ask(gateway, fake_slack, "delegate it")
    assert len(fake_llm.requests) == 2
    assert _texts(fake_slack)[-1] == "the parent, on the fallback too"
    assert sum(NOTICE in t for t in _texts(fake_slack)) == 1
    assert await _session_model(gateway, event) == FALLBACK_MODEL  # stored with the sub-agent's answer


async def test_two_sub_agents_failing_at_once_both_go_on_with_the_fallback(
    agents_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    fallback_llm: FakeLLM,
) -> None:
    gateway: GatewayClient = await start_gateway(agents_settings())
    # Both sub-agents' first calls are in flight on the primary; one fails (the thread switches), then the other.
    held = Gate(HttpError(401, "no"))
    fake_llm.then(Reply(tool_calls=[("delegate", {"agent": "researcher", "task": "one"}),
                                    ("delegate", {"agent": "pinned", "task": "two"})]), held, HttpError(401, "no"))
    fallback_llm.then(Reply("a sub-agent's answer"), Reply("a sub-agent's answer"), Reply("both answered"))
    await gateway.send_event(mention("delegate twice"))
    await asyncio.wait_for(held.reached.wait(), 10)
    await until(lambda: len(fallback_llm.requests) == 1, what="the other sub-agent on the fallback")
    held.opened.set()  # the first one's primary fails now, after the switch: it goes on with the fallback too
    await gateway.idle()
    assert len(fake_llm.requests) == 3 and len(fallback_llm.requests) == 3
    results = [m["content"] for m in fallback_llm.requests[-1]["messages"] if m["role"] == "tool"]
    assert results == ["a sub-agent's answer", "a sub-agent's answer"]
    assert _texts(fake_slack)[-1] == "both answered"
    assert sum(NOTICE in t for t in _texts(fake_slack)) == 1


async def test_an_agents_own_model_and_max_steps_and_its_sub_agents_use_it(
    agents_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    tmp_path: Path,
) -> None:
    toml = AGENTS + """
[[agents]]
name = "lead"
instructions = "You lead."
model = "lead-model"
tools = ["time_now", "delegate"]
"""
    gateway: GatewayClient = await start_gateway(agents_settings(toml))
    runner = gateway.app.dispatcher.runner
    assert runner.models.own("pinned").name == "pinned-model"
    assert runner.models.own("researcher", parent_agent="lead").name == "lead-model"  # its parent's
    assert runner.models.own("pinned", parent_agent="lead").name == "pinned-model"  # its own first
    assert runner.models.own("researcher").name == "fake-model"  # the primary

    # The default agent delegates to "pinned": its call goes to its own model, and its one step is all it gets.
    fake_llm.then(Reply(tool_calls=[("delegate", {"agent": "pinned", "task": "twice"})]),
                  Reply(tool_calls=[("time_now", {})]), Reply("the default's answer"))
    await _ask(gateway, fake_slack, "go")
    parent, sub, parent_again = fake_llm.requests
    assert (parent["model"], sub["model"], parent_again["model"]) == ("fake-model", "pinned-model", "fake-model")
    told = next(m["content"] for m in parent_again["messages"] if m["role"] == "tool")
    assert "used all its 1 steps (its max_steps)" in told


async def test_an_agent_on_another_provider_gets_its_own_key_and_the_primary_key_never_goes_there(
    agents_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    anthropic = FakeAnthropic()
    server = await RunningServer(anthropic.app()).start()
    other = FakeLLM()
    other_server = await RunningServer(other.app()).start()
    try:
        monkeypatch.setenv("WRITER_ANTHROPIC_KEY", "sk-ant-writer-key-0042")
        toml = f"""
[[agents]]
name = "default"

[[agents]]
name = "writer"
instructions = "You write."
provider = "anthropic"
base_url = "{server.url}"
api_key_env = "WRITER_ANTHROPIC_KEY"
model = "claude-fake-1"

[[agents]]
name = "elsewhere"
instructions = "You are elsewhere."
base_url = "{other_server.url}/v1"
model = "other-model"
"""
        gateway: GatewayClient = await start_gateway(agents_settings(toml))
        anthropic.then(AnthropicReply("written by claude"))
        other.then(Reply("from elsewhere"))
        fake_llm.then(Reply(tool_calls=[("delegate", {"agent": "writer", "task": "write"}),
                                        ("delegate", {"agent": "elsewhere", "task": "look"})]), Reply("both done"))
        await _ask(gateway, fake_slack, "go")
        assert anthropic.headers[0].get("authorization") == "Bearer sk-ant-writer-key-0042"
        assert anthropic.requests[0]["model"] == "claude-fake-1"
        assert other.requests[0]["model"] == "other-model"
        assert other.authorizations == ["Bearer not-needed"]
        # An agent with a base_url of its own and no api_key_env sends no key: never the primary's LLM_API_KEY.
        results = [m["content"] for m in fake_llm.requests[-1]["messages"] if m["role"] == "tool"]
        assert results == ["written by claude", "from elsewhere"]
        assert gateway.app.dispatcher.runner.redactor is not None
        assert "sk-ant-writer-key-0042" not in await gateway.app.dispatcher.runner.redact("key sk-ant-writer-key-0042")
    finally:
        await other_server.stop()
        await server.stop()


# -- the idle clock runs only while a model streams ---------------------------------------------------------------


async def test_the_watchdog_does_not_fire_while_a_tool_runs_or_an_approval_waits(
    fallback_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    fallback_llm: FakeLLM,
) -> None:
    gateway: GatewayClient = await start_gateway(fallback_settings(llm_idle_timeout_s=0.1))
    # Thread A: a gated command (it runs longer than LLM_IDLE_TIMEOUT_S) waits for its approval.
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "sleep 0.3; echo slept"})]))
    a = mention("run the slow thing")
    await gateway.send_event(a)
    card = (await fake_slack.wait_for("chat.postMessage"))[0]
    # Thread B proves the idle time has passed meanwhile: its stalled stream is cancelled after it, and answered.
    stalled = Reply("never to be finished", hold_after=1)
    fake_llm.then(stalled)
    fallback_llm.then(Reply("B on the fallback"))
    try:
        await gateway.send_event(mention("thread B"))
        await until(lambda: "B on the fallback" in _texts(fake_slack), what="thread B answered by the fallback")
    finally:
        stalled.resume.set()
    fake_llm.then(Reply("A: the primary answered after the approval and the command"))
    await gateway.interact(block_action("approval:approve", card.params["blocks"][-1]["elements"][0]["value"]))
    await gateway.idle()
    assert _texts(fake_slack)[-1] == "A: the primary answered after the approval and the command"
    assert "slept" in next(m["content"] for m in fake_llm.requests[-1]["messages"] if m["role"] == "tool")
    assert await _session_model(gateway, a) is None  # A never switched
    assert len(fallback_llm.requests) == 1


# -- a switch survives SIGKILL: one real process ------------------------------------------------------------------


async def test_sigkill_right_after_the_switch_never_asks_the_primary_again(
    tmp_path: Path, unused_port: int, fake_slack: FakeSlack, fake_llm: FakeLLM, fallback_llm: FakeLLM,
    database_url: str | None, monkeypatch: pytest.MonkeyPatch,
) -> None:
    if database_url:
        monkeypatch.setenv("BOT_PROCESS_DATABASE_URL", database_url)
    env = slack_env(fake_slack, fake_llm, unused_port) | {
        "LLM_FALLBACK_BASE_URL": f"{fallback_llm.url}/v1",  # type: ignore[attr-defined]
        "LLM_FALLBACK_MODEL": "fallback-model", "LLM_FALLBACK_API_KEY": FALLBACK_KEY}
    fake_llm.then(HttpError(401, "key revoked"))
    # The fallback's step (a gated call, waiting for its approval) carries the switch in its commit.
    fallback_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo after-restart"})]))
    bot = await BotProcess(tmp_path, env).start()
    await send_event(bot, mention("do it"), "EvFallback")
    card = next(c for c in await fake_slack.wait_for("chat.postMessage", 2) if c.params.get("blocks"))
    await bot.kill()

    fallback_llm.then(Reply("done, on the fallback"))
    bot = await BotProcess(tmp_path, env).start()
    try:
        await post_form(bot, block_action("approval:approve", card.params["blocks"][-1]["elements"][0]["value"]))
        async with asyncio.timeout(20):
            while "done, on the fallback" not in _texts(fake_slack):
                await fake_slack.wait_for("chat.postMessage", len(fake_slack.posts()) + 1, 20)
        assert len(fake_llm.requests) == 1  # the primary was asked once, before the kill
        assert "after-restart" in next(m["content"] for m in fallback_llm.requests[-1]["messages"]
                                   if m["role"] == "tool")
        assert sum(NOTICE in t for t in _texts(fake_slack)) == 1
    finally:
        assert await bot.terminate() == 0
