"""People are named with their channel where core compares them (``slack:U1``, ``web:web``): a bare Slack id in
the settings still means Slack's person, and the same id on another channel is someone else."""

from __future__ import annotations

import pytest

from bot.errors import SettingsError
from bot.people import is_person, people
from bot.settings import load_settings
from core.approval_policy import ApprovalPolicy
from core.people import People
from core.ports import ChannelPort
from core.trust import SenderTrust, Trust

pytestmark = pytest.mark.usefixtures("clean_env")  # tests/conftest.py


def test_entries_are_bare_slack_ids_requester_web_or_channel_qualified() -> None:
    assert all(is_person(e) for e in ("requester", "web", "U1", "W2", "S3", "slack:U1", "web:web", "slack:S3"))
    assert not any(is_person(e) for e in ("alice", "u1", "U1\n", "mars:U1", "slack:", ":U1", "slack:U 1"))
    settings = load_settings(env_file=None, bot_approvers="slack:U1,requester,web", bot_admins="U9,web:web")
    assert settings.approvers == ("slack:U1", "requester", "web") and settings.admins == ("U9", "web:web")
    with pytest.raises(SettingsError, match="<channel>:<id>"):
        load_settings(env_file=None, bot_admins="mars:U1")


def test_a_bare_id_names_the_person_of_the_channel_that_claims_it() -> None:
    named = people()
    assert named.qualified("U1") == "slack:U1" and named.qualified("web") == "web:web"
    assert named.names("U1", "U1", "slack") and named.names("slack:U1", "U1", "slack")
    assert not named.names("U1", "U1", "web")  # the same id on another channel is someone else
    assert named.names("web", "web", "web") and not named.names("web", "web", "slack")
    assert named.names("slack:U1", "U1", None)  # a caller that cannot say the channel compares ids
    assert not named.names("requester", "requester", "slack")
    assert named.groups(["S1", "slack:S2", "web", "U1"], "slack") == ["S1", "S2"]
    assert named.groups(["S1"], "web") == []
    assert People().names("U1", "U1", "web")  # without claims: ids alone, as before


async def test_admins_and_approvers_are_compared_with_the_channel() -> None:
    policy = ApprovalPolicy(("slack:U2",), ("U1",), people=people())
    assert policy.is_admin("U1", channel="slack") and not policy.is_admin("U1", channel="web")
    assert await policy.may_decide("U2", None, channel="slack")
    assert not await policy.may_decide("U2", None, channel="web")
    assert await policy.may_decide("U2", None, channel=None)  # ids alone only where a caller cannot say it


class _Ports:
    def find(self, channel: str) -> ChannelPort | None:
        return None  # no port: an unknown sender is a guest, only BOT_ADMINS are more


async def test_an_admin_is_an_admin_only_on_their_own_channel() -> None:
    trust = SenderTrust(_Ports(), ("U1", "web"), people=people())
    assert await trust.level("slack", "U1", None) == Trust.ADMIN
    assert await trust.level("web", "web", None) == Trust.ADMIN
    assert await trust.level("testchat", "U1", None) == Trust.GUEST  # another platform's U1
