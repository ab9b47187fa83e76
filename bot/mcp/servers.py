"""Connections to MCP servers with the official SDK: a supervised stdio process, or a streamable HTTP
endpoint reached afresh for each call (so a call's bearer token is its own: nothing is shared between
concurrent turns)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TextIO

import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, Tool

from bot.errors import ServerFailed
from bot.mcp.challenge import Diagnosis, diagnose
from bot.mcp.spec import McpServerSpec
from bot.mcp.stderr import StderrLog
from bot.sandbox import Sandbox

log = logging.getLogger(__name__)
BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
PING_S = 2.0  # a stdio server that stops answering (or dies) is found this soon, and restarted
TOOLS_MAX = 100  # a server's tools beyond these are not read (every tool reaches every model request)


class McpServer(ABC):
    def __init__(self, spec: McpServerSpec) -> None:
        self.spec = spec
        self.tools: list[Tool] | None = None  # None: not listed (yet)
        self.problem: Diagnosis | None = None  # why it is not usable now

    @abstractmethod
    async def start(self, timeout_s: float, headers: Mapping[str, str] | None = None) -> None:
        """Connect and list the tools (``self.tools``), or say why not (``self.problem``). ``headers``: an HTTP
        server's, for listing."""

    @abstractmethod
    async def call(self, tool: str, args: dict[str, Any], headers: Mapping[str, str]) -> CallToolResult: ...

    async def stop(self) -> None:
        return None


class StdioServer(McpServer):
    """One long-lived process, watched by a task that owns its client: restarted with backoff when it dies."""

    def __init__(self, spec: McpServerSpec, home: Path, sandbox: Sandbox | None,
                 environment: Callable[[], Awaitable[dict[str, str]]]) -> None:
        super().__init__(spec)
        self.workdir = home / "mcp" / spec.name
        self.sandbox = sandbox  # None: runs unsandboxed (sandbox = false in its entry)
        self.environment = environment  # the credentials its entry names, opened at each start
        self.client: Client | None = None
        self.starts = 0
        self._task: asyncio.Task[None] | None = None
        self.listed = asyncio.Event()
        self.stopping = False

    async def start(self, timeout_s: float, headers: Mapping[str, str] | None = None) -> None:
        self._task = asyncio.create_task(self._supervise(), name=f"mcp:{self.spec.name}")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.listed.wait(), timeout_s)
        if self.tools is None and self.problem is None:
            self.problem = Diagnosis("unreachable", f"did not answer within {timeout_s:g} s")

    async def _supervise(self) -> None:
        failures = 0
        while not self.stopping:
            try:
                await self._run_once()
                failures = 0 if self.tools is not None else failures
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # an ExceptionGroup from the SDK's task group, OSError from the spawn
                self.problem = Diagnosis("unreachable", f"stopped: {_first_error(exc)}")
                log.warning("MCP server %s %s", self.spec.name, self.problem.message)
            finally:
                self.client = None
            if self.stopping:
                return
            delay = BACKOFF_S[min(failures, len(BACKOFF_S) - 1)]
            failures += 1
            log.info("MCP server %s: restarting in %g s", self.spec.name, delay)
            await asyncio.sleep(delay)

    async def _run_once(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True, mode=0o700)
        command, env = list(self.spec.command), await self.environment()
        ended: Callable[[], None] = lambda: None  # noqa: E731
        if self.sandbox is not None:
            env = self.sandbox.environment(self.workdir) | env
            ended = self.sandbox.traced(env)  # its processes may not pass for "this machine" at our server
            command = self.sandbox.argv(command, self.workdir)
        else:
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.workdir),
                   "LANG": os.environ.get("LANG", "C.UTF-8")} | env
        params = StdioServerParameters(command=command[0], args=command[1:], env=env, cwd=str(self.workdir))
        errors = StderrLog(self.workdir.parent / f"{self.spec.name}.stderr.log")  # it may print what it was handed
        try:
            # cache=None: a server's ttlMs must not turn the heartbeat into a local cache hit.
            async with Client(StdioTransport(params, await errors.open()), read_timeout_seconds=self.spec.timeout_s,
                              cache=None) as client:
                errors.spawned()
                self.starts += 1
                self.tools, self.problem, self.client = await list_tools(client, self.spec.name), None, client
                self.listed.set()
                log.info("MCP server %s started (%d tools)", self.spec.name, len(self.tools))
                while not self.stopping:  # a heartbeat (ping is gone from the protocol): a dead process fails it
                    await asyncio.sleep(PING_S)
                    await asyncio.wait_for(client.list_tools(cache_mode="bypass"), self.spec.timeout_s)
        finally:
            errors.close()
            ended()

    async def call(self, tool: str, args: dict[str, Any], headers: Mapping[str, str]) -> CallToolResult:
        client = self.client
        if client is None:
            raise ServerFailed(Diagnosis("unreachable", f"MCP server {self.spec.name} is not running now "
                                                        f"({self.problem.message if self.problem else 'starting'}); "
                                                        "it is restarted automatically: try again shortly"))
        try:
            return await client.call_tool(tool, args)
        except Exception as exc:
            raise ServerFailed(Diagnosis("unreachable", f"MCP server {self.spec.name} failed while answering: "
                                                        f"{_first_error(exc)}")) from None

    async def stop(self) -> None:
        self.stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task


