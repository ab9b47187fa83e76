"""An MCP server's tools as the agent's tools: ``<server>__<tool>``, the server's input schema, the entry's
risk (gated ones park for approval like built-in tools), the entry's timeout; results as text, truncated
like any tool's; MCP errors as tool errors with the server's message. Each call gets its own credentials
(an HTTP server's bearer header, opened for that call) and the audit log says which it used."""

from __future__ import annotations

import fnmatch
import json
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import jsonschema
from mcp_types import CallToolResult
from mcp_types import Tool as McpTool
from yarl import URL

from bot.mcp.servers import McpServer, ServerFailed
from bot.mcp.spec import SEPARATOR
from core.connections.spec import ConnectionSpec
from core.stored_secrets import CredentialUse
from core.tools import Risk, Tool, ToolContext, ToolError

log = logging.getLogger(__name__)
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # what model APIs accept as a function name
DESCRIPTION_MAX = 1024
Audit = Callable[[ToolContext, str, dict[str, Any]], Awaitable[None]]


class Connections(Protocol):
    def spec(self, name: str) -> ConnectionSpec: ...
    async def use(self, ctx: ToolContext, name: str, *, need_scopes: tuple[str, ...] = (),
                  rejected: str | None = None) -> CredentialUse: ...


class Access:
    """What a call to an HTTP server sends as its bearer token: a stored credential, or a connection's token."""

    def __init__(self, server: McpServer, credential_headers: Callable[[ToolContext, str], Awaitable[CredentialUse]]
                 | None, connections: Connections | None) -> None:
        self.server = server
        self.credential_headers = credential_headers
        self.connections = connections

    async def headers(self, ctx: ToolContext, rejected: str | None = None) -> tuple[dict[str, str], dict[str, str]]:
        """(headers, what the audit log records)."""
        spec = self.server.spec
        host = URL(spec.url or "").raw_host or ""
        if spec.credential:
            if self.credential_headers is None:
                raise ToolError(f"credential {spec.credential!r} is not available here")
            use = await self.credential_headers(ctx, spec.credential)
            if not use.allows(host):
                raise ToolError(f"credential {spec.credential} may not be sent to {host} (its allowed hosts)")
            return dict(use.headers), {"credential": spec.credential}
        if spec.connection:
            if self.connections is None:
                raise ToolError(f"connection {spec.connection!r} is not configured ([[connections]] in bot.toml)")
            if not self.connections.spec(spec.connection).allows(host):
                raise ToolError(f"connection {spec.connection}'s token may not be sent to {host} (its hosts)")
            use = await self.connections.use(ctx, spec.connection, rejected=rejected)
            return dict(use.headers), {"connection": spec.connection}
        return {}, {}


def server_tools(server: McpServer, access: Access, audit: Audit, *, extra_timeout_s: float = 0) -> list[Tool]:
    """The listed tools the entry's ``tools`` globs allow, as core tools (the unusable ones logged and left out)."""
    spec = server.spec
    tools: list[Tool] = []
    for listed in server.tools or []:
        if not any(fnmatch.fnmatchcase(listed.name, pattern) for pattern in spec.tools):
            continue
        name = f"{spec.name}{SEPARATOR}{listed.name}"
        schema = dict(listed.input_schema or {"type": "object"})
        problem = None if _TOOL_NAME.match(name) else "its name is not a valid function name (or too long)"
        if problem is None and schema.get("type") != "object":
            problem = "its input schema is not an object"
        if problem is None:
            try:
                jsonschema.Draft202012Validator.check_schema(schema)
            except jsonschema.SchemaError as exc:
                problem = f"its input schema is invalid ({exc.message})"
        if problem is not None:
            log.warning("MCP server %s: tool %r left out: %s", spec.name, listed.name, problem)
            continue
        tools.append(Tool(
            name=name, description=_description(spec.name, listed), parameters=schema,
            risk=Risk.SAFE if spec.risk == "safe" else Risk.GATED,
            function=_caller(server, listed.name, access, audit),
            timeout_s=spec.timeout_s + 5 + extra_timeout_s,
        ))
    return tools


def _description(server: str, tool: McpTool) -> str:
    text = (tool.description or tool.title or "").strip()
    return f"[MCP server {server}] {text}"[:DESCRIPTION_MAX]


def _caller(server: McpServer, tool: str, access: Access, audit: Audit) -> Callable[[ToolContext, dict[str, Any]],
                                                                                     Awaitable[str]]:
    async def call(ctx: ToolContext, args: dict[str, Any]) -> str:
        headers, used = await access.headers(ctx)
        detail = {"server": server.spec.name, "tool": tool, **used}
        try:
            try:
                result = await server.call(tool, args, headers)
            except ServerFailed as exc:
                if not (server.spec.connection and exc.diagnosis.kind in ("invalid_token", "oauth")):
                    raise
                # The token was refused: refreshed once (or consent asked again), one retry.
                token = headers.get("Authorization", "").removeprefix("Bearer ")
                headers, used = await access.headers(ctx, rejected=token)
                result = await server.call(tool, args, headers)
        except ServerFailed as exc:
            await audit(ctx, "mcp.call_failed", detail | {"error": exc.diagnosis.kind})
            raise ToolError(exc.diagnosis.message) from None
        await audit(ctx, "mcp.call", detail | {"error": result.is_error})
        text = render(result)
        if result.is_error:
            raise ToolError(f"{server.spec.name}{SEPARATOR}{tool}: {text or 'the server reported an error'}")
        return text

    return call


def render(result: CallToolResult) -> str:
    """Text parts as they are; structured content as JSON (when the text does not already carry it); other
    parts named (an image, a resource), never passed through as raw data."""
    parts: list[str] = []
    for block in result.content:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(str(getattr(block, "text", "")))
        elif kind in ("image", "audio"):
            parts.append(f"[{kind}: {getattr(block, 'mime_type', '') or 'unknown type'}]")
        elif kind == "resource_link":
            parts.append(f"[resource: {getattr(block, 'uri', '')}]")
        elif kind == "resource":
            inner = getattr(block, "resource", None)
            text = getattr(inner, "text", None)
            parts.append(str(text) if text is not None else f"[resource: {getattr(inner, 'uri', '')}]")
    structured = result.structured_content
    if structured is not None and not _said(structured, parts):
        parts.append(json.dumps(structured, ensure_ascii=False, sort_keys=True))
    return "\n".join(part for part in parts if part)


def _said(structured: Any, parts: list[str]) -> bool:
    """Whether the text parts already carry the structured content (SDK servers put both)."""
    candidates = [structured]
    if isinstance(structured, dict) and set(structured) == {"result"}:
        candidates.append(structured["result"])
    for value in candidates:
        forms = {json.dumps(value, ensure_ascii=False), json.dumps(value, ensure_ascii=False, sort_keys=True)}
        if isinstance(value, str):
            forms.add(value)
        if any(part.strip() in forms or _same_json(part, value) for part in parts):
            return True
    return False


def _same_json(text: str, value: Any) -> bool:
    try:
        return bool(json.loads(text) == value)
    except ValueError:
        return False
