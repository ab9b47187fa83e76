"""Second attack review of issue 33 (channel plug-ins, people compared with their channel, one request lifecycle).

An outsider on another chat channel whose id collides with a Slack user's (a plug-in channel's "U1") must not
reach what belongs to Slack's U1. Decisions compare the channel; personal OAuth connections are still keyed by the
bare sender id (the closing note says so). Found: another channel's "U1" acted through Slack U1's personal GitHub
account (the resource got Slack U1's bearer token), listed it and disconnected (revoked) it. Fixed: a person whose
bare id another channel claims holds no personal accounts (``ConnectionService.holds_accounts``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from bot.settings import Settings
from core.errors import NotFound
from tests.conftest import GatewayClient
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.oauth import FakeOAuth
from tests.fakes.slack_api import FakeSlack
from tests.test_connections import call, connect_first
from tests.test_people_channels import _answered, testchat

_ = testchat


async def _slack_u1_connected_and_testchat(connected_settings: Callable[..., Settings], start_gateway: Any,
                                           fake_slack: FakeSlack, fake_llm: FakeLLM, oauth: FakeOAuth
                                           ) -> tuple[GatewayClient, Any]:
    gateway: GatewayClient = await start_gateway(connected_settings(testchat_on=True))
    await connect_first(gateway, fake_slack, fake_llm, oauth, user="U1")  # Slack's U1 connects their GitHub
    assert [c.name for c in await gateway.app.gateway.connections_of("U1")] == ["github"]
    channel = next(c for c in gateway.app.channels if c.name == "testchat")
    return gateway, channel


async def test_another_channel_s_u1_does_not_disconnect_slack_u1_s_personal_account(
    testchat: Any, connected_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack,
    fake_llm: FakeLLM, oauth: FakeOAuth,
) -> None:
    """testchat's person "U1" is someone else than Slack's U1 (every decision compares the channel): their
    disconnect must find no account of theirs, and leave Slack U1's connected and unrevoked."""
    gateway, _channel = await _slack_u1_connected_and_testchat(connected_settings, start_gateway, fake_slack,
                                                               fake_llm, oauth)
    with pytest.raises(NotFound):
        await gateway.app.gateway.disconnect("github", "U1", channel="testchat")
    assert [c.name for c in await gateway.app.gateway.connections_of("U1")] == ["github"]
    assert not oauth.revoked


async def test_another_channel_s_u1_never_acts_through_slack_u1_s_personal_account(
    testchat: Any, connected_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack,
    fake_llm: FakeLLM, oauth: FakeOAuth,
) -> None:
    """The model of a testchat conversation by "U1" calls the github connection: the call must not carry Slack
    U1's token (it should ask testchat's U1 to connect their own, or fail)."""
    gateway, channel = await _slack_u1_connected_and_testchat(connected_settings, start_gateway, fake_slack,
                                                              fake_llm, oauth)
    slack_tokens = set(oauth.valid_access_tokens())
    assert slack_tokens
    before = len(_authorizations(oauth))
    fake_llm.then(call(oauth), Reply("done"))
    await channel.say("who am I on github?")
    await _answered(channel)  # the http_request approval, approved by testchat's U1 (the requester)
    await gateway.idle()
    sent = _authorizations(oauth)[before:]
    assert not any(token in header for header in sent for token in slack_tokens), sent


def _authorizations(oauth: FakeOAuth) -> list[str]:
    from tests.test_connections import resource_calls

    return [str(c["headers"].get("Authorization", "")) for c in resource_calls(oauth)]


async def test_another_channel_s_u1_does_not_list_slack_u1_s_personal_accounts(
    testchat: Any, connected_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack,
    fake_llm: FakeLLM, oauth: FakeOAuth,
) -> None:
    """`/bot connections` typed by testchat's U1 lists the shared accounts only, never Slack U1's; its
    `connections disconnect github` finds nothing of theirs."""
    from core.commands import Command

    gateway, _channel = await _slack_u1_connected_and_testchat(connected_settings, start_gateway, fake_slack,
                                                               fake_llm, oauth)
    commands = gateway.app.gateway._commands
    said = await commands.run(Command(text="connections", user="U1", channel="testchat", place="testchat:t1"))
    assert "You have no connections" in said, said
    said = await commands.run(Command(text="connections disconnect github", user="U1", channel="testchat",
                                      place="testchat:t1"))
    assert "There is no github connection" in said, said
    assert [c.name for c in await gateway.app.gateway.connections_of("U1")] == ["github"]
