"""The installed chat channels: every ``ChannelPlugin`` named under the entry-point group ``bot.channels``
(pyproject.toml), found once per process."""

from __future__ import annotations

import functools
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from bot.errors import SettingsError
from core.oncall import ONCALL
from core.plugins import ENTRY_POINTS, ChannelPlugin

if TYPE_CHECKING:
    from core.sealed_values import SealedKind
    from core.store.database import Database


@functools.cache
def installed_channels() -> tuple[ChannelPlugin[Any], ...]:
    """By name, so the start-up lines and the doctor come in the same order every time."""
    found = []
    for point in sorted(entry_points(group=ENTRY_POINTS), key=lambda p: p.name):
        plugin = point.load()
        if not isinstance(plugin, ChannelPlugin):
            raise SettingsError(f"entry point {point.name} = {point.value} of {ENTRY_POINTS} is not a ChannelPlugin")
        if plugin.name == ONCALL:  # ``oncall:<schedule>`` names a rota's people, never a channel's (core.oncall)
            raise SettingsError(f"entry point {point.name} = {point.value} of {ENTRY_POINTS}: no channel may be "
                                f"named {ONCALL!r} (approvers' oncall:<schedule id> entries name PagerDuty rotas)")
        found.append(plugin)
    if not found:
        raise SettingsError(f"no chat channel is installed (entry points {ENTRY_POINTS}): reinstall the bot "
                            "(pip install -e .) so its web and slack channels are registered")
    return tuple(found)


def sealed_kinds(db: Database) -> list[SealedKind[Any]]:
    """Every table holding a sealed value: core's, then each installed channel's."""
    from core.sealed_values import sealed_kinds as core_sealed_kinds  # the services: only where keys are used

    return core_sealed_kinds(db) + [kind for plugin in installed_channels() for kind in plugin.sealed(db)]
