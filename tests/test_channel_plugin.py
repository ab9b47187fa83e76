"""A channel is a plug-in: ``tests/plugin_channel/testchat`` is installed only by its entry point (its
``*.dist-info`` put on sys.path here), and gets an approval and a credential form end to end without a line of
bot/ or core/ naming it."""

from __future__ import annotations

import asyncio
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bot.channels import installed_channels
from core.events import ApprovalRequested, CredentialRequested
from tests.conftest import GatewayClient
from tests.fakes.llm import FakeLLM, Reply

PLUGIN_DIR = Path(__file__).parent / "plugin_channel"


@pytest.fixture
def testchat() -> Iterator[Any]:
    """The test channel installed (its entry point found) for this test only."""
    sys.path.insert(0, str(PLUGIN_DIR))
    importlib.invalidate_caches()
    installed_channels.cache_clear()
    try:
        yield importlib.import_module("testchat")
    finally:
        sys.path.remove(str(PLUGIN_DIR))
        installed_channels.cache_clear()


async def _started(make_settings: Any, start_gateway: Any, **values: Any) -> tuple[GatewayClient, Any]:
    gateway: GatewayClient = await start_gateway(make_settings(testchat_on=True, **values))
    channel = next(c for c in gateway.app.channels if c.name == "testchat")
    return gateway, channel


async def test_the_entry_point_installs_the_channel_with_its_own_settings(
    testchat: Any, make_settings: Any
) -> None:
    assert [p.name for p in installed_channels()] == ["slack", "testchat", "web"]
    settings = make_settings(testchat_token="tc-token-123456")
    assert settings.channels["testchat"].token == "tc-token-123456" and not settings.channels["testchat"].enabled
    assert "tc-token-123456" in settings.secret_values()  # its secrets are masked like the bot's own
    assert ("TESTCHAT_TOKEN", "tc-token-123456") in settings.named_secrets()


async def test_an_approval_end_to_end_in_a_plugged_in_channel(
    testchat: Any, make_settings: Any, start_gateway: Any, fake_llm: FakeLLM
) -> None:
    gateway, channel = await _started(make_settings, start_gateway)
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo from-testchat"})]), Reply("it ran"))
    await channel.say("run it")
    await asyncio.wait_for(channel.port.answered.wait(), 20)
    await gateway.idle()
    [asked] = channel.announced  # the gated call parked, and the channel was asked to show it
    assert isinstance(asked, ApprovalRequested) and asked.request.tool == "shell_run"
    assert asked.session_id == "testchat:t1"
    [answer] = channel.answers
    assert answer.won and answer.request.status == "approved"
    tool_result = fake_llm.requests[1]["messages"][-1]["content"]
    assert "from-testchat" in tool_result  # the tool ran once approved
    assert channel.port.delivered == [("testchat:t1", "it ran")]


async def test_a_credential_form_end_to_end_in_a_plugged_in_channel(
    testchat: Any, make_settings: Any, start_gateway: Any, fake_llm: FakeLLM
) -> None:
    gateway, channel = await _started(make_settings, start_gateway)
    fake_llm.then(Reply(tool_calls=[("credential_request", {"name": "acc.token", "reason": "to call the API"})]),
                  Reply("stored"))
    await channel.say("set up the ACC account")
    await asyncio.wait_for(channel.port.answered.wait(), 20)
    await gateway.idle()
    [asked] = channel.announced
    assert isinstance(asked, CredentialRequested) and asked.request.name == "acc.token"
    [answer] = channel.answers
    assert answer.stored
    [row] = await gateway.app.credentials.store.all_secrets()
    assert row.name == "acc.token"
    assert testchat.SECRET not in str(fake_llm.requests[1]["messages"])  # the model never sees the value
    assert channel.port.delivered == [("testchat:t1", "stored")]
