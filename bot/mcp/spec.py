"""One MCP server as the bot runs it (from ``[[mcp_servers]]``, checked by bot.config.mcp_servers)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

SEPARATOR = "__"  # a server's tools reach the model as <server>__<tool>


@dataclass(frozen=True)
class McpServerSpec:
    name: str
    command: tuple[str, ...] = ()  # a stdio server
    url: str | None = None  # a streamable HTTP server
    env: tuple[str, ...] = ()  # credential names handed to a stdio server (as NAME upper-cased)
    credential: str | None = None  # an HTTP server's bearer token: a stored credential…
    connection: str | None = None  # …or an OAuth connection's token
    risk: Literal["gated", "safe"] = "gated"
    tools: tuple[str, ...] = ("*",)
    timeout_s: float = 60.0
    sandbox: bool = True

    @property
    def kind(self) -> str:
        return "stdio" if self.command else "http"
