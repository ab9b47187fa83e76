"""``shell_run``: a command with ``/bin/sh -c`` in the sandbox (bot.sandbox), with a timeout, in its agent's own
work folder ``$BOT_HOME/work/<agent>``, with only the credentials the call names (SPEC §16, §17). Its HOME is
never that folder, which commands nobody was asked about write to: a call a person approved (core's gate says
so in ``ToolContext.asked``) gets its agent's kept HOME, ``$BOT_HOME/homes/<agent>``, which only such calls
see; any other call a fresh, empty one. Neither kind of call can leave a dotfile that configures the other.

A sub-agent's calls carry its parent's agent (core.subagents), so they run in the parent agent's folder: it works
for the parent, with the parent's credentials and grants, and hands its files back there."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bot.config.agents import AGENT_NAME
from bot.home import HOMES_DIR, WORK_DIR
from bot.sandbox import Home, Sandbox, Started
from core.errors import ToolError
from core.tools import Risk, Tool, ToolContext

log = logging.getLogger(__name__)

# The named credentials, as environment variables (core.credentials.CredentialService.env_for).
EnvFor = Callable[[ToolContext, list[str]], Awaitable[dict[str, str]]]
_NAME = r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$"
_DRAIN_S = 0.3  # after the kill: how long to wait for the last output


def shell_run_tool(home: Path, sandbox: Sandbox, *, default_timeout_s: int = 60, max_timeout_s: int = 600,
                   output_limit: int = 16_000, env_for: EnvFor | None = None) -> Tool:
    root = home / WORK_DIR
    homes = home / HOMES_DIR

    async def shell_run(ctx: ToolContext, args: dict[str, Any]) -> str:
        command = str(args["command"]).strip()
        if not command:
            raise ToolError("command is empty")
        timeout = min(int(args.get("timeout_s") or default_timeout_s), max_timeout_s)
        names = list(dict.fromkeys(args.get("credentials") or []))
        workdir = _own_folder(root, ctx.agent, "work folder")
        # Nobody asked about this call: whatever an earlier (approved) command left in its HOME must not configure
        # it. A person-approved call gets the agent's kept HOME, out of reach of the calls nobody looked at.
        if ctx.asked:
            call_home: contextlib.AbstractAsyncContextManager[Home] = contextlib.nullcontext(
                sandbox.kept_home(_own_folder(homes, ctx.agent, "home folder")))
        else:
            call_home = sandbox.fresh_home()
        async with call_home as fresh_home:
            env = sandbox.environment(workdir, home=fresh_home)
            if names:
                if env_for is None:
                    raise ToolError("no credentials can be passed to shell_run here")
                secrets = await env_for(ctx, names)  # a name not stored and granted: ToolError, nothing runs
                if clash := sorted(set(secrets) & set(env)):
                    raise ToolError(f"a credential would replace ${clash[0]}; rename the credential")
                env |= secrets
            started = await sandbox.spawn(["/bin/sh", "-c", command], workdir, env, home=fresh_home)
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
    folder = sandbox.inside(root / "<agent>")
    tmp = "; /tmp starts empty each time" if sandboxed else ""
    return Tool(
        name="shell_run",
        description=(f"Run a shell command (/bin/sh -c) {where} and return its exit code and output. It runs in "
                     f"{folder}, your agent's own work folder, which keeps its files between calls{tmp}. $HOME is "
                     "another folder: your agent's own, kept between the calls a person approved; a call that runs "
                     "without anyone being asked gets a new, empty $HOME. Every process it starts is killed when it "
                     "ends. Stored credentials are not in its environment unless you name them in `credentials` "
                     "(github.token becomes $GITHUB_TOKEN): name only the ones this command needs. A person must "
                     "approve each call."),
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


def _own_folder(root: Path, agent: str, what: str) -> Path:
    """The agent's own folder under ``root`` (its work folder ``$BOT_HOME/work/<agent>``, its kept HOME
    ``$BOT_HOME/homes/<agent>``), created 0700 on first use. Refused (nothing runs): an agent name that is not one
    plain path component, and a folder that is not a plain folder of the bot's user. The old shared work folder may
    hold what earlier commands left, such as a link named like an agent: bound in the sandbox, it would hand a
    command what it points to (BOT_HOME itself)."""
    if not AGENT_NAME.fullmatch(agent):
        raise ToolError(f"the agent name {agent!r} cannot name a {what}, so the command did not run")
    folder = root / agent
    with contextlib.suppress(FileExistsError):
        root.mkdir(mode=0o700, parents=True)
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700)
    # Only the agent's folder: $BOT_HOME/work itself may be an operator's link to another disk, and no sandboxed
    # command can reach it (each sees its own folder only).
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        log.warning("shell_run refused: %s is not a plain folder of the bot's user (a link, a file or another "
                    "user's); move it away", folder)
        raise ToolError(f"the {what} of agent {agent} ($BOT_HOME/{root.name}/{agent}) is not a plain folder "
                        "of the bot's own, so the command did not run; an operator must move it away")
    if stat.S_IMODE(info.st_mode) & 0o077:  # made looser since (by an approved command): others keep out
        os.chmod(folder, 0o700)
    return folder


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
