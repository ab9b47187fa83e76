"""``shell_run``: a command in a subprocess, with a timeout, in a working folder under BOT_HOME."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from core.tools import Risk, Tool, ToolContext, ToolError

# What a command inherits from the bot's own environment: enough to find programs, never a secret.
_PASSED_THROUGH = ("PATH", "LANG", "LC_ALL", "TZ")
EnvFor = Callable[[ToolContext], Awaitable[dict[str, str]]]


def shell_run_tool(home: Path, *, default_timeout_s: int = 60, max_timeout_s: int = 600,
                   output_limit: int = 16_000, env_for: EnvFor | None = None) -> Tool:
    workdir = home / "work"

    async def shell_run(ctx: ToolContext, args: dict[str, Any]) -> str:
        command = str(args["command"]).strip()
        if not command:
            raise ToolError("command is empty")
        timeout = min(int(args.get("timeout_s") or default_timeout_s), max_timeout_s)
        workdir.mkdir(parents=True, exist_ok=True)
        env = {k: os.environ[k] for k in _PASSED_THROUGH if k in os.environ}
        env["HOME"] = str(workdir)
        if env_for is not None:
            env.update(await env_for(ctx))
        proc = await asyncio.create_subprocess_shell(
            command, cwd=workdir, env=env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # its own process group, so a timeout kills its children too
        )
        assert proc.stdout is not None
        reader = asyncio.create_task(_read_capped(proc.stdout, output_limit))
        timed_out = False
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError:
            timed_out = True
            _kill(proc)
            await proc.wait()
        except asyncio.CancelledError:  # the turn was stopped: the command stops with it
            _kill(proc)
            await proc.wait()
            reader.cancel()
            raise
        output, total = await reader
        text = output.decode("utf-8", errors="replace")
        if total > len(output):
            text += f"\n[output truncated: {total - len(output)} more bytes]"
        status = f"timed out after {timeout} s (killed)" if timed_out else f"exit code {proc.returncode}"
        return f"{status}\n--- output ---\n{text}" if text else f"{status}\n(no output)"

    return Tool(
        name="shell_run",
        description=("Run a shell command on the bot's host (in its work folder) and return its exit code and "
                     "output. A person must approve each call."),
        parameters={
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "the command line, run with /bin/sh"},
                "timeout_s": {"type": "integer", "minimum": 1, "maximum": max_timeout_s,
                              "description": f"seconds before it is killed (default {default_timeout_s})"},
            },
            "required": ["command"],
            "additionalProperties": False,
        },
        risk=Risk.GATED,
        function=shell_run,
        timeout_s=max_timeout_s + 10,
        pattern_arg="command",
    )


async def _read_capped(stream: asyncio.StreamReader, limit: int) -> tuple[bytes, int]:
    """Read everything (so the command never blocks on a full pipe), keep the first ``limit`` bytes."""
    kept = bytearray()
    total = 0
    while chunk := await stream.read(65536):
        total += len(chunk)
        if len(kept) < limit:
            kept += chunk[: limit - len(kept)]
    return bytes(kept), total


def _kill(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
