"""An MCP server's tools as the agent's tools: ``<server>__<tool>``, the server's input schema, the entry's
risk (gated ones park for approval like built-in tools), the entry's timeout; results as text, truncated
like any tool's; MCP errors as tool errors with the server's message. Each call gets its own credentials
(an HTTP server's bearer header, opened for that call) and the audit log says which it used."""

from __future__ import annotations

import fnmatch
import json
import logging
import re
import unicodedata
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import jsonschema
from mcp_types import CallToolResult
from mcp_types import Tool as McpTool
from yarl import URL

from bot.errors import ServerFailed
from bot.mcp.servers import TOOLS_MAX, McpServer
from bot.mcp.spec import SEPARATOR
from core.connections.spec import ConnectionSpec
from core.errors import ToolError
from core.stored_secrets import CredentialUse
from core.tool_schema import schema_problem
from core.tools import Risk, Tool, ToolContext

log = logging.getLogger(__name__)
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # what model APIs accept as a function name
DESCRIPTION_MAX = 1024
SCHEMA_MAX = 8192  # bytes of a tool's input schema as JSON: a bigger one is left out (it reaches every request)
# Left out of descriptions and schema texts: what draws nothing yet reaches the model (zero-width, bidi
# controls, the U+E0000 tag block, variation selectors that can carry hidden bytes, blank letters).
_HIDDEN_CATEGORIES = {"Cf", "Cc", "Cs", "Co", "Zl", "Zp"}
_HIDDEN_RANGES = ((0xE0000, 0xE007F), (0xE0100, 0xE01EF), (0xFE00, 0xFE0F), (0x180B, 0x180F))
_BLANK = {0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x3164, 0xFFA0}
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
    for listed in (server.tools or [])[:TOOLS_MAX]:
        if not any(fnmatch.fnmatchcase(listed.name, pattern) for pattern in spec.tools):
            continue
        name = f"{spec.name}{SEPARATOR}{listed.name}"
        schema = dict(listed.input_schema or {"type": "object"})
        problem = None if _TOOL_NAME.match(name) else "its name is not a valid function name (or too long)"
        if problem is None and listed.name.startswith("_"):
            problem = f"its name begins with '_' ({name} could pass for a tool of another server)"
        if problem is None and (size := len(json.dumps(schema, ensure_ascii=False).encode())) > SCHEMA_MAX:
            problem = f"its input schema is too big ({size} bytes; at most {SCHEMA_MAX})"
        schema = clean(schema) if problem is None else schema
        if problem is None and schema.get("type") != "object":
            problem = "its input schema is not an object"
        if problem is None and (unsafe := schema_problem(schema)) is not None:
            # checking arguments against it would fetch something, or run without a bound, before any approval
            problem = f"its input schema cannot be checked safely: {unsafe}"
        if problem is None:
            try:
                jsonschema.Draft202012Validator.check_schema(schema)
            except jsonschema.SchemaError as exc:
                problem = f"its input schema is invalid ({exc.message})"
        if problem is not None:
            log.warning("MCP server %s: tool %a left out: %s", spec.name, listed.name[:80], problem)
            continue
        tools.append(Tool(
            name=name, description=_description(spec.name, listed), parameters=schema,
            risk=Risk.SAFE if spec.risk == "safe" else Risk.GATED,
            function=_caller(server, listed.name, access, audit),
            timeout_s=spec.timeout_s + 5 + extra_timeout_s,
            sends_credential=bool(spec.credential or spec.connection or spec.env),
        ))
    return tools


def _description(server: str, tool: McpTool) -> str:
    text = clean((tool.description or tool.title or "")[:DESCRIPTION_MAX * 4]).strip()
    return f"[MCP server {server}] {text}"[:DESCRIPTION_MAX]


def clean(value: Any) -> Any:
    """``value`` (a text, or a schema: every string in it, keys too) without invisible characters."""
    if isinstance(value, str):
        return "".join(ch for ch in value if not _hidden(ch))
    if isinstance(value, dict):
        return {clean(k): clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean(v) for v in value]
    return value


def _hidden(ch: str) -> bool:
    if ch in "\n\t":
        return False
    code = ord(ch)
    return (unicodedata.category(ch) in _HIDDEN_CATEGORIES or code in _BLANK
            or any(low <= code <= high for low, high in _HIDDEN_RANGES))


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
