"""``shell_run`` runs in a bubblewrap sandbox: it sees none of the bot's secrets, only the credentials
the call names, and nothing it starts outlives the call (issue 12, point 2 and 3; SPEC §16)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.conftest import GatewayClient
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.server import RunningServer
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import block_action, mention

# In CI (.ci/run) a missing or broken bubblewrap fails these tests instead of skipping them.
REQUIRED = os.environ.get("BOT_REQUIRE_SANDBOX") == "1"


def _bwrap_works() -> bool:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return False
    probe = subprocess.run([bwrap, "--unshare-pid", "--ro-bind", "/", "/", "true"], capture_output=True, check=False)
    return probe.returncode == 0


BWRAP = _bwrap_works()
needs_bwrap = pytest.mark.skipif(not BWRAP and not REQUIRED, reason="bubblewrap is missing or cannot run here")
MARKER_ENV = "BOT_TEST_PROCESS_MARKER"
MARKER = "only-the-bot-process-has-this-7c1e"


def test_bubblewrap_works_where_it_is_required() -> None:
    if not REQUIRED:
        pytest.skip("BOT_REQUIRE_SANDBOX is not set (CI sets it)")
    assert BWRAP, "BOT_REQUIRE_SANDBOX=1 but bubblewrap is missing or cannot create namespaces"


def _ctx(agent: str = "default") -> Any:
    from core.tools import ToolContext

    return ToolContext(session_id="s", turn_id=1, agent=agent, sender="U1")


async def _run(gateway: GatewayClient, args: dict[str, Any], agent: str = "default") -> str:
    """Call the shell_run tool the wiring registered, as the runner would after an approval."""
    tool = gateway.app.dispatcher.runner.tools.get("shell_run")
    assert tool is not None, "shell_run is not registered"
    result: str = await tool.function(_ctx(agent), tool.parse_arguments(args))
    return result


@pytest.fixture(params=["bwrap", "none"])
async def sandboxed(request: pytest.FixtureRequest, make_settings: Any, start_gateway: Any) -> GatewayClient:
    if request.param == "bwrap" and not BWRAP and not REQUIRED:
        pytest.skip("bubblewrap is missing or cannot run here")
    gateway: GatewayClient = await start_gateway(make_settings(shell_sandbox=request.param))
    return gateway


@pytest.fixture
async def bwrapped(make_settings: Any, start_gateway: Any) -> GatewayClient:
    if not BWRAP and not REQUIRED:
        pytest.skip("bubblewrap is missing or cannot run here")
    gateway: GatewayClient = await start_gateway(make_settings(shell_sandbox="bwrap"))
    return gateway


def _survivors(marker: str) -> list[int]:
    """Processes whose command line contains ``marker`` (read from /proc, no procps needed)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if marker.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
    return found


async def _none_survive(marker: str) -> list[int]:
    for _ in range(10):  # a SIGKILLed process may take a moment to become a (cmdline-less) zombie
        if not (left := _survivors(marker)):
            return []
        await asyncio.sleep(0.05)
    return left


@pytest.fixture
def sleeper() -> Iterator[str]:
    """A unique ``sleep`` duration to find the command's processes by; anything left is killed after."""
    marker = f"{random.randint(100_000, 999_999)}.25"
    yield marker
    for pid in _survivors(marker):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# -- what the command can see --------------------------------------------------------------------


