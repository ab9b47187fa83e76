"""Start the real ``bot run`` as a user would, in a subprocess, and stop or kill it."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp

from tests.cli_in_process import Finished, run_main_async
from tests.forked import forked_bot
from tests.slack_requests import SIGNING_SECRET, dumps, event_body, signed_headers

# Variables a developer's shell may carry that would change what the bot under test does.
_SCRUB = ("SLACK_", "LLM_", "BOT_", "DATABASE_URL", "HOST", "PORT", "QUEUE_MODE", "MAX_", "APPROVAL_", "LOG_")


# Every process started, so none outlives the test session even when a test fails half way.
STARTED: list[Any] = []  # asyncio.subprocess.Process or ForkedProcess

# This test process's migrated SQLite file (tests/conftest.py), once its first real migration made it.
SQLITE_TEMPLATE: list[Path] = []


def seed_database(cwd: Path, env: dict[str, str]) -> None:
    """A ``bot run`` about to create its default SQLite file starts from a copy of the migrated template, as the
    in-process tests do: it then starts as at every later start (schema current, no migration, no alembic), which
    is a third of a second of CPU less per process. Fresh-start migrations stay covered in-process and by
    tests/test_migrations.py; a process given its own DATABASE_URL or an existing file is left as it is."""
    if "DATABASE_URL" in env or not SQLITE_TEMPLATE or not SQLITE_TEMPLATE[0].exists():
        return
    home = Path(env.get("BOT_HOME") or ".bot")
    database = (home if home.is_absolute() else cwd / home) / "bot.db"
    if any(database.with_name(database.name + end).exists() for end in ("", "-wal", "-shm", "-journal")):
        return
    database.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    shutil.copyfile(SQLITE_TEMPLATE[0], database)
    database.chmod(0o600)


class BotProcess:
    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.cwd = cwd
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUB)} | env
        database = os.environ.get("BOT_PROCESS_DATABASE_URL")  # set per test by the database_url fixture
        if database and "DATABASE_URL" not in env:
            self.env["DATABASE_URL"] = database
        self.proc: Any = None  # asyncio.subprocess.Process or ForkedProcess
        self.stdout = ""

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.env['PORT']}"

    async def start(self, timeout: float = 30.0) -> BotProcess:
        seed_database(self.cwd, self.env)
        self.proc = await forked_bot(["run"], self.cwd, self.env)
        if self.proc is None:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bot", "run", cwd=self.cwd, env=self.env,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            )
        STARTED.append(self.proc)
        assert self.proc.stdout is not None
        async with asyncio.timeout(timeout):
            while True:
                line = (await self.proc.stdout.readline()).decode()
                if not line:
                    raise RuntimeError(f"bot exited during start:\n{self.stdout}")
                self.stdout += line
                if "listening on" in line:
                    break
        asyncio.get_running_loop().create_task(self._pump())
        return self

    async def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        async for raw in self.proc.stdout:
            self.stdout += raw.decode()

    async def get(self, path: str) -> tuple[int, dict[str, object]]:
        async with aiohttp.ClientSession() as http, http.get(self.base + path) as resp:
            return resp.status, await resp.json()

    async def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()

    async def terminate(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(timeout):
            return await self.proc.wait()


async def run_to_exit(cwd: Path, env: dict[str, str], timeout: float = 30.0) -> tuple[int, str]:
    """Run ``bot run`` expecting it to refuse to start; return its exit code and output. Always a real process:
    ``bot run`` installs signal handlers and holds its lock for the process's life."""
    return await run_cli(cwd, env, "run", timeout=timeout)


async def run_cli(cwd: Path, env: dict[str, str], *args: str, timeout: float = 30.0, stdin: bytes = b"",
                  process: bool = False) -> tuple[int, str]:
    """Run a ``bot`` command to its end; return its exit code and output (stdout and stderr, as one pipe).

    In this process (tests/cli_in_process.py) unless ``process``: the same environment (``BotProcess``'s
    scrubbing), directory, streams and exit code a subprocess would have, a second of CPU less per command.
    ``bot run`` is always a real process."""
    finished = await run_command(cwd, env, *args, timeout=timeout, stdin=stdin, merge=True, process=process)
    return finished.code, finished.out


async def run_command(cwd: Path, env: dict[str, str], *args: str, timeout: float = 30.0, stdin: bytes = b"",
                      merge: bool = False, process: bool = False) -> Finished:
    """``python -m bot *args`` to its end: exit code, stdout, stderr (``merge``: stderr into stdout)."""
    full_env = BotProcess(cwd, env).env
    if not process and args[:1] != ("run",):
        return await run_main_async(cwd, full_env, args, stdin=stdin, merge=merge, timeout=timeout)
    forked = await forked_bot(list(args), cwd, full_env) if args[:1] == ("run",) and merge and not stdin else None
    if forked is not None:  # a refused `bot run`: a process of its own, its output merged as asked
        STARTED.append(forked)
        async with asyncio.timeout(timeout):
            code = await forked.wait()
            out = await forked.stdout.read()
        return Finished(code, out.decode(), "")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", *args, cwd=cwd, env=full_env, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT if merge else asyncio.subprocess.PIPE,
    )
    STARTED.append(proc)
    async with asyncio.timeout(timeout):
        out, err = await proc.communicate(stdin)
    return Finished(int(proc.returncode or 0), out.decode(), (err or b"").decode())


def slack_env(fake_slack: Any, fake_llm: Any, port: int) -> dict[str, str]:
    """Settings that point a real process at the test's fake Slack and fake model."""
    return {
        "PORT": str(port),
        "SLACK_BOT_TOKEN": "xoxb-process-test-token",
        "SLACK_SIGNING_SECRET": SIGNING_SECRET,
        "SLACK_API_URL": f"{fake_slack.url}/api/",
        "LLM_BASE_URL": f"{fake_llm.url}/v1",
        "LLM_API_KEY": "sk-process-test",
        "LLM_MODEL": "fake-model",
        # On PostgreSQL a killed process's leases must run out before its restart takes over: keep it short.
        "LEASE_TTL_S": "2",
        # Progress reactions at once (as in-process tests): tests may take their removal as "the turn is over".
        "SLACK_PROGRESS_DELAY_S": "0",
        "SLACK_STREAMING": "false",  # answers as one post; streaming has its own tests (test_slack_streaming.py)
    }


async def send_event(bot: BotProcess, event: dict[str, Any], event_id: str, retry: int | None = None) -> int:
    body = dumps(event_body(event, event_id=event_id))
    headers = signed_headers(body)
    if retry is not None:
        headers["X-Slack-Retry-Num"] = str(retry)
    async with aiohttp.ClientSession() as http, http.post(f"{bot.base}/slack/events", data=body,
                                                          headers=headers) as resp:
        return resp.status


async def post_form(bot: BotProcess, body: str) -> int:
    """A signed interactivity request or slash command."""
    headers = signed_headers(body, content_type="application/x-www-form-urlencoded")
    async with aiohttp.ClientSession() as http, http.post(f"{bot.base}/slack/events", data=body,
                                                          headers=headers) as resp:
        return resp.status