def StdioTransport(params: StdioServerParameters, errlog: TextIO) -> Any:
    from mcp.client.stdio import stdio_client

    return stdio_client(params, errlog=errlog)


class HttpServer(McpServer):
    """A streamable HTTP endpoint: a client per call, with that call's headers."""

    async def start(self, timeout_s: float, headers: Mapping[str, str] | None = None) -> None:
        try:
            listed = await asyncio.wait_for(self._session(lambda c: list_tools(c, self.spec.name), headers or {}),
                                            timeout_s)
        except TimeoutError:
            self.problem = Diagnosis("unreachable", f"did not answer within {timeout_s:g} s")
            return
        except ServerFailed as exc:
            self.problem = exc.diagnosis
            return
        self.tools, self.problem = listed, None

    async def call(self, tool: str, args: dict[str, Any], headers: Mapping[str, str]) -> CallToolResult:
        result: CallToolResult = await self._session(lambda c: c.call_tool(tool, args), headers)
        return result

    async def _session(self, work: Callable[[Client], Awaitable[Any]], headers: Mapping[str, str]) -> Any:
        assert self.spec.url is not None
        answers: list[httpx2.Response] = []

        async def seen(response: httpx2.Response) -> None:
            answers.append(response)

        timeout = httpx2.Timeout(self.spec.timeout_s)
        try:
            async with httpx2.AsyncClient(headers=dict(headers), timeout=timeout, follow_redirects=False,
                                          event_hooks={"response": [seen]}) as http, \
                    Client(streamable_http_client(self.spec.url, http_client=http),
                           read_timeout_seconds=self.spec.timeout_s, cache=None) as client:
                return await work(client)
        except Exception as exc:
            failed = next((a for a in reversed(answers) if a.status_code >= 400), None)
            status = failed.status_code if failed is not None else (answers[-1].status_code if answers else None)
            challenge = failed.headers.get("www-authenticate", "") if failed is not None else ""
            raise ServerFailed(diagnose(status, challenge, _first_exception(exc),
                                        name=f"MCP server {self.spec.name}")) from None


async def list_tools(client: Client, server: str) -> list[Tool]:
    """The server's tools, page after page (next_cursor), from the server itself (never a cache), up to
    TOOLS_MAX: the rest is left out, and logged."""
    tools: list[Tool] = []
    cursor: str | None = None
    for _ in range(TOOLS_MAX):  # a server that hands out empty pages forever is not followed for ever
        page = await client.list_tools(cursor=cursor, cache_mode="bypass")
        tools += page.tools
        cursor = page.next_cursor
        if cursor is None or len(tools) > TOOLS_MAX:
            break
    if cursor is not None or len(tools) > TOOLS_MAX:
        log.warning("MCP server %s lists more than %d tools: only the first %d are used", server, TOOLS_MAX,
                    min(TOOLS_MAX, len(tools)))
    return tools[:TOOLS_MAX]


def _first_exception(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _first_error(exc: BaseException) -> str:
    inner = _first_exception(exc)
    return f"{type(inner).__name__}: {inner}"[:300]
