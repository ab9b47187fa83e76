"""A real MCP server built with the ``mcp`` SDK, for the tests: ``python -m tests.fakes.mcp_server stdio`` or
``… http PORT``. Its tools: echo, add, slow, fail (an MCP tool error), crash (the process dies), env (whether
an environment variable is set, and its value: what a stdio server was handed). Over HTTP it can require a
bearer token (FAKE_MCP_TOKEN), answering others 401 with FAKE_MCP_CHALLENGE as WWW-Authenticate, and
records the Authorization header of each request in FAKE_MCP_LOG (one line each)."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("fake")


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
        server.run(transport="stdio")
