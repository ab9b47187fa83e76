"""Sub-agents (issue 19, SPEC §16): ``delegate(agent, task)`` runs another agent from bot.toml with its tools
narrowed to its parent's, in its own stored session, asking nobody; caps, stop, crash recovery, what is shown."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import select

from bot.errors import SettingsError
from bot.settings import Settings, load_settings
from channels.slack.payloads import thread_session
from core import subagents
from core.commands import Command
from core.errors import BudgetExhausted
from core.model import SessionInfo, SessionStatus, TurnStatus
from core.store import ConversationStore, Database
from core.store.subagents import INTERRUPTED, SubAgentStore
from core.store.tables import ApprovalRow, CredentialRequestRow
from core.subagents import SubAgents
from core.tools import SUBAGENT_CANNOT_ASK, ToolContext
from tests.bot_process import BotProcess, run_to_exit, send_event, slack_env
from tests.conftest import GatewayClient
from tests.fakes.core import until
from tests.fakes.llm import FakeLLM, Gate, Reply
from tests.fakes.slack_api import TEAM_ID, FakeSlack
from tests.slack_requests import mention

AGENTS = """
[[agents]]
name = "default"
tools = ["time_now", "shell_run", "credential_request", "schedule_*"]

[[agents]]
name = "researcher"
instructions = "You research things carefully."
tools = ["time_now", "shell_run", "http_request", "credential_request", "delegate"]

