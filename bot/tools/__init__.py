"""Built-in tools and plugin discovery."""

from __future__ import annotations

import functools
import logging
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

from bot.egress import EgressPolicy
from bot.sandbox import Sandbox
from bot.tools.http import ConnectionAccess, CredentialHeaders, http_request_tool
from bot.tools.shell import EnvFor, shell_run_tool
from bot.tools.time_now import time_now_tool
from core.tools import Tool, ToolRegistry

log = logging.getLogger(__name__)


def build_registry(home: Path, *, sandbox: Sandbox | None = None, shell_env: EnvFor | None = None,
                   credential_headers: CredentialHeaders | None = None,
                   egress: EgressPolicy | None = None, connections: ConnectionAccess | None = None,
                   connection_wait_s: float = 1800) -> ToolRegistry:
    """The built-in tools that need nothing but this machine, then plugins.

    ``shell_run`` only with a sandbox (bot.sandbox.probe; SHELL_SANDBOX=none gives one that is not):
    without one it is not offered to the model.
    ``message_send`` is added by the wiring once a chat channel that can post exists."""
    registry = ToolRegistry()
    registry.register(time_now_tool())
    if sandbox is not None:
        registry.register(shell_run_tool(home, sandbox, env_for=shell_env))
    registry.register(http_request_tool(credential_headers=credential_headers, egress=egress, connections=connections,
                                        connection_wait_s=connection_wait_s))
    for tool in _plugin_tools():
        registry.register(tool)
    return registry


@functools.cache
def _tool_points() -> tuple[EntryPoint, ...]:
    """The installed packages' ``bot.tools`` entry points, looked up once per process (every installed package's
    metadata is read to find them; what is installed does not change while it runs)."""
    return tuple(entry_points(group="bot.tools"))


def _plugin_tools() -> list[Tool]:
    """Tools from installed packages' ``bot.tools`` entry points (each a Tool or a zero-arg factory)."""
    tools: list[Tool] = []
    for ep in _tool_points():
        obj = ep.load()
        tool = obj() if callable(obj) and not isinstance(obj, Tool) else obj
        if not isinstance(tool, Tool):
            raise TypeError(f"entry point bot.tools:{ep.name} did not give a core.tools.Tool")
        log.info("plugin tool %s from %s", tool.name, ep.value)
        tools.append(tool)
    return tools
