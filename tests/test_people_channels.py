"""Every decision about a person compares them with their channel: ``slack:U1`` (or a bare ``U1``) in the
settings is Slack's U1, and a person called ``U1`` on another channel (the test-only ``testchat``) is someone
else: no admin, no approver, no creator of Slack's schedules. Slack DMs the ``slack:`` people it is asked to
and never another channel's."""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bot.channels import installed_channels
from bot.settings import Settings
from core.connections.consent import Consent
from core.errors import NotAllowed, NotFound
from core.model import ScheduleStatus, SessionInfo, SessionStatus
from core.store.tables import ScheduleRow
from core.triggers import TriggerSpec
from tests.conftest import GatewayClient, connections_toml
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.oauth import FakeOAuth
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import block_action, mention

PLUGIN_DIR = Path(__file__).parent / "plugin_channel"


@pytest.fixture
def testchat(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The test channel installed, its person called U1 (an id of Slack's shape)."""
    sys.path.insert(0, str(PLUGIN_DIR))
    importlib.invalidate_caches()
    installed_channels.cache_clear()
    try:
        module = importlib.import_module("testchat")
        monkeypatch.setattr(module, "PERSON", "U1")
        yield module
    finally:
        sys.path.remove(str(PLUGIN_DIR))
        installed_channels.cache_clear()


async def _answered(channel: Any) -> Any:
    for _ in range(400):
        if channel.answers:
            return channel.answers[0]
        await asyncio.sleep(0.05)
    raise AssertionError("the test channel was never asked")


async def _testchat(make_settings: Any, start_gateway: Any, **values: Any) -> Any:
    gateway: GatewayClient = await start_gateway(make_settings(testchat_on=True, **values))
    return next(c for c in gateway.app.channels if c.name == "testchat")


async def test_a_slack_admin_s_id_on_another_channel_approves_nothing(
    testchat: Any, make_settings: Any, start_gateway: Any, fake_llm: FakeLLM
) -> None:
    channel = await _testchat(make_settings, start_gateway, bot_admins="slack:U1", bot_approvers="U1")
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo never"})]))
    await channel.say("run it")
    answer = await _answered(channel)
    assert not answer.won and answer.refused == "You can't approve this: you are not one of its approvers."
    assert answer.request.status == "pending"


async def test_a_slack_admin_s_id_on_another_channel_provides_no_credential(
    testchat: Any, make_settings: Any, start_gateway: Any, fake_llm: FakeLLM
) -> None:
    channel = await _testchat(make_settings, start_gateway, bot_admins="slack:U1", bot_approvers="U1")
    fake_llm.then(Reply(tool_calls=[("credential_request", {"name": "acc.token", "reason": "to call the API"})]))
    await channel.say("set up the ACC account")
    answer = await _answered(channel)
    assert not answer.stored and "not one of its approvers" in answer.message


async def test_slack_approvers_named_with_their_channel_get_dm_cards_and_decide(
    testchat: Any, make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    tmp_path: Path,
) -> None:
    """BOT_APPROVERS = slack:U7 (and another channel's U8): U7 gets a DM card and approves by a signed click;
    Slack's own U8 is not testchat's U8, and nobody but U7 is DMed."""
    config = tmp_path / "bot.toml"
    config.write_text('[[policies]]\ntool = "shell_run"\nnotify = ["thread", "dm"]\n')
    gateway: GatewayClient = await start_gateway(make_settings(bot_config=config,
                                                               bot_approvers="slack:U7,testchat:U8"))
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo approved"})]), Reply("done"))
    await gateway.send_event(mention("run it", user="U2"))
    posts = await fake_slack.wait_for("chat.postMessage", 2)
    assert [p.params["channel"] for p in posts[:2]] == ["DU7", "C1"]
    assert [c.params["users"] for c in fake_slack.of("conversations.open")] == ["U7"]
    request_id = posts[0].params["blocks"][-1]["elements"][0]["value"]
    await gateway.interact(block_action("approval:approve", request_id, user="U8"))  # Slack's U8: not named
    assert "can't approve" in (await fake_slack.wait_for("chat.postEphemeral"))[0].params["text"]
    await gateway.interact(block_action("approval:approve", request_id, user="U7"))
    await gateway.idle()
    approval = await gateway.app.gateway.approval(int(request_id))
    assert approval is not None and approval.status == "approved" and approval.decided_by == "U7"
    assert "approved" in json.dumps(fake_llm.requests[1]["messages"][-1]["content"])


async def test_a_schedule_is_changed_only_by_its_creator_and_admins_of_their_own_channel(
    testchat: Any, make_settings: Any, start_gateway: Any
) -> None:
    gateway: GatewayClient = await start_gateway(make_settings(bot_admins="slack:U1"))
    service, now = gateway.app.schedules, datetime.now(UTC)
    origin = SessionInfo(id="slack:T1:C1:1.1", channel="slack", agent="default", status=SessionStatus.IDLE,
                         reply_ref={"channel": "C1"}, place="slack:T1:C1")
    await service.conversations.ensure_session(origin, now)
    schedule = await service.store.add(ScheduleRow(
        prompt="say hi", trigger=TriggerSpec(every_seconds=3600).to_json(), destination="#acc-dest",
        destination_id="CACC", channel="slack", agent="default", creator="U2", status=ScheduleStatus.PAUSED,
        created_at=now, origin_session=origin.id))
    assert schedule.id is not None
    for user in ("U1", "U2"):  # testchat's U1 is not Slack's admin, nor its U2 Slack's creator
        with pytest.raises(NotAllowed):
            await gateway.app.gateway.change_schedule(schedule.id, "cancel", by=user, channel="testchat")
    assert (await service.list())[0].status == ScheduleStatus.PAUSED
    assert "cancelled" in await gateway.app.gateway.change_schedule(schedule.id, "cancel", by="U2", channel="slack")


async def test_a_shared_connection_is_neither_connected_nor_disconnected_by_another_channel_s_admin_id(
    testchat: Any, connected_settings: Callable[..., Settings], start_gateway: Any, oauth: FakeOAuth
) -> None:
    gateway: GatewayClient = await start_gateway(
        connected_settings(connections_toml(oauth, owner="shared"), bot_admins="slack:UADMIN"))
    assert gateway.app.connections is not None
    consent = Consent(gateway.app.connections, base_url=lambda: "http://127.0.0.1")
    assert await consent.may_complete("UADMIN", "", "slack")
    assert not await consent.may_complete("UADMIN", "", "testchat")
    with pytest.raises(NotAllowed):
        await gateway.app.gateway.disconnect("github", "UADMIN", channel="testchat")
    with pytest.raises(NotFound, match="no github connection shared"):  # Slack's admin may: nothing to revoke
        await gateway.app.gateway.disconnect("github", "UADMIN", channel="slack")
