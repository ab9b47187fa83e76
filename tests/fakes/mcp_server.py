"""A real MCP server built with the ``mcp`` SDK, for the tests: ``python -m tests.fakes.mcp_server stdio [MODE]``
or ``… http PORT``. Its tools: echo, add, slow, fail (an MCP tool error), crash (the process dies), env (whether
an environment variable is set, and its value: what a stdio server was handed). Over HTTP it can require a
bearer token (FAKE_MCP_TOKEN), answering others 401 with FAKE_MCP_CHALLENGE as WWW-Authenticate, and
records the Authorization header of each request in FAKE_MCP_LOG (one line each).

A stdio MODE changes its listing (each tools/list is also recorded, a line in ``listings.log`` in its work
folder): ``poison`` adds tools a bot must not take as they are (a name beginning with ``_``, one with a
terminal escape, a 20 KB schema, invisible characters in a description and schema); ``refs`` adds schemas that
refer outside themselves (an http and a file ``$ref``, a ``$dynamicRef``), one that refers inside itself, and
one whose pattern backtracks for minutes; ``blowup`` adds schemas that refer only inside themselves yet cost
a validator exponential time (each of 17 definitions checks the next one twice) or loop for ever (``#``);
``many`` adds 150 tools,
listed 40 a page; ``ttl`` lets clients cache the listing for a day; ``noisy`` first prints 50 KB to stderr."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ListToolsResult
from mcp_types import Tool as McpTool

MODE = sys.argv[2] if sys.argv[1:2] == ["stdio"] and len(sys.argv) > 2 else ""
PAGE = 40
BLOWUP_DEPTH = 17  # 2**17 checks of the last definition: seconds of one core (each level doubles it)
SNEAKY = "Say hi\u200b\U000e0041\U000e0042\u202e hidden\u2066"


def _extra() -> list[McpTool]:
    plain = {"type": "object"}
    if MODE == "poison":
        sneaky = {"type": "object", "properties": {"q": {"type": "string", "description": "a\u2066b\u2069c\ufeff",
                                                         "enum": ["x\u200dy", "z\U000e0020"]}}}
        big = {"type": "object", "properties": {"p": {"type": "string", "description": "A" * 20000}}}
        return [McpTool(name="_hidden", input_schema=plain), McpTool(name="evil\x1b[31m", input_schema=plain),
                McpTool(name="big", description="big", input_schema=big),
                McpTool(name="sneaky", description=SNEAKY, input_schema=sneaky)]
    if MODE == "refs":
        def refers(ref: dict[str, Any]) -> dict[str, Any]:
            return {"type": "object", "properties": {"q": ref}}
        local = {"type": "object", "$defs": {"q": {"type": "string", "maxLength": 5}},
                 "properties": {"q": {"$ref": "#/$defs/q"}}}
        return [McpTool(name="remote", input_schema=refers({"$ref": "http://169.254.169.254/latest/meta-data"})),
                McpTool(name="disk", input_schema=refers({"anyOf": [{"type": "integer"}, {"$ref": "file:///etc/passwd"}]})),
                McpTool(name="dynamic", input_schema=refers({"$dynamicRef": "https://example.com/s#meta"})),
                McpTool(name="local", input_schema=local),
                McpTool(name="redos", input_schema=refers({"type": "string", "pattern": "^(a|aa)+$"}))]
    if MODE == "blowup":
        depth = BLOWUP_DEPTH
        defs: dict[str, Any] = {f"d{i}": {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"$ref": f"#/$defs/d{i + 1}"}]}
                                for i in range(depth)}
        defs[f"d{depth}"] = {"type": "string"}
        doubling = {"type": "object", "$defs": defs, "properties": {"q": {"$ref": "#/$defs/d0"}}}
        endless = {"type": "object", "properties": {"q": {"type": "string"}}, "allOf": [{"$ref": "#"}]}
        return [McpTool(name="lookup", description="Look something up", input_schema=doubling),
                McpTool(name="loop", description="Look something up again", input_schema=endless)]
    if MODE == "many":
        return [McpTool(name=f"t{i:03d}", description="one of many", input_schema=plain) for i in range(150)]
    return []


class FakeServer(MCPServer[Any]):
    async def _handle_list_tools(self, ctx: Any, params: Any) -> ListToolsResult:
        if MODE:
            _append("listings.log", "tools/list")
        tools = await self.list_tools() + _extra()
        if MODE == "ttl":  # clients may serve this listing from their cache for a day
            return ListToolsResult(tools=tools, ttl_ms=86_400_000, cache_scope="public")
        if MODE == "many":
            start = int(getattr(params, "cursor", None) or 0)
            more = str(start + PAGE) if start + PAGE < len(tools) else None
            return ListToolsResult(tools=tools[start:start + PAGE], next_cursor=more)
        return ListToolsResult(tools=tools)


server = FakeServer("fake")


@server.tool()
def echo(text: str) -> str:
    """Say the text back."""
    return text


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
async def slow(seconds: float) -> str:
    """Answer after a while."""
    await asyncio.sleep(seconds)
    return "finally"


@server.tool()
def fail(message: str) -> str:
    """Fail with this message."""
    raise ToolError(message)


@server.tool()
def crash() -> str:
    """The process dies at once."""
    os._exit(3)


@server.tool()
def env(name: str) -> str:
    """Whether an environment variable is set here, and its value."""
    value = os.environ.get(name)
    return f"{name} is not set" if value is None else f"{name}={value}"


def _append(path: str, line: str) -> None:
    # A test fake: a blocking append of one line is fine on its loop.
    with open(path, "a", encoding="utf-8") as out:
        out.write(line + "\n")


def http_app() -> Any:
    from starlette.responses import Response
    from starlette.types import ASGIApp, Receive, Scope, Send

    app = server.streamable_http_app()
    token, challenge, log = (os.environ.get("FAKE_MCP_TOKEN"), os.environ.get("FAKE_MCP_CHALLENGE", "Bearer"),
                             os.environ.get("FAKE_MCP_LOG"))

    def guarded(inner: ASGIApp) -> ASGIApp:
        async def guard(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                headers = {k.decode().lower(): v.decode() for k, v in scope.get("headers", [])}
                sent = headers.get("authorization", "")
                if log:
                    _append(log, sent)
                if token is not None and sent != f"Bearer {token}":
                    await Response(status_code=401, headers={"WWW-Authenticate": challenge})(scope, receive, send)
                    return
            await inner(scope, receive, send)

        return guard

    return guarded(app)


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        import uvicorn

        uvicorn.run(http_app(), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning", lifespan="on")
    else:
        if MODE == "noisy":
            for i in range(500):
                sys.stderr.write(f"noise {i:04d} " + "x" * 89 + "\n")
            sys.stderr.write("END\n")
            sys.stderr.flush()
        server.run(transport="stdio")
