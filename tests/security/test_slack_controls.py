"""Point 11: Slack listings show the current channel's items unless the user is an admin; `/bot stop`,
`/bot queue` and "@bot stop" / "@bot queue" belong to the requester, approvers and admins."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from core.model import SessionInfo
from tests.conftest import GatewayClient
from tests.fakes.llm import FakeLLM, Gate, Reply
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import command_body, mention

_GATES: list[Gate] = []


@pytest.fixture(autouse=True)
async def _open_gates(database_url: str | None, start_gateway: Any) -> Any:
    """A failed test must not leave a model call held (the gateway's teardown would wait for it).
    Asking for the database first keeps it until the gateways have stopped (teardown runs in reverse)."""
    yield
    for gate in _GATES:
        gate.opened.set()
    _GATES.clear()


@pytest.fixture
async def controlled(make_settings: Any, start_gateway: Any) -> GatewayClient:
    client: GatewayClient = await start_gateway(make_settings(bot_approvers="requester,UAPP", bot_admins="UADMIN"))
    return client


async def _busy(gateway: GatewayClient, fake_llm: FakeLLM, *, user: str = "U1",
                channel: str = "C1") -> tuple[dict[str, Any], Gate]:
    gate = Gate(Reply("finished"))
    _GATES.append(gate)
    fake_llm.then(gate)
    root = mention("deploy the thing", user=user, channel=channel)
    await gateway.send_event(root)
    await asyncio.wait_for(gate.reached.wait(), 5)
    return root, gate


async def _command(gateway: GatewayClient, text: str, *, user: str, channel: str = "C1") -> str:
    resp = await gateway.interact(command_body(text, user=user, channel=channel))
    assert resp.status == 200
    return await resp.text()


async def _running(gateway: GatewayClient, root: dict[str, Any]) -> bool:
    return await gateway.app.dispatcher.conversations.running_turn(f"slack:T1:{root['channel']}:{root['ts']}") \
        is not None


# -- stop -----------------------------------------------------------------------------------------


async def test_slash_stop_by_someone_else_leaves_the_turn_running(
    controlled: GatewayClient, fake_llm: FakeLLM, fake_slack: FakeSlack
) -> None:
    gateway = controlled
    root, gate = await _busy(gateway, fake_llm)
    answer = await _command(gateway, "stop", user="U9")
    assert "can't stop" in answer and "Stopped" not in answer
    await asyncio.sleep(0.05)
    assert await _running(gateway, root)
    gate.opened.set()
    posts = await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()
    assert [p.params["text"] for p in posts] == ["finished"]  # it ran to the end, nobody was told otherwise


@pytest.mark.parametrize("user", ["U1", "UAPP", "UADMIN"])
async def test_slash_stop_by_the_requester_an_approver_or_an_admin_stops_it(
    controlled: GatewayClient, fake_llm: FakeLLM, user: str
) -> None:
    gateway = controlled
    root, gate = await _busy(gateway, fake_llm)
    answer = await _command(gateway, "stop", user=user)
    assert "Stopped the running turn" in answer
    gate.opened.set()
    await gateway.idle()
    assert not await _running(gateway, root)
    history = await gateway.app.gateway.history(f"slack:T1:C1:{root['ts']}")
    assert history[-1].content == f"(stopped by {user})"


async def test_slash_stop_by_an_approver_in_a_group(
    make_settings: Any, start_gateway: Any, fake_llm: FakeLLM, fake_slack: FakeSlack
) -> None:
    gateway = await start_gateway(make_settings(bot_approvers="S0OPS"))
    fake_slack.groups["S0OPS"] = ["UGRP"]
    root, gate = await _busy(gateway, fake_llm)
    assert "can't stop" in await _command(gateway, "stop", user="U9")
    assert "Stopped the running turn" in await _command(gateway, "stop", user="UGRP")
    gate.opened.set()
    await gateway.idle()
    assert not await _running(gateway, root)


async def test_mention_stop_in_the_thread_follows_the_same_rule(
    controlled: GatewayClient, fake_llm: FakeLLM, fake_slack: FakeSlack
) -> None:
    gateway = controlled
    root, gate = await _busy(gateway, fake_llm)
    await gateway.send_event(mention("stop", thread_ts=root["ts"], user="U9"))
    refusal = await fake_slack.wait_for("chat.postMessage")
    assert "can't stop" in refusal[0].params["text"]
    assert await _running(gateway, root)
    await gateway.send_event(mention("stop", thread_ts=root["ts"], user="U1"))
    stopped = await fake_slack.wait_for("chat.postMessage", 2)
    assert "Stopped the running turn" in stopped[1].params["text"]
    gate.opened.set()
    await gateway.idle()
    assert not await _running(gateway, root)
    assert len(fake_slack.posts()) == 2  # no answer after the stop


# -- queue mode -----------------------------------------------------------------------------------


async def test_slash_queue_by_a_random_user_is_refused(
    controlled: GatewayClient, fake_llm: FakeLLM
) -> None:
    gateway = controlled
    idle = await _command(gateway, "queue collect", user="U9", channel="C5")  # nothing busy there
    assert "can't change" in idle and "now collect" not in idle
    root, gate = await _busy(gateway, fake_llm)
    busy = await _command(gateway, "queue followup", user="U9")
    assert "can't change" in busy and "now followup" not in busy
    control = gateway.app.dispatcher.control
    assert await control.get("queue_mode:slack:T1:C1") is None
    assert await control.get("queue_mode:slack:T1:C5") is None
    assert "now collect" in await _command(gateway, "queue collect", user="U1")  # the requester of the busy turn
    assert "now followup" in await _command(gateway, "queue followup", user="UADMIN", channel="C5")
    assert await control.get("queue_mode:slack:T1:C1") == "collect"
    gate.opened.set()
    await gateway.idle()
    assert await _running(gateway, root) is False


async def test_mention_queue_in_someone_elses_thread_is_refused(
    controlled: GatewayClient, fake_llm: FakeLLM, fake_slack: FakeSlack
) -> None:
    gateway = controlled
    root, gate = await _busy(gateway, fake_llm)
    session = f"slack:T1:C1:{root['ts']}"
    await gateway.send_event(mention("queue followup", thread_ts=root["ts"], user="U9"))
    refusal = await fake_slack.wait_for("chat.postMessage")
    assert "can't change" in refusal[0].params["text"]
    assert await gateway.app.dispatcher.queue_mode(session) == "steer"
    await gateway.send_event(mention("queue followup", thread_ts=root["ts"], user="U1"))
    await fake_slack.wait_for("chat.postMessage", 2)
    assert await gateway.app.dispatcher.queue_mode(session) == "followup"
    gate.opened.set()
    await gateway.idle()
    # Once the turn is over, the thread is still U1's: U9 cannot change it either.
    await gateway.send_event(mention("queue collect", thread_ts=root["ts"], user="U9"))
    await fake_slack.wait_for("chat.postMessage", 4)
    assert await gateway.app.dispatcher.queue_mode(session) == "followup"


# -- listings -------------------------------------------------------------------------------------


async def _schedule_from(gateway: GatewayClient, fake_slack: FakeSlack, channel: str, prompt: str,
                         destination: str = "#acc-dest") -> None:
    app = gateway.app
    origin = SessionInfo(id=f"slack:T1:{channel}:1.000009", channel="slack", agent=app.dispatcher.agents.default.name,
                         status="idle", reply_ref={"channel": channel, "thread_ts": "1.000009"},
                         place=f"slack:T1:{channel}")
    count = len(fake_slack.posts())
    await app.schedules.create(prompt=prompt, trigger=_every_hour(), destination=destination, agent=origin.agent,
                               creator="U1", origin=origin, channel="slack")
    await fake_slack.wait_for("chat.postMessage", count + 1)  # the destination approval card


def _every_hour() -> Any:
    from core.triggers import TriggerSpec

    return TriggerSpec(every_seconds=3600)


async def test_slash_schedules_lists_only_this_channels_schedules(
    controlled: GatewayClient, fake_slack: FakeSlack
) -> None:
    gateway = controlled
    await _schedule_from(gateway, fake_slack, "C1", "prompt-from-c1")  # origin C1, destination CACC
    await _schedule_from(gateway, fake_slack, "C2", "prompt-from-c2", destination="#general")  # origin C2, dest CGEN
    in_c2 = await _command(gateway, "schedules", user="U2", channel="C2")
    assert "#acc-dest" not in in_c2 and "#general" in in_c2
    in_c3 = await _command(gateway, "schedules", user="U2", channel="C3")
    assert "#acc-dest" not in in_c3 and "#general" not in in_c3
    in_c1 = await _command(gateway, "schedules", user="U2", channel="C1")
    assert "#acc-dest" in in_c1 and "#general" not in in_c1
    at_destination = await _command(gateway, "schedules", user="U2", channel="CACC")
    assert "#acc-dest" in at_destination and "#general" not in at_destination
    admin = await _command(gateway, "schedules", user="UADMIN", channel="C3")
    assert "#acc-dest" in admin and "#general" in admin


async def test_schedule_list_tool_from_another_channel_does_not_show_them(
    controlled: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    gateway = controlled
    await _schedule_from(gateway, fake_slack, "C1", "prompt-from-c1")
    posts = len(fake_slack.posts())
    fake_llm.then(Reply(tool_calls=[("schedule_list", {})]), Reply("listed"))
    await gateway.send_event(mention("list the schedules", channel="C2", user="U2"))
    await fake_slack.wait_for("chat.postMessage", posts + 1)
    await gateway.idle()
    result = fake_llm.requests[1]["messages"][-1]
    assert result["role"] == "tool" and "prompt-from-c1" not in result["content"]
    assert "no schedules" in result["content"]

    fake_llm.then(Reply(tool_calls=[("schedule_list", {})]), Reply("listed"))
    await gateway.send_event(mention("list the schedules", channel="C1", user="U2"))
    await fake_slack.wait_for("chat.postMessage", posts + 2)
    await gateway.idle()
    assert "prompt-from-c1" in fake_llm.requests[3]["messages"][-1]["content"]

    fake_llm.then(Reply(tool_calls=[("schedule_list", {})]), Reply("listed"))
    await gateway.send_event(mention("list the schedules", channel="C7", user="UADMIN"))
    await fake_slack.wait_for("chat.postMessage", posts + 3)
    await gateway.idle()
    assert "prompt-from-c1" in fake_llm.requests[5]["messages"][-1]["content"]
