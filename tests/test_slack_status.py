"""A working turn's sign in Slack (issue 15): the thread's status line (assistant.threads.setStatus) says
what the turn does and is cleared at its end; a workspace that refuses it gets the :eyes: reaction."""

from __future__ import annotations

import asyncio

import pytest

from channels.slack import render
from tests.conftest import GatewayClient
from tests.fakes.llm import FakeLLM, Gate, Reply
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import mention


def _statuses(fake_slack: FakeSlack) -> list[str]:
    return [str(c.params.get("status")) for c in fake_slack.of("assistant.threads.setStatus")]


async def test_the_status_line_says_what_the_turn_does_and_is_cleared_at_its_end(
        gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    fake_slack.status_supported = True
    fake_llm.then(Reply(tool_calls=[("time_now", {})]), Reply(text="It is noon."))
    event = mention("what time is it?")
    await gateway.send_event(event)
    await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()
    assert _statuses(fake_slack) == ["is thinking…", "is running time_now…", ""]
    first = fake_slack.of("assistant.threads.setStatus")[0].params
    assert (first["channel_id"], first["thread_ts"]) == ("C1", event["ts"]) and first["loading_messages"]
    assert fake_slack.of("reactions.add") == []  # the status line is the sign


async def test_a_parked_turn_says_it_waits_for_approval(gateway: GatewayClient, fake_slack: FakeSlack,
                                                        fake_llm: FakeLLM) -> None:
    fake_slack.status_supported = True
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "uptime"})]))
    await gateway.send_event(mention("check uptime"))
    await fake_slack.wait_for("chat.postMessage")  # the approval card
    await fake_slack.wait_for("assistant.threads.setStatus", 2)
    assert _statuses(fake_slack) == ["is thinking…", "is waiting for approval…"]


async def test_a_workspace_that_refuses_the_status_line_gets_reactions_and_is_not_asked_again(
        gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    first = mention("one")
    await gateway.send_event(first)
    await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()
    second = mention("two")
    await gateway.send_event(second)
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    assert len(fake_slack.of("assistant.threads.setStatus")) == 1  # refused once, remembered
    assert [c.params["timestamp"] for c in fake_slack.of("reactions.add")] == [first["ts"], second["ts"]]
    assert len(fake_slack.of("reactions.remove")) == 2


async def test_the_approval_status_names_who_is_asked_in_plain_text(
        gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    fake_slack.status_supported = True
    fake_slack.names = {"U1": "alice", "U2": "<!channel> \u202eevil\u200b"}
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "uptime"})]))
    await gateway.send_event(mention("check uptime"))  # approvers: the requester (U1)
    await fake_slack.wait_for("assistant.threads.setStatus", 2)
    assert _statuses(fake_slack)[-1] == "is waiting for approval from @alice…"
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "uptime"})]))
    await gateway.send_event(mention("check it again", user="U2"))
    await fake_slack.wait_for("assistant.threads.setStatus", 4)
    assert _statuses(fake_slack)[-1] == "is waiting for approval from @!channel evil…"  # nothing to mention or hide



async def test_a_long_turn_says_its_status_again_before_slack_drops_it(
        gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(render, "STATUS_REFRESH_S", 0.05)  # Slack drops a status after 2 minutes
    fake_slack.status_supported = True
    gate = Gate(Reply("done at last"))
    fake_llm.then(gate)
    await gateway.send_event(mention("a long one"))
    await asyncio.wait_for(gate.reached.wait(), 5)
    await fake_slack.wait_for("assistant.threads.setStatus", 4)
    assert set(_statuses(fake_slack)) == {"is thinking…"}
    gate.opened.set()
    await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()
    assert _statuses(fake_slack)[-1] == ""
    cleared = len(fake_slack.of("assistant.threads.setStatus"))
    await asyncio.sleep(0.2)
    assert len(fake_slack.of("assistant.threads.setStatus")) == cleared  # nothing said after the end
