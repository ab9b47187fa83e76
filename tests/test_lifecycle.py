"""The process's life as an operator sees it (SPEC §10, §11): SIGTERM keeps parked work parked and
exits at once when nothing else runs; one `bot run` per SQLite database; the port is bound before
anything is recovered, and nothing is taken in before recovery is done."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sqlite3
import stat
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.bot_process import STARTED, BotProcess, post_form, run_cli, send_event, slack_env
from tests.fakes.llm import FakeLLM, Gate, Reply
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import block_action, command_body, mention, view_submission

ON_POSTGRES = bool(os.environ.get("TEST_DATABASE_URL"))
sqlite_only = pytest.mark.skipif(ON_POSTGRES, reason="the lock file is for SQLite; PostgreSQL uses leases")

DRAIN_S = "20"  # a parked turn must not be waited for: the exits below take far less


@pytest.fixture(autouse=True)
def _process_database(database_url: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    if database_url:
        monkeypatch.setenv("BOT_PROCESS_DATABASE_URL", database_url)


def _env(fake_slack: FakeSlack, fake_llm: FakeLLM, port: int) -> dict[str, str]:
    return slack_env(fake_slack, fake_llm, port) | {"APPROVAL_POLL_S": "0.1", "SHUTDOWN_DRAIN_S": DRAIN_S}


async def _card(fake_slack: FakeSlack) -> str:
    """The request id on the first card the bot posted (an approval or a credential request)."""
    card = (await fake_slack.wait_for("chat.postMessage"))[0]
    return str(card.params["blocks"][-1]["elements"][0]["value"])


def _texts(fake_slack: FakeSlack) -> list[str]:
    return [str(c.params.get("text")) for c in fake_slack.posts()]


def _shown(fake_slack: FakeSlack) -> str:
    """Everything the thread shows: posts and in-place updates, text and blocks."""
    calls = fake_slack.posts() + fake_slack.of("chat.update")
    return "\n".join(f"{c.params.get('text')} {c.params.get('blocks')}" for c in calls)


async def _wait_text(fake_slack: FakeSlack, text: str, timeout: float = 20) -> None:
    async with asyncio.timeout(timeout):
        while not any(text in t for t in _texts(fake_slack)):
            await fake_slack.wait_for("chat.postMessage", len(fake_slack.posts()) + 1, timeout)


async def _redeploy(bot: BotProcess, env: dict[str, str], cwd: Path) -> tuple[BotProcess, float, str]:
    """SIGTERM (what every deploy sends), then start again. Returns the new process, how long the
    old one took to exit, and its last line."""
    started = time.monotonic()
    assert await bot.terminate(timeout=30) == 0
    took = time.monotonic() - started
    return await BotProcess(cwd, env).start(), took, await _last_line(bot)


async def _last_line(bot: BotProcess) -> str:
    """The final line of an exited process (its output reader may still be collecting it)."""
    deadline = time.monotonic() + 2
    while "bot stopped" not in bot.stdout and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return next((line for line in bot.stdout.splitlines() if "bot stopped" in line), "(no final line)")


def _sqlite(tmp_path: Path, sql: str, database: Path | None = None) -> list[tuple[Any, ...]]:
    path = database or tmp_path / ".bot" / "bot.db"
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        return conn.execute(sql).fetchall()


async def _column(tmp_path: Path, database_url: str | None, sql: str) -> list[Any]:
    """One column of a query, on SQLite or PostgreSQL, read from outside the bot."""
    if database_url is None:
        return [row[0] for row in _sqlite(tmp_path, sql)]
    import asyncpg
    from sqlalchemy.engine import make_url

    dsn = make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)
    conn = await asyncpg.connect(dsn)
    try:
        return [r[0] for r in await conn.fetch(sql)]
    finally:
        await conn.close()


async def test_sigterm_keeps_a_parked_approval_through_two_redeploys(
    tmp_path: Path, unused_port: int, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    env = _env(fake_slack, fake_llm, unused_port)
    runs = tmp_path / ".bot" / "work" / "default" / "runs.log"
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo ran >> runs.log"})]))
    bot = await BotProcess(tmp_path, env).start()
    assert await send_event(bot, mention("run it"), "EvParkTerm") == 200
    request_id = await _card(fake_slack)
    for _ in range(2):  # max_turn_attempts is 2: a redeploy must not count as a crash
        bot, took, last = await _redeploy(bot, env, tmp_path)
        assert took < 5, f"a parked turn was drained: exit took {took:.1f} s"
        assert "0 turn(s) drained" in last and "1 parked request(s) kept" in last, last
        code, out = await run_cli(tmp_path, env, "approvals", "list")
        assert code == 0 and f"{request_id}\t" in out and "echo ran" in out, out  # still pending
    try:
        fake_llm.then(Reply("ran it"))
        assert await post_form(bot, block_action("approval:approve", request_id, user="U1")) == 200
        await _wait_text(fake_slack, "ran it")
        assert runs.read_text() == "ran\n"  # exactly once
        assert "exit code 0" in fake_llm.requests[-1]["messages"][-1]["content"]
        shown = _shown(fake_slack)
        assert "ancel" not in shown and "restarted" not in shown, shown
        assert "Approved by" in shown
        assert len(fake_llm.requests) == 2  # the model was not asked again by either restart
    finally:
        assert await bot.terminate() == 0


async def test_sigterm_keeps_a_parked_credential_request(
    tmp_path: Path, unused_port: int, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    env = _env(fake_slack, fake_llm, unused_port)
    fake_llm.then(Reply(tool_calls=[("credential_request", {"name": "term.token", "reason": "deploys"})]))
    bot = await BotProcess(tmp_path, env).start()
    assert await send_event(bot, mention("need a token"), "EvCredTerm") == 200
    request_id = await _card(fake_slack)
    bot, took, last = await _redeploy(bot, env, tmp_path)
    try:
        assert took < 5, f"a parked turn was drained: exit took {took:.1f} s"
        assert "1 parked request(s) kept" in last, last
        fake_llm.then(Reply("token in hand"))
        values = {"value": {"value": {"type": "plain_text_input", "value": "value-after-redeploy"}}}
        assert await post_form(bot, view_submission("credential_provide", request_id, values)) == 200
        await _wait_text(fake_slack, "token in hand")
        assert _texts(fake_slack).count("token in hand") == 1
        assert "term.token is now stored" in fake_llm.requests[-1]["messages"][-1]["content"]
        assert "ancel" not in _shown(fake_slack)
        assert len(fake_llm.requests) == 2
    finally:
        assert await bot.terminate() == 0


async def test_sigterm_keeps_a_schedules_destination_approval(
    tmp_path: Path, unused_port: int, fake_slack: FakeSlack, fake_llm: FakeLLM, database_url: str | None
) -> None:
    env = _env(fake_slack, fake_llm, unused_port)
    bot = await BotProcess(tmp_path, env).start()
    assert await post_form(bot, command_body("schedule every 1h #acc-dest say hi")) == 200
    request_id = await _card(fake_slack)
    async with asyncio.timeout(5):  # the schedule records which request it waits on
        while await _column(tmp_path, database_url, "SELECT approval_id FROM schedules") != [int(request_id)]:
            await asyncio.sleep(0.02)
    bot, took, _last = await _redeploy(bot, env, tmp_path)
    try:
        assert took < 5
        assert await post_form(bot, block_action("approval:approve", request_id, user="U1")) == 200
        await _wait_text(fake_slack, "is active")
        assert "ancel" not in _shown(fake_slack) and "not started" not in _shown(fake_slack)
    finally:
        assert await bot.terminate() == 0


async def test_sigterm_drains_a_running_turn_and_keeps_a_parked_one(
    tmp_path: Path, unused_port: int, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    env = _env(fake_slack, fake_llm, unused_port)
    gate = Gate(Reply("finished while draining"))
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo parked"})]), gate)
    bot = await BotProcess(tmp_path, env).start()
    assert await send_event(bot, mention("park this", channel="C1"), "EvMixPark") == 200
    await fake_slack.wait_for("chat.postMessage")  # its approval card
    assert await send_event(bot, mention("work on this", channel="C2"), "EvMixRun") == 200
    await asyncio.wait_for(gate.reached.wait(), 10)
    assert bot.proc is not None
    bot.proc.send_signal(signal.SIGTERM)
    await asyncio.sleep(0.5)
    assert bot.proc.returncode is None  # the running turn holds the exit back
    gate.opened.set()
    async with asyncio.timeout(10):
        assert await bot.proc.wait() == 0
    await _wait_text(fake_slack, "finished while draining")
    last = await _last_line(bot)
    assert "1 turn(s) drained, 1 parked request(s) kept" in last, last
    assert "ancel" not in _shown(fake_slack)


async def test_a_slack_call_in_flight_at_sigterm_is_finished_by_the_drain(
    tmp_path: Path, unused_port: int, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    """The Slack session outlives the drain: an answer being posted when SIGTERM comes lands then, not
    cut off (a cut-off users.info would also have labelled the sender a guest)."""
    # One delivery attempt is cut a fifth of LEASE_TTL_S before its claim ends: slack_env's 2 s (kept short for
    # restarts on PostgreSQL) leaves a 1.5 s post 0.1 s to spare, which a loaded machine does not always give.
    # Nothing is restarted here, so the default lease applies.
    env = _env(fake_slack, fake_llm, unused_port) | {"LEASE_TTL_S": "30"}
    fake_slack.post_delay_s = 1.5
    gate = Gate(Reply("posted while stopping"))
    fake_llm.then(gate)
    bot = await BotProcess(tmp_path, env).start()
    assert await send_event(bot, mention("answer slowly"), "EvSlowPost") == 200
    await asyncio.wait_for(gate.reached.wait(), 10)
    gate.opened.set()
    await asyncio.sleep(0.5)  # the answer's chat.postMessage is on its way (Slack takes 1.5 s)
    assert bot.proc is not None
    bot.proc.send_signal(signal.SIGTERM)
    async with asyncio.timeout(15):
        assert await bot.proc.wait() == 0
    assert "bot stopped" in await _last_line(bot)
    assert "answer of turn 1 delivered" in bot.stdout and "failed" not in bot.stdout, bot.stdout
    assert _texts(fake_slack).count("posted while stopping") == 1


async def test_a_stopped_turn_does_not_cancel_the_wait_it_left_behind(
    tmp_path: Path, unused_port: int, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    """schedule_create starts a destination approval that outlives the call (and the turn). Stopping
    the turn, then a redeploy, leave that request pending: it belongs to no turn."""
    env = _env(fake_slack, fake_llm, unused_port)
    gate = Gate(Reply("never seen"))
    create = {"prompt": "say hi", "every_seconds": 3600, "destination": "#acc-dest"}
    fake_llm.then(Reply(tool_calls=[("schedule_create", create)]), gate)
    bot = await BotProcess(tmp_path, env).start()
    try:
        assert await send_event(bot, mention("schedule it"), "EvLeftBehind") == 200
        assert await post_form(bot, block_action("approval:approve", await _card(fake_slack), user="U1")) == 200
        await asyncio.wait_for(gate.reached.wait(), 10)  # the turn runs on: its next model call
        destination = (await fake_slack.wait_for("chat.postMessage", 2))[1]
        assert "schedule_destination" in str(destination.params.get("blocks"))
        assert await post_form(bot, command_body("stop")) == 200
        await _wait_text(fake_slack, "Stopped the running turn")
        await fake_slack.wait_for("reactions.remove")  # the turn is over
        bot, took, last = await _redeploy(bot, env, tmp_path)
        assert took < 5 and "1 parked request(s) kept" in last, last
        value = destination.params["blocks"][-1]["elements"][0]["value"]
        assert await post_form(bot, block_action("approval:approve", value, user="U1")) == 200
        await _wait_text(fake_slack, "is active")
        assert "not started" not in _shown(fake_slack)
    finally:
        gate.opened.set()
        assert await bot.terminate() == 0


async def _term_while_starting(cwd: Path, env: dict[str, str], database_url: str | None) -> tuple[int, str]:
    """``bot run``, and SIGTERM the moment recovery has resumed the parked turn (start-up not over yet)."""
    attempts = "SELECT attempts FROM turns"
    before = (await _column(cwd, database_url, attempts))[0]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "run", cwd=cwd, env=BotProcess(cwd, env).env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    STARTED.append(proc)
    async with asyncio.timeout(20):
        while (await _column(cwd, database_url, attempts))[0] <= before:
            await asyncio.sleep(0.002)
    proc.send_signal(signal.SIGTERM)  # a deploy superseded while this one was still starting
    async with asyncio.timeout(30):
        out, _ = await proc.communicate()
    return int(proc.returncode or 0), out.decode()


async def test_sigterm_while_starting_keeps_a_parked_turn_parked(
    tmp_path: Path, unused_port: int, fake_slack: FakeSlack, fake_llm: FakeLLM, database_url: str | None
) -> None:
    """SIGTERM during start-up, after recovery resumed the parked turn, is a redeploy too: start-up
    finishes, then the bot stops as on any SIGTERM. Killed there, the resume counted as a crash."""
    env = _env(fake_slack, fake_llm, unused_port)
    runs = tmp_path / ".bot" / "work" / "default" / "runs.log"
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo ran >> runs.log"})]))
    bot = await BotProcess(tmp_path, env).start()
    assert await send_event(bot, mention("run it"), "EvStartTerm") == 200
    request_id = await _card(fake_slack)
    assert await bot.terminate() == 0
    for _ in range(2):  # max_turn_attempts is 2
        code, out = await _term_while_starting(tmp_path, env, database_url)
        assert code == 0 and "1 parked request(s) kept" in out and "Traceback" not in out, out
    bot = await BotProcess(tmp_path, env).start()
    try:
        fake_llm.then(Reply("ran it"))
        assert await post_form(bot, block_action("approval:approve", request_id, user="U1")) == 200
        await _wait_text(fake_slack, "ran it")
        assert runs.read_text() == "ran\n"  # exactly once
        assert "restarted" not in _shown(fake_slack) and "ancel" not in _shown(fake_slack)
        assert "failed" not in await _column(tmp_path, database_url, "SELECT status FROM turns")
    finally:
        assert await bot.terminate() == 0


# -- one process per SQLite database -------------------------------------------------------------


async def _run_expecting_exit(cwd: Path, env: dict[str, str], timeout: float = 10) -> tuple[int, str, float]:
    """``bot run`` that must refuse to start: exit code, output and how long it took. Killed if it
    does start (so a failing test does not leave it running)."""
    bot = BotProcess(cwd, env)
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "run", cwd=cwd, env=bot.env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    STARTED.append(proc)
    try:
        async with asyncio.timeout(timeout):
            out, _ = await proc.communicate()
    except TimeoutError:
        proc.kill()
        out, _ = await proc.communicate()
        pytest.fail(f"the second `bot run` did not exit:\n{out.decode()}")
    return int(proc.returncode or 0), out.decode(), time.monotonic() - started


@sqlite_only
async def test_a_second_bot_run_on_the_same_sqlite_database_changes_nothing(
    tmp_path: Path, unused_port: int, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    env = slack_env(fake_slack, fake_llm, unused_port)
    gate = Gate(Reply("the first one answers"))
    fake_llm.then(gate)
    first = await BotProcess(tmp_path, env).start()
    try:
        assert await send_event(first, mention("keep working"), "EvFirstRun") == 200
        await asyncio.wait_for(gate.reached.wait(), 10)
        with socket.socket() as s:  # another free port: only the lock can stop it
            s.bind(("127.0.0.1", 0))
            other_port = s.getsockname()[1]
        code, out, took = await _run_expecting_exit(tmp_path, env | {"PORT": str(other_port)})
        assert code != 0 and took < 10
        assert first.proc is not None and f"pid {first.proc.pid}" in out, out
        assert "already running" in out and "bot.lock" in out and "Traceback" not in out, out
        assert len([line for line in out.splitlines() if line.strip()]) == 1, out  # one clear line
        # Nothing touched: the live turn is still running, not marked interrupted or continued.
        assert _sqlite(tmp_path, "SELECT status, attempts FROM turns") == [("running", 1)]
        assert len(fake_llm.requests) == 1
        # Operator commands keep working beside the running bot.
        code, out = await run_cli(tmp_path, env, "approvals", "list")
        assert code == 0, out
        code, out = await run_cli(tmp_path, env, "schedules", "list")
        assert code == 0, out
        gate.opened.set()
        await _wait_text(fake_slack, "the first one answers")
        assert await send_event(first, mention("still there?"), "EvFirstAgain") == 200
        await _wait_text(fake_slack, "echo: still there?")
        assert _texts(fake_slack).count("the first one answers") == 1
    finally:
        assert await first.terminate() == 0


@sqlite_only
async def test_a_database_outside_bot_home_is_locked_beside_it(
    tmp_path: Path, unused_port: int, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    database = tmp_path / "data" / "shared.db"
    env = slack_env(fake_slack, fake_llm, unused_port) | {"DATABASE_URL": f"sqlite:///{database}"}
    first = await BotProcess(tmp_path, env | {"BOT_HOME": str(tmp_path / "home-a")}).start()
    try:
        lock = database.with_name("shared.db.lock")
        assert lock.exists() and stat.S_IMODE(lock.stat().st_mode) == 0o600
        code, out, _took = await _run_expecting_exit(
            tmp_path, env | {"BOT_HOME": str(tmp_path / "home-b"), "PORT": "0"})
        assert code != 0 and "already running" in out and "shared.db.lock" in out, out
    finally:
        assert await first.terminate() == 0


@sqlite_only
@pytest.mark.parametrize("spelling", ["another BOT_HOME", "a file: URI", "a hard link"])
async def test_the_same_database_by_another_name_is_refused(
    tmp_path: Path, unused_port: int, fake_slack: FakeSlack, fake_llm: FakeLLM, spelling: str
) -> None:
    """The first bot keeps its database in its BOT_HOME; a second one, with its own BOT_HOME, names
    the same file another way. The lock is on the file itself, so no name gets past it."""
    env = slack_env(fake_slack, fake_llm, unused_port)
    gate = Gate(Reply("the first one answers"))
    fake_llm.then(gate)
    first = await BotProcess(tmp_path, env).start()
    database = tmp_path / ".bot" / "bot.db"
    try:
        assert await send_event(first, mention("keep working"), "EvSameFile") == 200
        await asyncio.wait_for(gate.reached.wait(), 10)
        name = database
        if spelling == "a hard link":
            name = tmp_path / "elsewhere" / "same.db"
            name.parent.mkdir()
            os.link(database, name)
        url = f"sqlite:///file:{name}?uri=true" if spelling == "a file: URI" else f"sqlite:///{name}"
        second = {"BOT_HOME": str(tmp_path / "home-b"), "DATABASE_URL": url, "PORT": "0"}
        code, out, _took = await _run_expecting_exit(tmp_path, env | second)
        assert code != 0 and "Traceback" not in out, out
        if spelling == "a file: URI":
            assert "file:" in out and "sqlite:////" in out, out  # says how to write it instead
        else:
            assert first.proc is not None and f"pid {first.proc.pid}" in out, out
            assert "already running" in out and str(name) in out, out
        assert _sqlite(tmp_path, "SELECT status, attempts FROM turns") == [("running", 1)]
        assert len(fake_llm.requests) == 1
        code, out = await run_cli(tmp_path, env, "approvals", "list")  # operator commands still work
        assert code == 0, out
        gate.opened.set()
        await _wait_text(fake_slack, "the first one answers")
        assert _texts(fake_slack).count("the first one answers") == 1
    finally:
        gate.opened.set()
        assert await first.terminate() == 0


@sqlite_only
@pytest.mark.parametrize("url", ["sqlite:///file:{db}", "sqlite:///FILE:{db}?uri=true", "sqlite:///{db}?uri=true",
                                 "sqlite+aiosqlite:///file:{db}?uri=true&nolock=1"])
def test_a_sqlite_uri_filename_is_refused_in_settings(tmp_path: Path, url: str) -> None:
    """A URI filename is parsed by SQLite, not by the lock (and may turn SQLite's own locking off)."""
    from bot.errors import SettingsError
    from bot.settings import load_settings

    with pytest.raises(SettingsError, match="DATABASE_URL"):
        load_settings(env_file=None, bot_home=tmp_path, database_url=url.format(db=tmp_path / "bot.db"))


@sqlite_only
async def test_a_database_with_a_second_name_is_refused(tmp_path: Path, unused_port: int) -> None:
    """SQLite keeps its -wal file beside the name it was opened by: two names, two WALs, a corrupt
    database. A hard link to the database file stops `bot run` before it opens it."""
    home = tmp_path / ".bot"
    home.mkdir(mode=0o700)
    (home / "bot.db").touch(mode=0o600)
    os.link(home / "bot.db", tmp_path / "copy.db")
    code, out, _took = await _run_expecting_exit(tmp_path, {"PORT": str(unused_port)})
    assert code != 0 and "bot.db" in out and "hard link" in out and "Traceback" not in out, out
    assert (home / "bot.db").stat().st_size == 0


@sqlite_only
async def test_the_lock_of_a_killed_process_does_not_block_the_next_start(
    tmp_path: Path, unused_port: int, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    env = slack_env(fake_slack, fake_llm, unused_port)
    bot = await BotProcess(tmp_path, env).start()
    lock = tmp_path / ".bot" / "bot.lock"
    assert bot.proc is not None and str(bot.proc.pid) in lock.read_text()
    assert stat.S_IMODE(lock.stat().st_mode) == 0o600
    assert stat.S_IMODE(lock.parent.stat().st_mode) == 0o700
    await bot.kill()  # no clean-up ran: the file is left behind, the kernel dropped the lock
    assert lock.exists()
    bot = await BotProcess(tmp_path, env).start()
    try:
        assert bot.proc is not None and str(bot.proc.pid) in lock.read_text()
        assert await send_event(bot, mention("after the kill"), "EvStale") == 200
        await _wait_text(fake_slack, "echo: after the kill")
    finally:
        assert await bot.terminate() == 0


@sqlite_only
@pytest.mark.parametrize("kind", ["symlink", "hard link", "fifo"])
async def test_a_lock_path_that_is_not_a_plain_file_is_refused_and_left_alone(
    tmp_path: Path, unused_port: int, kind: str
) -> None:
    """Someone who can write where the lock goes must not make the bot truncate or write another file
    (or hang on a FIFO)."""
    home = tmp_path / ".bot"
    home.mkdir(mode=0o700)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    lock = home / "bot.lock"
    if kind == "symlink":
        lock.symlink_to(victim)
    elif kind == "hard link":
        os.link(victim, lock)
    else:
        os.mkfifo(lock, 0o600)
    code, out, _took = await _run_expecting_exit(tmp_path, {"PORT": str(unused_port)})
    assert code != 0 and "bot.lock" in out and "Traceback" not in out, out
    assert victim.read_text() == "precious\n"
    assert (home / "bot.db").stat().st_size == 0  # refused before the database was opened


# -- start-up order ------------------------------------------------------------------------------


async def test_a_busy_port_fails_before_anything_is_recovered(
    tmp_path: Path, unused_port: int, fake_slack: FakeSlack, fake_llm: FakeLLM, database_url: str | None
) -> None:
    env = slack_env(fake_slack, fake_llm, unused_port)
    gate = Gate(Reply("never delivered"))
    fake_llm.then(gate)
    bot = await BotProcess(tmp_path, env).start()
    assert await send_event(bot, mention("left running"), "EvBusy") == 200
    await asyncio.wait_for(gate.reached.wait(), 10)
    await bot.kill()  # leaves a turn for the next start to recover
    gate.opened.set()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", unused_port))
        taken.listen()
        code, out, _took = await _run_expecting_exit(tmp_path, env)
    assert code != 0 and "cannot listen" in out and "Traceback" not in out, out
    statuses = await _column(tmp_path, database_url, "SELECT status FROM turns ORDER BY id")
    assert statuses == ["running"]  # not re-queued, not continued
    assert len(fake_llm.requests) == 1
    bot = await BotProcess(tmp_path, env).start()  # the port is free again: recovery happens now
    try:
        await _wait_text(fake_slack, "echo: left running")
    finally:
        assert await bot.terminate() == 0


@sqlite_only
async def test_requests_during_recovery_are_refused_not_lost(
    make_settings: Any, tmp_path: Path, unused_port: int, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    from bot.app import build_application
    from tests.slack_requests import dumps, event_body, signed_headers

    settings = make_settings(port=unused_port)
    app = build_application(settings)
    await app.db.migrate()  # an existing database: recovery, not the first migration, is what runs
    blocker = sqlite3.connect(settings.bot_home / "bot.db", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # recovery's first write waits behind this (busy timeout 10 s)
    starting = asyncio.create_task(app.start())
    base = f"http://127.0.0.1:{unused_port}"
    event = mention("sent during recovery")
    body = dumps(event_body(event, event_id="EvEarly"))
    try:
        async with asyncio.timeout(5):
            while app.address.bound is None:
                await asyncio.sleep(0.01)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/readyz") as resp:
                assert resp.status == 503
            async with http.post(f"{base}/slack/events", data=body, headers=signed_headers(body)) as resp:
                assert resp.status == 503  # not 2xx: Slack delivers it again
                assert "starting" in await resp.text()
            assert not starting.done()
            blocker.execute("COMMIT")
            await asyncio.wait_for(starting, 10)
            async with http.get(f"{base}/readyz") as resp:
                assert resp.status == 200
            headers = signed_headers(body) | {"X-Slack-Retry-Num": "1"}
            async with http.post(f"{base}/slack/events", data=body, headers=headers) as resp:
                assert resp.status == 200  # Slack's redelivery is taken in, and answered once
        posts = await fake_slack.wait_for("chat.postMessage")
        assert [p.params["text"] for p in posts] == ["echo: sent during recovery"]
    finally:
        if blocker.in_transaction:
            blocker.execute("ROLLBACK")
        blocker.close()
        if not starting.done():
            await asyncio.wait_for(starting, 15)
        await app.stop()


@pytest.mark.skipif(not ON_POSTGRES, reason="needs TEST_DATABASE_URL")
async def test_on_postgresql_two_processes_start_and_both_serve(
    tmp_path: Path, fake_slack: FakeSlack, fake_llm: FakeLLM, database_url: str
) -> None:
    bots = []
    try:
        for _ in range(2):  # one BOT_HOME: no lock on PostgreSQL, leases share the work
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            bots.append(await BotProcess(tmp_path, slack_env(fake_slack, fake_llm, port)).start())
        for i, bot in enumerate(bots):
            assert (await bot.get("/readyz"))[0] == 200
            assert await send_event(bot, mention(f"to replica {i}", channel=f"CR{i}"), f"EvPg{i}") == 200
        for i in range(2):
            await _wait_text(fake_slack, f"echo: to replica {i}")
    finally:
        for bot in bots:
            await bot.terminate()


@pytest.mark.skipif(not ON_POSTGRES, reason="needs TEST_DATABASE_URL")
async def test_on_postgresql_a_turn_parked_on_a_stopped_replica_continues_on_another(
    tmp_path: Path, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    envs = [_env(fake_slack, fake_llm, port) for port in ports]
    runs = tmp_path / ".bot" / "work" / "default" / "runs.log"
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo ran >> runs.log"})]), Reply("ran on b"))
    first = await BotProcess(tmp_path, envs[0]).start()
    second = await BotProcess(tmp_path, envs[1]).start()
    try:
        assert await send_event(first, mention("run it"), "EvRolling") == 200
        request_id = await _card(fake_slack)
        started = time.monotonic()
        assert await first.terminate() == 0  # a rolling deploy: this replica goes first
        assert time.monotonic() - started < 5
        assert await post_form(second, block_action("approval:approve", request_id, user="U1")) == 200
        await _wait_text(fake_slack, "ran on b")
        assert runs.read_text() == "ran\n"
        assert "ancel" not in _shown(fake_slack)
    finally:
        await second.terminate()
