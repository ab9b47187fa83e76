"""Starting the ``[[mcp_servers]]`` with the bot, registering their tools, stopping them with it.

A server that cannot start does not stop the bot: its tools are absent and the log says why (``bot doctor``
names the fix). A stdio server that lists its tools later (it was slow, or restarted) gets them registered
then. Each server's tools are registered once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bot.mcp.servers import HttpServer, McpServer, StdioServer
from bot.mcp.spec import SEPARATOR, McpServerSpec
from bot.mcp.tools import Access, Audit, Connections, server_tools
from bot.sandbox import Sandbox, Unsandboxed
from core.display import visible
from core.errors import ToolError
from core.stored_secrets import CredentialUse
from core.tools import ToolContext, ToolRegistry

log = logging.getLogger(__name__)
START_TIMEOUT_S = 30.0


class McpServers:
    def __init__(self, specs: list[McpServerSpec], *, home: Path, sandbox: Sandbox | None, audit: Audit,
                 env_for: Callable[[ToolContext, list[str]], Awaitable[dict[str, str]]] | None = None,
                 credential_headers: Callable[[ToolContext, str], Awaitable[CredentialUse]] | None = None,
                 connections: Connections | None = None, connection_wait_s: float = 0.0,
                 agent: str = "default") -> None:
        self.specs = specs
        self.audit = audit
        self.credential_headers = credential_headers
        self.connections = connections
        self.connection_wait_s = connection_wait_s
        self.agent = agent
        self.servers: dict[str, McpServer] = {}
        for spec in specs:
            if spec.command:
                self.servers[spec.name] = StdioServer(spec, home, sandbox if spec.sandbox else None,
                                                      self._environment(spec, env_for, agent))
            else:
                self.servers[spec.name] = HttpServer(spec)
        self._sandbox_missing = sandbox is None
        # stdio servers meant to be sandboxed that SHELL_SANDBOX=none runs on the host
        self.unsandboxed = {spec.name for spec in specs if spec.command and spec.sandbox
                            and isinstance(sandbox, Unsandboxed)}
        self._registered: set[str] = set()
        self.registered_tools: dict[str, list[str]] = {}  # per server: its tools in the registry (MCP names)
        self._later: set[asyncio.Task[None]] = set()

    def _environment(self, spec: McpServerSpec, env_for: Callable[[ToolContext, list[str]],
                     Awaitable[dict[str, str]]] | None, agent: str) -> Callable[[], Awaitable[dict[str, str]]]:
        """The credentials the entry names, as environment variables, opened when the process starts."""
        async def environment() -> dict[str, str]:
            if not spec.env:
                return {}
            if env_for is None:
                raise ToolError("no credential store here")
            return await env_for(ToolContext(session_id=f"mcp:{spec.name}", turn_id=0, agent=agent, sender=None),
                                 list(spec.env))

        return environment

    async def start(self, registry: ToolRegistry, timeout_s: float = START_TIMEOUT_S) -> None:
        async def one(server: McpServer) -> None:
            spec = server.spec
            if spec.command and spec.sandbox and self._sandbox_missing:
                server.problem = _no_sandbox()
            else:
                if spec.name in self.unsandboxed:
                    log.warning("MCP server %s runs UNSANDBOXED (SHELL_SANDBOX=none): it can read everything "
                                "the bot's user can (BOT_HOME, the database, the keys); install bubblewrap, or set "
                                "sandbox = false in its entry to accept this", spec.name)
                await server.start(min(timeout_s, max(spec.timeout_s, 5.0)), await self._listing_headers(server))
            if server.tools is not None:
                self.register(server, registry)
            else:
                log.warning("MCP server %s: its tools are absent: %s (`bot doctor` says more)", spec.name,
                            server.problem.message if server.problem else "not started")
                if isinstance(server, StdioServer) and server.problem is not None:
                    self._later.add(asyncio.create_task(self._register_later(server, registry)))

        await asyncio.gather(*(one(server) for server in self.servers.values()))

    async def _listing_headers(self, server: McpServer) -> dict[str, str]:
        """An HTTP server's token for listing its tools at start: its credential, or a shared connection's
        (a person's own connection has nobody to act as here: the listing goes without)."""
        if not server.spec.url:
            return {}
        ctx = ToolContext(session_id=f"mcp:{server.spec.name}", turn_id=0, agent=self.agent, sender=None,
                          interactive=False)
        try:
            headers, _used = await Access(server, self.credential_headers, self.connections).headers(ctx)
        except ToolError as exc:
            log.info("MCP server %s: listing its tools without a token (%s)", server.spec.name, exc)
            return {}
        return headers

    async def _register_later(self, server: StdioServer, registry: ToolRegistry) -> None:
        await server.listed.wait()  # restarted with backoff until it lists them
        self.register(server, registry)

    def register(self, server: McpServer, registry: ToolRegistry) -> None:
        if server.spec.name in self._registered:
            return
        self._registered.add(server.spec.name)
        names = self.registered_tools.setdefault(server.spec.name, [])
        extra = self.connection_wait_s * 2 if server.spec.connection else 0.0
        for tool in server_tools(server, Access(server, self.credential_headers, self.connections), self.audit,
                                 extra_timeout_s=extra):
            try:
                registry.register(tool)
            except Exception as exc:  # a name taken by another tool: that one stays
                log.warning("MCP tool %s left out: %s", tool.name, exc)
            else:
                names.append(tool.name.removeprefix(f"{server.spec.name}{SEPARATOR}"))

    async def stop(self) -> None:
        for task in self._later:
            task.cancel()
        await asyncio.gather(*(server.stop() for server in self.servers.values()))

    def report(self) -> list[tuple[str, bool, str]]:
        """Per server: (name, usable, what to say)."""
        rows = []
        for name, server in self.servers.items():
            if server.tools is not None:
                names = self.registered_tools.get(name, [])
                of = f" (of {len(server.tools)} listed)" if len(names) != len(server.tools) else ""
                text = (f"{server.spec.kind}, {len(names)} tool(s){of}: "
                        + ", ".join(visible(n) for n in names[:12]) + (", …" if len(names) > 12 else ""))
                rows.append((name, True, text + _UNSANDBOXED * (name in self.unsandboxed)))
            else:
                rows.append((name, False, visible(server.problem.message if server.problem else "not started")))
        return rows


_UNSANDBOXED = "; runs UNSANDBOXED (SHELL_SANDBOX=none): it can read everything the bot's user can"


def _no_sandbox() -> Any:
    from bot.mcp.challenge import Diagnosis

    return Diagnosis("sandbox", "cannot start: no working sandbox for it (the same as shell_run's: install "
                                "bubblewrap), or set sandbox = false in its entry to run it unsandboxed")


def audit_to(store: Any, now: Callable[[], Any]) -> Audit:
    """Each MCP call in the audit log: who, which tool, which credential or connection it used."""
    async def audit(ctx: ToolContext, action: str, detail: dict[str, Any]) -> None:
        await store.audit(now(), ctx.sender or "agent", action, f"tool:{detail['server']}__{detail['tool']}",
                          detail | {"session": ctx.session_id, "turn": ctx.turn_id})

    return audit
