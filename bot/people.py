"""Who an entry of BOT_APPROVERS, BOT_ADMINS or bot.toml's ``approvers`` / ``escalate_to`` names: ``requester``,
``<channel>:<id>``, or a bare id an installed channel claims (Slack's ``U…``/``W…``/``S…``, the web chat's
``web``). Core compares them with the person's channel (``core.people``)."""

from __future__ import annotations

import re

from bot.channels import installed_channels
from core.people import REQUESTER, People

_QUALIFIED = re.compile(r"([a-z][a-z0-9_-]*):([A-Za-z0-9._@-]+)")  # fullmatch: "slack:U1\n" is not slack:U1


def claimed_by(entry: str) -> str | None:
    """The channel a bare entry names a person or group of."""
    return next((plugin.name for plugin in installed_channels() if plugin.people(entry)), None)


def is_person(entry: str) -> bool:
    if entry == REQUESTER:
        return True
    if (qualified := _QUALIFIED.fullmatch(entry)) is not None:
        return qualified.group(1) in {plugin.name for plugin in installed_channels()}
    return claimed_by(entry) is not None


def people() -> People:
    return People(claimed_by)