[[agents]]
name = "writer"
instructions = "You write things."
"""
RESEARCHER_TOOLS = ["credential_request", "shell_run", "time_now"]  # its own ∩ the default's, never delegate


@pytest.fixture
def agents_settings(make_settings: Callable[..., Settings], tmp_path: Path) -> Callable[..., Settings]:
    def make(**overrides: Any) -> Settings:
        config = tmp_path / "bot.toml"
        config.write_text(AGENTS, encoding="utf-8")
        return make_settings(bot_config=config, **overrides)

    return make


def _tools(request: dict[str, Any]) -> list[str]:
    return sorted(t["function"]["name"] for t in request.get("tools") or [])


def _system(request: dict[str, Any]) -> str:
    return str(request["messages"][0]["content"]) if request["messages"][0]["role"] == "system" else ""


def _tool_results(request: dict[str, Any]) -> list[str]:
    return [str(m["content"]) for m in request["messages"] if m["role"] == "tool"]


def _subagents(gateway: GatewayClient) -> SubAgents:
    tool = gateway.app.dispatcher.runner.tools.get("delegate")
    assert tool is not None
    engine = getattr(tool.function, "__self__", None)
    assert isinstance(engine, SubAgents)
    return engine


def _delegate(agent: str, task: str) -> tuple[str, dict[str, Any]]:
    return ("delegate", {"agent": agent, "task": task})


async def _status(gateway: GatewayClient, session: str) -> str:
    return await gateway.app.gateway.command(Command(text="status", user="U1", channel="slack",
                                                     place=f"slack:{TEAM_ID}:C1", session=session))


# -- delegation --------------------------------------------------------------------------------------


async def test_a_delegated_task_runs_the_named_agent_with_narrowed_tools_in_its_own_session(
    agents_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    gateway: GatewayClient = await start_gateway(agents_settings())
    fake_slack.status_supported = True
    fake_llm.then(
        Reply(tool_calls=[_delegate("researcher", "What time is it? Use time_now.")]),  # the parent
        Reply(tool_calls=[("time_now", {})]),  # the sub-agent
        Reply("It is tea time."),  # the sub-agent's answer
        Reply("My helper says: it is tea time."),  # the parent's answer
    )
    event = mention("ask the researcher for the time")
    await gateway.send_event(event)
    await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()

    parent, sub, sub_again, parent_again = fake_llm.requests
    assert "delegate" in _tools(parent)  # the default agent has it: bot.toml defines other agents
    assert _tools(sub) == RESEARCHER_TOOLS == _tools(sub_again)  # intersected, no delegate (depth 1)
    assert _system(sub).startswith("You research things carefully.") and "sub-agent" in _system(sub)
    assert [m["content"] for m in sub["messages"] if m["role"] == "user"] == ["What time is it? Use time_now."]
    assert _tool_results(parent_again) == ["It is tea time."]  # its answer is the tool result
    assert [c.params["text"] for c in fake_slack.posts()] == ["My helper says: it is tea time."]  # nothing else
    statuses = [str(c.params.get("status")) for c in fake_slack.of("assistant.threads.setStatus")]
    assert statuses == ["is thinking…", "is asking helper…", ""]  # the sub-agent's own tools are not shown

    # Its own stored transcript, in a reserved session, its turn finished.
    session = thread_session(TEAM_ID, "C1", event["ts"])
    [run] = await SubAgentStore(gateway.app.db).runs(session)
    assert (run.session_id, run.agent, run.status, run.answer) == (
        f"sub:{session}:1", "researcher", TurnStatus.FINISHED, "It is tea time.")
    history = await ConversationStore(gateway.app.db).history(run.session_id)
    assert (history[0].role, history[0].content) == ("user", "What time is it? Use time_now.")
    assert history[-1].content == "It is tea time." and "time_now" in history[1].tool_names
    assert f"Sub-agents: researcher (sub:{session}:1) finished." in await _status(gateway, session)


async def test_delegate_is_offered_only_where_there_is_another_agent(
    agents_settings: Callable[..., Settings], make_settings: Callable[..., Settings], start_gateway: Any,
    tmp_path: Path,
) -> None:
    alone: GatewayClient = await start_gateway(make_settings(bot_home=tmp_path / "alone"))
    assert alone.app.dispatcher.runner.tools.get("delegate") is None  # no bot.toml: one agent, nothing to delegate

    gateway: GatewayClient = await start_gateway(agents_settings())
    tools, agents = gateway.app.dispatcher.runner.tools, gateway.app.dispatcher.agents
    names = {name: [t.name for t in tools.allowed(agents.get(name).tools)] for name in agents.names()}
    assert "delegate" in names["default"] and "delegate" in names["researcher"]  # the default, and one naming it
    assert "delegate" not in names["writer"]  # tools = "*" (the default) does not hand it out


async def test_an_unknown_agent_or_itself_is_an_error_naming_the_agents(
    agents_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    gateway: GatewayClient = await start_gateway(agents_settings())
    fake_llm.then(Reply(tool_calls=[_delegate("nobody", "x"), _delegate("default", "y")]), Reply("ok"))
    await gateway.send_event(mention("delegate badly"))
    await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()
    unknown, itself = _tool_results(fake_llm.requests[-1])
    assert unknown == ("error: cannot delegate to no agent named 'nobody'; "
                       "the agents available are: researcher, writer")
    assert itself == "error: cannot delegate to yourself; the agents available are: researcher, writer"
    assert len(fake_llm.requests) == 2  # no sub-agent ran


# -- a sub-agent asks no one --------------------------------------------------------------------------


async def test_a_sub_agents_gated_call_and_credential_request_fail_at_once_and_nothing_is_posted(
    agents_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    # An admin's turn (a trusted sender, whatever the fake's users.info says): the call is refused as a sub-agent's.
    gateway: GatewayClient = await start_gateway(agents_settings(bot_admins="U1"))
    fake_llm.then(
        Reply(tool_calls=[_delegate("researcher", "check the disk")]),
        Reply(tool_calls=[("shell_run", {"command": "df -h"}),
                          ("credential_request", {"name": "github.token", "reason": "to look"})]),
        Reply("I could not: nobody can be asked from here."),
        Reply("The helper could not check."),
    )
    await gateway.send_event(mention("check the disk through the researcher"))
    await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()
    gated, credential = _tool_results(fake_llm.requests[2])
    assert SUBAGENT_CANNOT_ASK in gated and gated.startswith("error: `shell_run` needs a person's approval")
    assert SUBAGENT_CANNOT_ASK in credential and credential.startswith("error: github.token is not stored")
    assert [c.params["text"] for c in fake_slack.posts()] == ["The helper could not check."]  # no card, no form
    assert fake_slack.of("chat.postEphemeral") == []
    async with gateway.app.db.read() as s:  # nothing was parked either
        assert (await s.exec(select(ApprovalRow))).all() == []
        assert (await s.exec(select(CredentialRequestRow))).all() == []


async def test_a_budget_that_would_park_fails_a_sub_agent_at_once_and_counts_in_the_parent_thread(
    agents_settings: Callable[..., Settings], start_gateway: Any
) -> None:
    gateway: GatewayClient = await start_gateway(agents_settings(thread_token_budget=1_000))
    budget = gateway.app.dispatcher.runner.budget
    assert budget is not None
    await ConversationStore(gateway.app.db).ensure_session(SessionInfo(
        id="slack:T1:C1:1.0", channel="slack", agent="default", status=SessionStatus.IDLE, reply_ref={}),
        gateway.app.dispatcher.clock.now())
    await budget.spend("sub:slack:T1:C1:1.0:1", 1_500)  # a sub-agent's tokens are its parent thread's
    assert await budget.status("slack:T1:C1:1.0") == "1,500 of 1,000 tokens of its budget used"
    ctx = ToolContext(session_id="sub:slack:T1:C1:1.0:1", turn_id=1, agent="researcher", sender="U1",
                      interactive=False, subagent=True)
    with pytest.raises(BudgetExhausted, match=SUBAGENT_CANNOT_ASK):
        await budget.before_call(ctx)


# -- caps, stop ----------------------------------------------------------------------------------------


async def test_past_max_subagents_per_turn_a_delegate_call_waits_for_a_slot(
    agents_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    gateway: GatewayClient = await start_gateway(agents_settings(max_subagents_per_turn=1))
    first = Gate(Reply("first done"))
    fake_llm.then(Reply(tool_calls=[_delegate("researcher", "one"), _delegate("writer", "two")]), first,
                  Reply("second done"), Reply("both done"))
    event = mention("two helpers")
    await gateway.send_event(event)
    await asyncio.wait_for(first.reached.wait(), 10)
    engine = _subagents(gateway)
    await until(lambda: sum(s.users for s in engine._slots.values()) == 2, what="the second call waits")
    session = thread_session(TEAM_ID, "C1", event["ts"])
    assert [r.agent for r in await engine.store.runs(session)] == ["researcher"]  # the other has not started
    assert len(fake_llm.requests) == 2

    first.opened.set()
    await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()
    assert _tool_results(fake_llm.requests[-1]) == ["first done", "second done"]  # in call order
    runs = await engine.store.runs(session)
    assert [(r.agent, r.status) for r in runs] == [("researcher", "finished"), ("writer", "finished")]
    assert _system(fake_llm.requests[2]).startswith("You write things.")
    assert engine._slots == {}


async def test_stopping_the_parent_stops_its_sub_agents_and_those_waiting(
    agents_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    gateway: GatewayClient = await start_gateway(agents_settings(max_subagents_per_turn=1))
    held = Gate(Reply("never used"))
    fake_llm.then(Reply(tool_calls=[_delegate("researcher", "one"), _delegate("writer", "two")]), held)
    event = mention("two slow helpers")
    await gateway.send_event(event)
    await asyncio.wait_for(held.reached.wait(), 10)
    engine = _subagents(gateway)
    await until(lambda: sum(s.users for s in engine._slots.values()) == 2, what="the second call waits")

    await gateway.send_event(mention("stop", thread_ts=event["ts"]))
    await gateway.idle()
    held.opened.set()  # the fake model's held request ends (its caller is gone)
    session = thread_session(TEAM_ID, "C1", event["ts"])
    runs = await engine.store.runs(session)
    assert [(r.agent, r.status, r.error) for r in runs] == [
        ("researcher", "cancelled", "stopped with its parent's turn")]  # the waiting one never started
    assert engine._slots == {}
    assert len(fake_llm.requests) == 2
    assert await gateway.app.dispatcher.conversations.running_turn(session) is None
    assert f"researcher (sub:{session}:1) stopped" in await _status(gateway, session)


async def test_a_sub_agent_s_commands_run_in_its_parent_agent_s_work_folder(
    make_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    tmp_path: Path,
) -> None:
    """A sub-agent works for its parent, with the parent agent's credentials and grants: what it leaves is in the
    parent agent's work folder (``$BOT_HOME/work/default``), not the helper's."""
    config = tmp_path / "bot.toml"
    config.write_text(AGENTS + '\n[[policies]]\ntool = "shell_run"\nmatch = "touch from-*"\naction = "allow"\n',
                      encoding="utf-8")
    gateway: GatewayClient = await start_gateway(make_settings(bot_config=config))
    fake_llm.then(
        Reply(tool_calls=[_delegate("researcher", "leave a note")]),  # the parent
        Reply(tool_calls=[("shell_run", {"command": "touch from-helper"})]),  # the sub-agent, allowed by the rule
        Reply("left it"), Reply("my helper left a note"),
    )
    await gateway.send_event(mention("ask the researcher for a note"))
    await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()
    work = tmp_path / "home" / "work"
    assert (work / "default" / "from-helper").exists()
    assert not (work / "researcher").exists()


# -- settings -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "value"), [
    ("max_subagents_per_turn", "0"), ("max_subagents_per_turn", "-1"), ("max_subagents_per_turn", "1.5"),
    ("max_subagents_per_turn", "65"), ("subagent_max_steps", "0"), ("subagent_max_steps", "ten"),
    ("subagent_max_steps", "201"),
])
def test_invalid_caps_are_refused(name: str, value: str) -> None:
    with pytest.raises(SettingsError, match=name.upper()):
        load_settings(env_file=None, **{name: value})


def test_the_caps_default_to_four_and_ten() -> None:
    settings = load_settings(env_file=None)
    assert (settings.max_subagents_per_turn, settings.subagent_max_steps) == (4, 10)


async def test_the_bot_refuses_to_start_with_an_invalid_cap(tmp_path: Path) -> None:
    code, out = await run_to_exit(tmp_path, {"MAX_SUBAGENTS_PER_TURN": "0", "PORT": "0"})
    assert code != 0 and "MAX_SUBAGENTS_PER_TURN (got '0')" in out


# -- crash -------------------------------------------------------------------------------------------


async def test_a_sub_agent_interrupted_by_a_crash_is_reported_to_the_parent_and_never_re_run(
    tmp_path: Path, unused_port: int, fake_slack: FakeSlack, fake_llm: FakeLLM, database_url: str | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if database_url:
        monkeypatch.setenv("BOT_PROCESS_DATABASE_URL", database_url)
    (tmp_path / "bot.toml").write_text(AGENTS, encoding="utf-8")
    env = slack_env(fake_slack, fake_llm, unused_port)
    held = Gate(Reply("never seen"))
    fake_llm.then(Reply(tool_calls=[_delegate("researcher", "a long look")]), held)
    event = mention("ask the researcher")
    bot = await BotProcess(tmp_path, env).start()
    await send_event(bot, event, "EvSub")
    await asyncio.wait_for(held.reached.wait(), 10)
    await bot.kill()  # the sub-agent is waiting for the model

    fake_llm.then(Reply("The helper was interrupted; here is what I know."))
    bot = await BotProcess(tmp_path, env).start()
    try:
        async with asyncio.timeout(20):
            while not fake_slack.posts():
                await fake_slack.wait_for("chat.postMessage")
        assert [c.params["text"] for c in fake_slack.posts()] == ["The helper was interrupted; here is what I know."]
        after = fake_llm.requests[2:]
        assert len(after) == 1 and not _system(after[0]).startswith("You research")  # the sub-agent: not again
        [result] = _tool_results(after[0])
        assert result.startswith("error: the sub-agent researcher (sub:") and \
            "was interrupted (the bot restarted) and was not re-run" in result
    finally:
        held.opened.set()  # the dead process's request to the fake model ends
        assert await bot.terminate() == 0
    db = Database(database_url or f"sqlite:///{tmp_path / '.bot' / 'bot.db'}")
    try:
        session = thread_session(TEAM_ID, "C1", event["ts"])
        [run] = await SubAgentStore(db).runs(session)
        assert (run.session_id, run.status, run.error) == (f"sub:{session}:1", TurnStatus.FAILED, INTERRUPTED)
    finally:
        await db.close()


async def test_a_turn_runs_at_most_max_runs_per_turn_sub_agents_in_all(
    agents_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(subagents, "MAX_RUNS_PER_TURN", 2)
    gateway: GatewayClient = await start_gateway(agents_settings(max_subagents_per_turn=1))
    fake_llm.then(Reply(tool_calls=[_delegate("writer", "one"), _delegate("writer", "two")]), Reply("1"), Reply("2"),
                  Reply(tool_calls=[_delegate("writer", "three")]), Reply("done"))
    event = mention("fan out")
    await gateway.send_event(event)
    await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()
    assert _tool_results(fake_llm.requests[-1])[-1].startswith("error: this turn already ran 2 sub-agents")
    session = thread_session(TEAM_ID, "C1", event["ts"])
    assert len(await SubAgentStore(gateway.app.db).runs(session)) == 2


async def test_a_sub_agent_never_borrows_the_credentials_of_the_agent_it_runs(
    agents_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    gateway: GatewayClient = await start_gateway(agents_settings())
    # A value only the researcher holds: run as the default agent's sub-agent, it is not the researcher's to use.
    await gateway.app.credentials.set_secret("research.token", "r3search-value-1", scope="agent",
                                             agent="researcher", by="operator")
    fake_llm.then(Reply(tool_calls=[_delegate("researcher", "use research.token")]),
                  Reply(tool_calls=[("credential_request", {"name": "research.token", "reason": "to look"})]),
                  Reply("I do not have it."), Reply("The helper had no token."))
    await gateway.send_event(mention("ask the researcher"))
    await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()
    [result] = _tool_results(fake_llm.requests[2])
    assert SUBAGENT_CANNOT_ASK in result and "already stored" not in result
