"""``shell_run``: a command with ``/bin/sh -c`` in the sandbox (bot.sandbox), with a timeout, in the work
folder under BOT_HOME, with only the credentials the call names (SPEC §16)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bot.sandbox import Sandbox, Started
from core.tools import Risk, Tool, ToolContext, ToolError

# The named credentials, as environment variables (core.credentials.CredentialService.env_for).
EnvFor = Callable[[ToolContext, list[str]], Awaitable[dict[str, str]]]
_NAME = r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$"
_DRAIN_S = 0.3  # after the kill: how long to wait for the last output


def shell_run_tool(home: Path, sandbox: Sandbox, *, default_timeout_s: int = 60, max_timeout_s: int = 600,
                   output_limit: int = 16_000, env_for: EnvFor | None = None) -> Tool:
    workdir = home / "work"

    async def shell_run(ctx: ToolContext, args: dict[str, Any]) -> str:
        command = str(args["command"]).strip()
        if not command:
            raise ToolError("command is empty")
        timeout = min(int(args.get("timeout_s") or default_timeout_s), max_timeout_s)
        names = list(dict.fromkeys(args.get("credentials") or []))
        workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        env = sandbox.environment(workdir)
        if names:
            if env_for is None:
                raise ToolError("no credentials can be passed to shell_run here")
            secrets = await env_for(ctx, names)  # a name not stored and granted: ToolError, nothing runs
            if clash := sorted(set(secrets) & set(env)):
                raise ToolError(f"a credential would replace ${clash[0]}; rename the credential")
            env |= secrets
        started = await sandbox.spawn(["/bin/sh", "-c", command], workdir, env)
        output = _Capped(output_limit)
        reader = asyncio.create_task(output.read(started.output))
        timed_out = False
        try:
            await asyncio.wait_for(started.proc.wait(), timeout)
        except TimeoutError:
            timed_out = True
        except asyncio.CancelledError:  # the turn was stopped: the command stops with it
            await _end(sandbox, started, reader)
            raise
        # Also after a normal exit: background children die with the call, and stop holding the pipe.
        await _end(sandbox, started, reader)
        text = output.text()
        status = f"timed out after {timeout} s (killed)" if timed_out else f"exit code {started.proc.returncode}"
        return f"{status}\n--- output ---\n{text}" if text else f"{status}\n(no output)"

    sandboxed = sandbox.name != "none"
    where = "in a sandbox on the bot's host" if sandboxed else "on the bot's host"
    tmp = "; /tmp starts empty each time" if sandboxed else ""
    return Tool(
        name="shell_run",
        description=(f"Run a shell command (/bin/sh -c) {where} and return its exit code and output. It runs in "
                     f"{sandbox.inside(workdir)}, which is also $HOME and keeps its files between calls{tmp}; "
                     "every process it starts is killed when it ends. Stored credentials are not in its "
                     "environment unless you name them in `credentials` (github.token becomes $GITHUB_TOKEN): "
                     "name only the ones this command needs. A person must approve each call."),
        parameters={
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "the command line, run with /bin/sh -c"},
                "timeout_s": {"type": "integer", "minimum": 1, "maximum": max_timeout_s,
                              "description": f"seconds before it is killed (default {default_timeout_s})"},
                "credentials": {
                    "type": "array", "maxItems": 16, "uniqueItems": True,
                    "items": {"type": "string", "pattern": _NAME},
                    "description": ("names of stored credentials to export to this call only, as environment "
                                    "variables (upper-cased, . and - become _)"),
                },
            },
            "required": ["command"],
            "additionalProperties": False,
        },
        risk=Risk.GATED,
        function=shell_run,
        timeout_s=max_timeout_s + 10,
        pattern_arg="command",
    )


async def _end(sandbox: Sandbox, started: Started, reader: asyncio.Task[None]) -> None:
    """Kill whatever is left, then give the output a moment to drain; never wait on a held pipe."""
    try:
        await sandbox.kill(started)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(reader), _DRAIN_S)
    finally:
        reader.cancel()
        started.close()
        started.release()  # once every process is gone: soon the bot's own server stops tracing connections


class _Capped:
    """Everything the command writes is read (so it never blocks on a full pipe); the first ``limit``
    bytes are kept."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.kept = bytearray()
        self.total = 0

    async def read(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(65536):
            self.total += len(chunk)
            if len(self.kept) < self.limit:
                self.kept += chunk[: self.limit - len(self.kept)]

    def text(self) -> str:
        text = self.kept.decode("utf-8", errors="replace")
        if self.total > len(self.kept):
            text += f"\n[output truncated: {self.total - len(self.kept)} more bytes]"
        return text