@needs_bwrap
async def test_the_old_exploit_reveals_nothing(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    monkeypatch.setenv(MARKER_ENV, MARKER)  # in the bot's own environment (this process is the bot)
    gateway: GatewayClient = await start_gateway(make_settings())
    home = tmp_path / "home"
    key = (home / "secret.key").read_text().strip()
    exploit = ("tr '\\0' '\\n' </proc/$PPID/environ; tr '\\0' '\\n' </proc/1/environ; cat ../secret.key; "
               "ls -a ..; cat /proc/[0-9]*/environ | tr '\\0' '\\n'")
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": exploit})]))
    await gateway.send_event(mention("please run it"))
    request = (await fake_slack.wait_for("chat.postMessage"))[0]
    fake_llm.then(Reply("done"))
    await gateway.interact(block_action("approval:approve", request.params["blocks"][-1]["elements"][0]["value"]))
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    told = fake_llm.requests[1]["messages"][-1]["content"]
    assert "exit code" in told and "[truncated" not in told
    assert "../secret.key: No such file or directory" in told
    for leaked in (MARKER, key, "bot.db", "SLACK_BOT_TOKEN", "xoxb-test-token", "sk-test-key", "LLM_API_KEY",
                   str(home)):
        assert leaked not in told, (leaked, told)


@needs_bwrap
async def test_system_is_read_only_and_the_bot_is_not_mounted(bwrapped: GatewayClient) -> None:
    probes = [Path(f"/usr/.bot-sandbox-test-{os.getpid()}"), Path(f"/.bot-sandbox-test-{os.getpid()}")]
    try:
        out = await _run(bwrapped, {"command": f"touch {probes[0]} {probes[1]} 2>&1; echo ::; ls /; echo ::; "
                                               "ls /proc | grep -c '^[0-9]'"})
        assert not any(p.exists() for p in probes)
    finally:
        for p in probes:  # unsandboxed (as before the fix) the command really wrote them
            p.unlink(missing_ok=True)
    denied, listing, count = out.split("--- output ---\n")[1].split("::")
    assert denied.count("Read-only file system") == 2, out
    assert not {"root", "home", "opt", "srv", "mnt", "run", "sys", "boot"} & set(listing.split()), listing
    assert int(count) <= 4, out  # its own PID namespace: bwrap's init, sh, ls, grep


@needs_bwrap
async def test_tmp_is_empty_work_persists_and_home_is_work(bwrapped: GatewayClient, tmp_path: Path) -> None:
    first = await _run(bwrapped, {"command": "ls -A /tmp | wc -l; echo kept > note.txt; touch /tmp/gone; "
                                             "echo \"home=$HOME pwd=$(pwd)\""})
    assert first.startswith("exit code 0"), first
    lines = first.split("--- output ---\n")[1].splitlines()
    assert lines[0].strip() == "0"
    home, pwd = lines[1].removeprefix("home=").split(" pwd=")
    assert home == pwd
    second = await _run(bwrapped, {"command": "cat note.txt; ls -A /tmp | wc -l"})
    assert second.split("--- output ---\n")[1].split() == ["kept", "0"]
    assert (tmp_path / "home" / "work" / "note.txt").read_text() == "kept\n"


async def test_what_a_command_creates_is_the_bot_users_alone(sandboxed: GatewayClient, tmp_path: Path) -> None:
    """Files under BOT_HOME are 0600 and folders 0700 (issue 12, point 10): commands run with umask 077."""
    out = await _run(sandboxed, {"command": "umask; mkdir made; echo x > made/file; stat -c '%a %n' made made/file"})
    assert out.split("--- output ---\n")[1].splitlines() == ["0077", "700 made", "600 made/file"], out
    made = tmp_path / "home" / "work" / "made"
    assert (made.stat().st_mode & 0o777, (made / "file").stat().st_mode & 0o777) == (0o700, 0o600)


async def test_only_the_environment_it_needs(sandboxed: GatewayClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MARKER_ENV, MARKER)
    await sandboxed.app.credentials.set_secret("acc.token", "acc-value-1234", scope="agent", agent="default",
                                               by="U1")  # stored and granted, but this call names none
    out = await _run(sandboxed, {"command": "env"})
    names = {line.split("=", 1)[0] for line in out.split("--- output ---\n")[1].splitlines() if "=" in line}
    shell_own = {"PWD", "SHLVL", "_", "OLDPWD"}
    assert names - shell_own - {"BOT_SHELL_RUN"} == {"PATH", "HOME", "LANG"}, names
    assert MARKER not in out


# -- credentials ------------------------------------------------------------------------------------


async def test_only_named_credentials_are_exported(sandboxed: GatewayClient) -> None:
    credentials = sandboxed.app.credentials
    await credentials.set_secret("acc.token", "acc-value-1234", scope="agent", agent="default", by="U1")
    await credentials.set_secret("other.token", "other-value-5678", scope="agent", agent="default", by="U1")
    await credentials.set_secret("ops.token", "ops-value-9012", scope="agent", agent="ops", by="U1")

    out = await _run(sandboxed, {"command": "env", "credentials": ["acc.token"]})
    assert "ACC_TOKEN=acc-value-1234" in out
    assert "other-value-5678" not in out and "OTHER_TOKEN" not in out and "ops-value" not in out

    nothing = await _run(sandboxed, {"command": "env"})
    assert "acc-value-1234" not in nothing and "other-value-5678" not in nothing

    from core.tools import ToolError

    work = sandboxed.app.settings.bot_home / "work"
    for missing in (["acc.token", "nope.token"], ["ops.token"]):  # not stored; another agent's
        with pytest.raises(ToolError, match=r"no credential named '(nope|ops)\.token'"):
            await _run(sandboxed, {"command": "touch ran", "credentials": missing})
        assert not (work / "ran").exists()  # nothing ran
    with pytest.raises(ToolError, match="credentials"):
        await _run(sandboxed, {"command": "true", "credentials": ["../etc"]})


# -- nothing outlives the call ----------------------------------------------------------------------

ESCAPES = "sleep {s} & setsid sleep {s} & (sleep {s} &); sh -c 'setsid sh -c \"sleep {s} &\" &'; "


async def test_timeout_kills_every_process(sandboxed: GatewayClient, sleeper: str) -> None:
    started = time.monotonic()
    out = await asyncio.wait_for(
        _run(sandboxed, {"command": ESCAPES.format(s=sleeper) + "echo begun; sleep " + sleeper, "timeout_s": 1}), 5)
    elapsed = time.monotonic() - started
    assert out.startswith("timed out after 1 s"), out
    assert "begun" in out
    assert elapsed < 2.0, elapsed
    assert await _none_survive(sleeper) == []


async def test_a_finished_command_leaves_nothing_running(sandboxed: GatewayClient, sleeper: str) -> None:
    started = time.monotonic()
    out = await asyncio.wait_for(_run(sandboxed, {"command": ESCAPES.format(s=sleeper) + "echo back",
                                                  "timeout_s": 10}), 5)
    assert out.startswith("exit code 0") and "back" in out, out
    assert time.monotonic() - started < 2.0  # the background children held the output pipe
    assert await _none_survive(sleeper) == []


async def test_cancelling_kills_every_process(sandboxed: GatewayClient, sleeper: str) -> None:
    work = sandboxed.app.settings.bot_home / "work"
    call = asyncio.create_task(_run(sandboxed, {
        "command": ESCAPES.format(s=sleeper) + "touch started; sleep " + sleeper, "timeout_s": 60}))
    async with asyncio.timeout(5):
        while not (work / "started").exists():
            await asyncio.sleep(0.02)
    started = time.monotonic()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(call, 5)
    assert time.monotonic() - started < 1.5
    assert await _none_survive(sleeper) == []


# -- network -------------------------------------------------------------------------------------


@needs_bwrap
@pytest.mark.parametrize("network", [True, False])
async def test_shell_network_false_has_no_network(make_settings: Any, start_gateway: Any, network: bool) -> None:
    async def hello(_request: web.Request) -> web.Response:
        return web.Response(text="reached-the-host")

    app = web.Application()
    app.add_routes([web.get("/", hello)])
    server = await RunningServer(app).start()
    try:
        gateway: GatewayClient = await start_gateway(make_settings(shell_network=network))
        fetch = ("python3 -c \"import urllib.request as u; "
                 f"print(u.urlopen('http://127.0.0.1:{server.port}/', timeout=3).read().decode())\" 2>&1")
        out = await _run(gateway, {"command": fetch, "timeout_s": 10})
    finally:
        await server.stop()
    assert ("reached-the-host" in out) is network, out


# -- without a working bubblewrap ----------------------------------------------------------------


def _fake_bin(tmp_path: Path, *, broken_bwrap: bool) -> str:
    """A PATH with no bubblewrap at all, or with one that cannot create namespaces (as in a locked-down
    container)."""
    fake = tmp_path / "fakebin"
    fake.mkdir()
    if broken_bwrap:
        script = fake / "bwrap"
        script.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
        script.chmod(0o755)
    return str(fake)


@pytest.mark.parametrize("broken_bwrap", [False, True])
async def test_without_bubblewrap_shell_run_is_not_offered(
    make_settings: Any, start_gateway: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    tmp_path: Path, broken_bwrap: bool,
) -> None:
    monkeypatch.setenv("PATH", _fake_bin(tmp_path, broken_bwrap=broken_bwrap))
    caplog.set_level(logging.INFO)
    gateway: GatewayClient = await start_gateway(make_settings())
    names = gateway.app.dispatcher.runner.tools.names()
    assert "shell_run" not in names and "time_now" in names and "http_request" in names
    logged = "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
    assert "shell_run is off" in logged and "install bubblewrap" in logged and "SHELL_SANDBOX=none" in logged
    if broken_bwrap:
        assert "No permissions to create new namespace" in logged


async def test_shell_sandbox_none_warns(make_settings: Any, start_gateway: Any,
                                        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    gateway: GatewayClient = await start_gateway(make_settings(shell_sandbox="none"))
    assert gateway.app.dispatcher.runner.tools.get("shell_run") is not None
    logged = "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
    assert "SHELL_SANDBOX=none" in logged and "unsandboxed" in logged


@needs_bwrap
def test_the_sandbox_also_runs_as_an_unprivileged_user() -> None:
    """Where the bot does not run as root, bubblewrap needs unprivileged user namespaces; the same
    arguments then work (checked here by dropping to ``nobody``)."""
    if os.getuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to switch to an unprivileged user")
    from bot.sandbox import probe

    found = probe("bwrap", network=True)
    assert found.sandbox is not None, found.problem
    with tempfile.TemporaryDirectory(dir="/tmp") as scratch:  # where nobody can reach it
        Path(scratch).chmod(0o755)
        work = Path(scratch) / "work"
        work.mkdir()
        os.chown(work, 65534, 65534)
        argv = found.sandbox.argv(["/bin/sh", "-c", "echo hi > f; cat f; ls -A /tmp | wc -l"], work)
        drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        done = subprocess.run(drop + argv, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"},
                              check=False, timeout=20)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["hi", "0"]
