"""Who an entry of BOT_APPROVERS, BOT_ADMINS or bot.toml's ``approvers`` / ``escalate_to`` names: ``requester``,
``<channel>:<id>``, or a bare id an installed channel claims (Slack's ``U…``/``W…``/``S…``, the web chat's
``web``); an approver may also be ``oncall:<schedule id>`` (core.oncall). Core compares them with the person's
channel (``core.people``)."""

from __future__ import annotations

import re

from bot.channels import installed_channels
from core.oncall import schedule_of
from core.people import REQUESTER, People

_QUALIFIED = re.compile(r"([a-z][a-z0-9_-]*):([A-Za-z0-9._@-]+)")  # fullmatch: "slack:U1\n" is not slack:U1


def claimed_by(entry: str) -> str | None:
    """The channel a bare entry names a person or group of."""
    return next(iter(_claimers(entry)), None)


def _claimers(entry: str) -> list[str]:
    return [plugin.name for plugin in installed_channels() if plugin.people(entry)]


def is_person(entry: str) -> bool:
    if entry == REQUESTER:
        return True
    if (qualified := _QUALIFIED.fullmatch(entry)) is not None:
        channel, person = qualified.groups()
        return any(plugin.name == channel and plugin.ids(person) for plugin in installed_channels())
    # Claimed by exactly one channel: were two to claim its shape, it would silently be the first's by name (and
    # the other's person of that id someone else). <channel>:<id> says whose it is.
    return len(_claimers(entry)) == 1


def is_approver(entry: str) -> bool:
    """A person, or the people on call in a PagerDuty schedule (``oncall:P1AB2CD``): never an admin."""
    return is_person(entry) or schedule_of(entry) is not None


def people() -> People:
    return People(claimed_by)
