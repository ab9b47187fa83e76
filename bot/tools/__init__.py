"""Built-in tools and plugin discovery."""

from __future__ import annotations

import logging
from importlib.metadata import entry_points

from bot.tools.time_now import time_now_tool
from core.tools import Tool, ToolRegistry

log = logging.getLogger(__name__)


def build_registry() -> ToolRegistry:
    registry = ToolRegistry()
    registry.register(time_now_tool())
    for tool in _plugin_tools():
        registry.register(tool)
    return registry


def _plugin_tools() -> list[Tool]:
    """Tools from installed packages' ``bot.tools`` entry points (each a Tool or a zero-arg factory)."""
    tools: list[Tool] = []
    for ep in entry_points(group="bot.tools"):
        obj = ep.load()
        tool = obj() if callable(obj) and not isinstance(obj, Tool) else obj
        if not isinstance(tool, Tool):
            raise TypeError(f"entry point bot.tools:{ep.name} did not give a core.tools.Tool")
        log.info("plugin tool %s from %s", tool.name, ep.value)
        tools.append(tool)
    return tools
