"""Scheduled sessions: created by the model, approved twice, fired by APScheduler into a channel."""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import pytest

from tests.conftest import GatewayClient
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.slack_api import Failure, FakeSlack
from tests.slack_requests import block_action, command_body, mention


def _buttons(call: Any) -> list[dict[str, Any]]:
    return call.params["blocks"][-1]["elements"]


def _posts_to(fake_slack: FakeSlack, channel: str) -> list[Any]:
    return [c for c in fake_slack.posts() if c.params.get("channel") == channel]


async def _wait_posts(fake_slack: FakeSlack, channel: str, count: int, timeout: float = 15) -> list[Any]:
    async with asyncio.timeout(timeout):
        while len(_posts_to(fake_slack, channel)) < count:
            await fake_slack.wait_for("chat.postMessage", len(fake_slack.posts()) + 1, timeout)
    return _posts_to(fake_slack, channel)


@pytest.fixture
async def scheduling(make_settings: Any, start_gateway: Any) -> GatewayClient:
    client: GatewayClient = await start_gateway(make_settings(schedule_min_interval_s=1, bot_admins="UADMIN"))
    return client


async def _create_active(gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM, every: int = 1) -> None:
    fake_llm.then(Reply(tool_calls=[("schedule_create", {"prompt": "say hi", "every_seconds": every,
                                                         "destination": "#acc-dest"})]))
    await gateway.send_event(mention("every second post hi to #acc-dest"))
    tool_approval = (await fake_slack.wait_for("chat.postMessage"))[0]
    assert "schedule_create" in json.dumps(tool_approval.params["blocks"])
    fake_llm.then(Reply("Scheduled; waiting for the destination approval."))
    await gateway.interact(block_action("approval:approve", _buttons(tool_approval)[0]["value"]))
    posts = await fake_slack.wait_for("chat.postMessage", 3)
    destination = next(p for p in posts if "schedule_destination" in json.dumps(p.params.get("blocks")))
    assert "#acc-dest" in json.dumps(destination.params["blocks"])
    assert "becomes active once someone approves" in fake_llm.requests[1]["messages"][-1]["content"]
    pending = await gateway.app.schedules.list()
    assert pending and pending[0].status == "pending_destination"
    await gateway.interact(block_action("approval:approve", _buttons(destination)[0]["value"]))


async def test_a_schedule_fires_into_its_channel_and_obeys_pause_resume_cancel(
    scheduling: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    gateway = scheduling
    await _create_active(gateway, fake_slack, fake_llm)
    firings = await _wait_posts(fake_slack, "CACC", 3)
    assert all(p.params["text"] == "echo: say hi" for p in firings)
    assert all(not p.params.get("thread_ts") for p in firings)  # top-level messages
    gaps = [b.at - a.at for a, b in itertools.pairwise(firings)]
    assert all(0.5 < gap < 2.5 for gap in gaps), gaps
    notices = [p.params["text"] for p in fake_slack.posts() if "Schedule 1 is active" in p.params["text"]]
    assert notices

    denied = await gateway.interact(command_body("schedules pause 1", user="U9"))
    assert "only its creator or an admin" in await denied.text()
    paused = await gateway.interact(command_body("schedules pause 1", user="U1"))
    assert "paused" in await paused.text()
    count = len(_posts_to(fake_slack, "CACC"))
    await asyncio.sleep(1.6)
    assert len(_posts_to(fake_slack, "CACC")) <= count + 1  # at most one that was already running
    count = len(_posts_to(fake_slack, "CACC"))
    resumed = await gateway.interact(command_body("schedules resume 1", user="UADMIN"))
    assert "resumed" in await resumed.text()
    await _wait_posts(fake_slack, "CACC", count + 2)
    listing = await gateway.interact(command_body("schedules"))
    assert "every 1 s" in await listing.text() and "posted (ts" in await listing.text()
    cancelled = await gateway.interact(command_body("schedules cancel 1", user="U1"))
    assert "cancelled" in await cancelled.text()
    await asyncio.sleep(0.2)
    count = len(_posts_to(fake_slack, "CACC"))
    await asyncio.sleep(1.5)
    assert len(_posts_to(fake_slack, "CACC")) <= count + 1
    schedule = (await gateway.app.schedules.list())[0]
    assert schedule.status == "cancelled" and schedule.firings >= 5


async def test_two_failed_deliveries_tell_the_creator(
    scheduling: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    gateway = scheduling
    await _create_active(gateway, fake_slack, fake_llm)
    await _wait_posts(fake_slack, "CACC", 1)
    for _ in range(2):
        fake_slack.fail_next("chat.postMessage", Failure(error="not_in_channel"))
    async with asyncio.timeout(10):
        while not fake_slack.of("conversations.open"):
            await asyncio.sleep(0.05)
    dm = await _wait_posts(fake_slack, "DU1", 1)
    assert "failed twice in a row" in dm[0].params["text"] and "not_in_channel" in dm[0].params["text"]
    schedule = (await gateway.app.schedules.list())[0]
    assert "failed" in (schedule.last_outcome or "") or schedule.failures == 0
    await gateway.app.schedules.change(schedule.id or 0, "cancel", by="U1")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({"cron": "61 * * * *"}, "invalid cron"),
        ({"cron": "* * *"}, "5 fields"),
        ({"every_seconds": 10, "timezone": "Mars/Olympus"}, "unknown timezone"),
        ({"at": "2001-01-01T00:00:00"}, "in the past"),
        ({"at": "next tuesday"}, "ISO 8601"),
        ({"every_seconds": 10, "cron": "* * * * *"}, "exactly one"),
        ({"every_seconds": 10, "destination": "#nowhere"}, "no channel #nowhere"),
        ({"every_seconds": 10, "destination": "#outside"}, "invite it there first"),
    ],
)
async def test_bad_schedules_are_refused_and_nothing_is_stored(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, args: dict[str, Any],
    expected: str,
) -> None:
    gateway = await start_gateway(make_settings(schedule_min_interval_s=5))
    call = {"prompt": "p", "destination": "#acc-dest", **args}
    fake_llm.then(Reply(tool_calls=[("schedule_create", call)]), Reply("ok"))
    await gateway.send_event(mention("schedule it"))
    approval = (await fake_slack.wait_for("chat.postMessage"))[0]
    await gateway.interact(block_action("approval:approve", _buttons(approval)[0]["value"]))
    await fake_slack.wait_for("chat.postMessage", 2)
    result = fake_llm.requests[1]["messages"][-1]["content"]
    assert result.startswith("error:") and expected in result, result
    assert await gateway.app.schedules.list() == []


async def test_interval_floor_and_slash_command(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    gateway = await start_gateway(make_settings(schedule_min_interval_s=60))
    floor = await gateway.interact(command_body("schedule every 30s #acc-dest post the time"))
    assert "Not scheduled: every_seconds must be at least 60" in await floor.text()
    made = await gateway.interact(command_body("schedule every 2m #acc-dest post the time"))
    assert "Schedule 1 created (every 120 s" in await made.text()
    approval = (await fake_slack.wait_for("chat.postMessage"))[0]
    assert approval.params["channel"] == "C1" and not approval.params.get("thread_ts")
    await gateway.interact(block_action("approval:deny", _buttons(approval)[0]["value"]))
    from tests.slack_requests import view_submission

    await gateway.interact(view_submission("approval_deny", _buttons(approval)[0]["value"], {}))
    await fake_slack.wait_for("chat.postMessage", 2)
    assert "was not started" in fake_slack.posts()[1].params["text"]
    assert (await gateway.app.schedules.list())[0].status == "cancelled"
