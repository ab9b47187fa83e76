"""Gated tool calls wait for Approve / Deny / Always allow in the Slack thread (SPEC §7)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from tests.conftest import GatewayClient
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.slack_api import Call, FakeSlack
from tests.slack_requests import block_action, command_body, mention, view_submission


async def _ask_for(gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM, command: str,
                   channel: str = "C1", posts_before: int = 0) -> tuple[dict[str, Any], Call, str]:
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": command})]))
    root = mention("please run it", channel=channel)
    await gateway.send_event(root)
    posts = await fake_slack.wait_for("chat.postMessage", posts_before + 1)
    request = posts[posts_before]
    buttons = request.params["blocks"][-1]["elements"]
    return root, request, buttons[0]["value"]


async def _told(fake_slack: FakeSlack, user: str, count: int = 1) -> list[str]:
    """What the user was told privately, once ``count`` ephemeral messages exist in all."""
    await fake_slack.wait_for("chat.postEphemeral", count)
    return fake_slack.ephemerals(user)


def _updates(fake_slack: FakeSlack) -> list[str]:
    return [json.dumps(c.params["blocks"]) for c in fake_slack.of("chat.update")]


async def test_approver_click_runs_the_command_once(
    gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    root, request, request_id = await _ask_for(gateway, fake_slack, fake_llm, "echo hello-from-shell")
    blocks = request.params["blocks"]
    assert request.params["thread_ts"] == root["ts"]
    assert [b["text"]["text"] for b in blocks[-1]["elements"]] == [
        "Approve", "Deny", "Always allow", "Allow in this thread", "Edit"]
    assert {b["value"] for b in blocks[-1]["elements"]} == {request_id}  # only the id
    assert "echo hello-from-shell" in json.dumps(blocks) and "<@U1>" in json.dumps(blocks)

    # Someone who may not approve (approvers default to the requester) is refused, privately.
    await gateway.interact(block_action("approval:approve", request_id, user="U9"))
    assert "can't approve" in (await _told(fake_slack, "U9"))[0]
    assert len(fake_llm.requests) == 1 and fake_slack.of("chat.update") == []

    fake_llm.then(Reply("The shell said hello."))
    resp = await gateway.interact(block_action("approval:approve", request_id, user="U1"))
    assert resp.status == 200
    posts = await fake_slack.wait_for("chat.postMessage", 2)
    assert posts[1].params["text"] == "The shell said hello."
    tool_result = fake_llm.requests[1]["messages"][-1]
    assert tool_result["role"] == "tool" and "exit code 0" in tool_result["content"]
    assert "hello-from-shell" in tool_result["content"]
    await gateway.idle()
    assert "Approved by <@U1>" in _updates(fake_slack)[0] and '"actions"' not in _updates(fake_slack)[0]

    # A double click, or a second approver, changes nothing and runs nothing.
    await gateway.interact(block_action("approval:approve", request_id, user="U1"))
    await gateway.interact(block_action("approval:always", request_id, user="U1"))
    told = await _told(fake_slack, "U1", 3)
    assert told == ["Already settled: Approved by U1."] * 2
    assert len(fake_llm.requests) == 2 and len(fake_slack.of("chat.update")) == 1


async def test_deny_without_a_reason_never_runs_the_tool(
    gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    marker = tmp_path / "home" / "work" / "default" / "ran"
    _root, _request, request_id = await _ask_for(gateway, fake_slack, fake_llm, "touch ran")
    await gateway.interact(block_action("approval:deny", request_id, user="U1"))
    opened = await fake_slack.wait_for("views.open")
    view = opened[0].params["view"]
    view = json.loads(view) if isinstance(view, str) else view
    assert view["private_metadata"] == request_id
    fake_llm.then(Reply("Understood, I won't."))
    await gateway.interact(view_submission("approval_deny", request_id, {"reason": {"text": {"value": ""}}}))
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    told = fake_llm.requests[1]["messages"][-1]["content"]
    assert told == "error: the user denied `shell_run`: no reason given; do not retry it; continue without it"
    assert not marker.exists()
    assert "Denied by <@U1>" in _updates(fake_slack)[0]


async def test_deny_with_a_reason_reaches_the_model(
    gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    _root, _request, request_id = await _ask_for(gateway, fake_slack, fake_llm, "reboot")
    await gateway.interact(block_action("approval:deny", request_id, user="U1"))
    await fake_slack.wait_for("views.open")
    await gateway.interact(view_submission("approval_deny", request_id,
                                           {"reason": {"text": {"value": "not during the freeze"}}}))
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    assert "not during the freeze; do not retry it" in fake_llm.requests[1]["messages"][-1]["content"]
    assert "Denied by <@U1>: not during the freeze" in _updates(fake_slack)[0]


async def test_timeout_settles_as_expired(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    gateway = await start_gateway(make_settings(approval_timeout_s=0.3, approval_poll_s=0.05))
    _root, _request, request_id = await _ask_for(gateway, fake_slack, fake_llm, "sleep 1")
    await fake_slack.wait_for("chat.update")
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    assert "Expired" in _updates(fake_slack)[0]
    told = fake_llm.requests[1]["messages"][-1]["content"]
    assert told.startswith("expired: nobody decided within 0.3 seconds") and "denied" not in told
    await gateway.interact(block_action("approval:approve", request_id, user="U1"))  # too late
    assert "Already settled: Expired" in (await _told(fake_slack, "U1"))[0]
    assert len(fake_llm.requests) == 2


async def test_stop_cancels_a_pending_request(
    gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    _root, _request, request_id = await _ask_for(gateway, fake_slack, fake_llm, "rm -rf /tmp/x")
    await gateway.interact(command_body("stop"))
    await fake_slack.wait_for("chat.update")
    await gateway.idle()
    assert "Cancelled" in _updates(fake_slack)[0]
    await gateway.interact(block_action("approval:approve", request_id, user="U1"))
    assert "Already settled: Cancelled" in (await _told(fake_slack, "U1"))[0]
    assert len(fake_llm.requests) == 1  # nothing ran, the turn is over


async def test_always_allow_grants_until_revoked(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    gateway = await start_gateway(make_settings(bot_admins="UADMIN"))
    _root, _request, request_id = await _ask_for(gateway, fake_slack, fake_llm, "uptime")
    fake_llm.then(Reply("first run done"))
    await gateway.interact(block_action("approval:always", request_id, user="U1"))
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    assert "Always allowed by <@U1>" in _updates(fake_slack)[0]

    # The same call later in that channel runs without asking.
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "uptime"})]), Reply("second run done"))
    await gateway.send_event(mention("again please"))
    posts = await fake_slack.wait_for("chat.postMessage", 3)
    assert posts[2].params["text"] == "second run done"
    # ...but not in another channel.
    await _ask_for(gateway, fake_slack, fake_llm, "uptime", channel="C2", posts_before=3)
    await gateway.interact(command_body("stop", channel="C2"))
    await fake_slack.wait_for("chat.update", 2)

    listing = await gateway.interact(command_body("approvals", user="UADMIN"))
    assert "may run `shell_run`" in await listing.text()
    refused = await gateway.interact(command_body("approvals revoke 1", user="U1"))
    assert "Only admins" in await refused.text()
    revoked = await gateway.interact(command_body("approvals revoke 1", user="UADMIN"))
    assert "revoked" in await revoked.text()
    before = len(fake_slack.posts())
    await _ask_for(gateway, fake_slack, fake_llm, "uptime", posts_before=before)  # asks again


async def test_user_group_approvers_are_resolved_through_slack(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    fake_slack.groups["S0OPS"] = ["U7"]
    gateway = await start_gateway(make_settings(bot_approvers="S0OPS"))
    _root, _request, request_id = await _ask_for(gateway, fake_slack, fake_llm, "uptime")
    await gateway.interact(block_action("approval:approve", request_id, user="U1"))  # the requester is not enough
    assert "can't approve" in (await _told(fake_slack, "U1"))[0]
    fake_llm.then(Reply("done"))
    await gateway.interact(block_action("approval:approve", request_id, user="U7"))
    await fake_slack.wait_for("chat.postMessage", 2)
    assert fake_slack.of("usergroups.users.list")[0].params["usergroup"] == "S0OPS"


async def test_unknown_buttons_and_bad_values_get_a_clear_answer(
    gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    for body in (block_action("something:else", "1"), block_action("approval:approve", "not-a-number"),
                 block_action("approval:approve", "999")):
        assert (await gateway.interact(body)).status == 200
    told = await _told(fake_slack, "U1", 3)
    assert told[0] == "I don't know that button; nothing was done."
    assert "does not belong to an approval request" in told[1]
    assert "does not exist" in told[2]
    assert fake_llm.requests == []


async def test_message_send_posts_to_a_channel_by_name(
    gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    fake_llm.then(Reply(tool_calls=[("message_send", {"channel": "#ops", "text": "deploy finished"})]))
    await gateway.send_event(mention("tell ops"))
    request = (await fake_slack.wait_for("chat.postMessage"))[0]
    fake_llm.then(Reply("told them"))
    await gateway.interact(block_action("approval:approve", request.params["blocks"][-1]["elements"][0]["value"]))
    posts = await fake_slack.wait_for("chat.postMessage", 3)
    assert (posts[1].params["channel"], posts[1].params["text"]) == ("COPS", "deploy finished")
    assert "posted to #ops" in fake_llm.requests[1]["messages"][-1]["content"]
    fake_llm.then(Reply(tool_calls=[("message_send", {"channel": "#nowhere", "text": "x"})]))
    await gateway.send_event(mention("tell nobody"))
    request = (await fake_slack.wait_for("chat.postMessage", 4))[3]
    fake_llm.then(Reply("no such channel"))
    await gateway.interact(block_action("approval:approve", request.params["blocks"][-1]["elements"][0]["value"]))
    await fake_slack.wait_for("chat.postMessage", 5)
    assert "no channel #nowhere" in fake_llm.requests[3]["messages"][-1]["content"]
    await asyncio.sleep(0)
