"""``shell_run`` runs in a bubblewrap sandbox: it sees none of the bot's secrets, only the credentials
the call names, and nothing it starts outlives the call (issue 12, point 2 and 3; SPEC §16)."""

from __future__ import annotations

import asyncio
import contextlib
import json
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


def _ctx(agent: str = "default", *, asked: bool = True) -> Any:
    from core.tools import ToolContext

    return ToolContext(session_id="s", turn_id=1, agent=agent, sender="U1", asked=asked)


async def _run(gateway: GatewayClient, args: dict[str, Any], agent: str = "default", *, asked: bool = True) -> str:
    """Call the shell_run tool the wiring registered, as the runner would after a person's approval (``asked``),
    or after an allow rule or a grant let it run unasked."""
    tool = gateway.app.dispatcher.runner.tools.get("shell_run")
    assert tool is not None, "shell_run is not registered"
    result: str = await tool.function(_ctx(agent, asked=asked), tool.parse_arguments(args))
    return result


def _output(result: str) -> str:
    return result.split("--- output ---\n", 1)[1] if "--- output ---\n" in result else ""


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
                                               "ls /proc | grep -c '^[0-9]'; echo ::; ls -A /home"})
        assert not any(p.exists() for p in probes)
    finally:
        for p in probes:  # unsandboxed (as before the fix) the command really wrote them
            p.unlink(missing_ok=True)
    denied, listing, count, homes = out.split("--- output ---\n")[1].split("::")
    assert denied.count("Read-only file system") == 2, out
    assert not {"root", "opt", "srv", "mnt", "run", "sys", "boot"} & set(listing.split()), listing
    assert homes.split() == ["sandbox"], homes  # /home holds the call's own HOME, nothing of the host
    assert int(count) <= 4, out  # its own PID namespace: bwrap's init, sh, ls, grep


@needs_bwrap
async def test_tmp_is_empty_work_persists_and_home_is_the_agents_own(bwrapped: GatewayClient, tmp_path: Path) -> None:
    first = await _run(bwrapped, {"command": "ls -A /tmp | wc -l; echo kept > note.txt; touch /tmp/gone; "
                                             "echo mine > ~/.dot; echo \"home=$HOME pwd=$(pwd)\""})
    assert first.startswith("exit code 0"), first
    lines = first.split("--- output ---\n")[1].splitlines()
    assert lines[0].strip() == "0"
    home, pwd = lines[1].removeprefix("home=").split(" pwd=")
    assert (home, pwd) == ("/home/sandbox", "/work")  # never the work folder, which unasked commands write to
    second = await _run(bwrapped, {"command": "cat note.txt ~/.dot; ls -A /tmp | wc -l"})
    assert second.split("--- output ---\n")[1].split() == ["kept", "mine", "0"]
    assert (tmp_path / "home" / "work" / "default" / "note.txt").read_text() == "kept\n"
    assert (tmp_path / "home" / "homes" / "default" / ".dot").read_text() == "mine\n"  # kept between approved calls


async def test_what_a_command_creates_is_the_bot_users_alone(sandboxed: GatewayClient, tmp_path: Path) -> None:
    """Files under BOT_HOME are 0600 and folders 0700 (issue 12, point 10): commands run with umask 077."""
    out = await _run(sandboxed, {"command": "umask; mkdir made; echo x > made/file; stat -c '%a %n' made made/file"})
    assert out.split("--- output ---\n")[1].splitlines() == ["0077", "700 made", "600 made/file"], out
    made = tmp_path / "home" / "work" / "default" / "made"
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


# -- who was asked: an unasked command loads nothing an earlier command left (issue 32, point 7) ----------

# What points programs at files to load; none of it reaches a command from the bot's own environment.
CONFIG_VARIABLES = ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "KUBECONFIG", "GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM",
                    "NPM_CONFIG_USERCONFIG", "DOCKER_CONFIG", "HELM_CONFIG_HOME", "TF_CLI_CONFIG_FILE", "BASH_ENV")
WRITE = {"command": "git config --global user.name Mallory"}  # leaves ~/.gitconfig behind
READ = {"command": "git config --global --get user.name"}


def _card_id(call: Any) -> str:
    return str(call.params["blocks"][-1]["elements"][0]["value"])


def _tool_results(fake_llm: FakeLLM) -> list[str]:
    return [str(m["content"]) for m in fake_llm.requests[-1]["messages"] if m["role"] == "tool"]


async def allowing(match: str, sandbox: str, make_settings: Any, start_gateway: Any, tmp_path: Path) -> GatewayClient:
    """A bot in ``sandbox`` (bwrap or none) whose one rule lets ``shell_run`` commands matching ``match`` run
    unasked."""
    if sandbox == "bwrap" and not BWRAP and not REQUIRED:
        pytest.skip("bubblewrap is missing or cannot run here")
    config = tmp_path / "bot.toml"
    config.write_text(f'[[policies]]\ntool = "shell_run"\nmatch = "{match}"\naction = "allow"\n')
    gateway: GatewayClient = await start_gateway(make_settings(shell_sandbox=sandbox, bot_config=config))
    return gateway


@pytest.fixture(params=["bwrap", "none"])
async def ruled(request: pytest.FixtureRequest, make_settings: Any, start_gateway: Any,
                tmp_path: Path) -> GatewayClient:
    """A bot whose rules let ``git config --global --get …`` run unasked (the README's kind of allow rule)."""
    return await allowing("git config --global --get *", request.param, make_settings, start_gateway, tmp_path)


async def test_a_command_an_allow_rule_runs_loads_no_dotfile_an_approved_one_left(
    ruled: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path,
) -> None:
    fake_llm.then(Reply(tool_calls=[("shell_run", WRITE)]))
    await ruled.send_event(mention("set my git name"))
    [card] = await fake_slack.wait_for("chat.postMessage")
    fake_llm.then(Reply(tool_calls=[("shell_run", READ)]), Reply("done"))
    await ruled.interact(block_action("approval:approve", _card_id(card)))
    await fake_slack.wait_for("chat.postMessage", 2)
    await ruled.idle()
    approved, unasked = _tool_results(fake_llm)
    assert approved.startswith("exit code 0"), approved
    assert "Mallory" not in unasked, unasked  # the allow rule ran it with a fresh, empty HOME
    posted = [json.dumps(c.params) for c in fake_slack.of("chat.postMessage")]
    assert sum("approval:approve" in p for p in posted) == 1  # the second call was not asked
    # The approved command's HOME is the agent's kept one (not the work folder): the file is there, and stays.
    assert "Mallory" in (tmp_path / "home" / "homes" / "default" / ".gitconfig").read_text()
    assert not (tmp_path / "home" / "work" / "default" / ".gitconfig").exists()


async def test_a_command_a_grant_runs_loads_no_dotfile_an_approved_one_left(
    sandboxed: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM,
) -> None:
    fake_llm.then(Reply(tool_calls=[("shell_run", WRITE)]))
    await sandboxed.send_event(mention("set my git name"))
    [write_card] = await fake_slack.wait_for("chat.postMessage")
    fake_llm.then(Reply(tool_calls=[("shell_run", READ)]))
    await sandboxed.interact(block_action("approval:approve", _card_id(write_card)))
    read_card = (await fake_slack.wait_for("chat.postMessage", 2))[1]
    fake_llm.then(Reply("read it"))
    await sandboxed.interact(block_action("approval:always", _card_id(read_card)))  # a person said yes: this once
    await fake_slack.wait_for("chat.postMessage", 3)
    await sandboxed.idle()
    asked = _tool_results(fake_llm)[-1]
    assert "Mallory" in asked, asked  # approved by a person: the agent's kept HOME

    fake_llm.then(Reply(tool_calls=[("shell_run", READ)]), Reply("read it again"))
    await sandboxed.send_event(mention("read it again"))
    await fake_slack.wait_for("chat.postMessage", 4)
    await sandboxed.idle()
    granted = _tool_results(fake_llm)[-1]
    assert granted.startswith("exit code"), granted
    assert "Mallory" not in granted, granted  # the grant ran it, nobody was asked: a fresh HOME
    posted = [json.dumps(c.params) for c in fake_slack.of("chat.postMessage")]
    assert sum("approval:approve" in p for p in posted) == 2


async def test_an_unasked_command_gets_a_new_empty_home_and_no_config_variables(
    sandboxed: GatewayClient, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    planted = tmp_path / "planted"
    for name in CONFIG_VARIABLES:  # in the bot's own environment (this process is the bot)
        monkeypatch.setenv(name, str(planted))
    monkeypatch.setenv("PATH", f".:{os.environ['PATH']}:")  # "." and "" would run ./kubectl from the work folder
    left = await _run(sandboxed, {"command": "mkdir -p .kube && echo x > .kube/config && echo y > .npmrc"})
    assert left.startswith("exit code 0"), left
    first = _output(await _run(sandboxed, {"command": 'echo "$HOME"; pwd; ls -A "$HOME" | wc -l; '
                                                      'touch "$HOME/.left-by-the-first"; env'}, asked=False))
    home, pwd, count, *env = first.splitlines()
    assert home != pwd and count.strip() == "0", first  # not the work folder, and empty
    names = {line.split("=", 1)[0] for line in env if "=" in line}
    assert names - {"PWD", "SHLVL", "_", "OLDPWD", "BOT_SHELL_RUN"} == {"PATH", "HOME", "LANG"}, names
    assert str(planted) not in first
    [path] = [line.removeprefix("PATH=") for line in env if line.startswith("PATH=")]
    assert all(entry.startswith("/") for entry in path.split(":")), path
    second = _output(await _run(sandboxed, {"command": 'ls -A "$HOME" | wc -l'}, asked=False))
    assert second.strip() == "0"  # each unasked call has a HOME of its own
    if sandboxed.app.settings.shell_sandbox == "none":
        assert not await asyncio.to_thread(os.path.exists, home)  # removed after the call
    again = _output(await _run(sandboxed, {"command": 'echo "$HOME"; pwd; ls -A "$HOME"'}))
    kept, where, *inside = again.split()
    assert kept != where and ".left-by-the-first" not in inside  # the agent's kept HOME, not the unasked one's


# -- one work folder per agent ---------------------------------------------------------------------------


async def test_each_agent_has_its_own_work_folder(sandboxed: GatewayClient, tmp_path: Path) -> None:
    wrote = await _run(sandboxed, {"command": "echo mine > note.txt"}, agent="default")
    assert wrote.startswith("exit code 0"), wrote
    other = await _run(sandboxed, {"command": "ls -A; cat note.txt"}, agent="ops")
    assert "mine" not in other, other
    work = tmp_path / "home" / "work"
    assert (work / "default" / "note.txt").read_text() == "mine\n"
    assert (work / "ops").is_dir() and not (work / "ops" / "note.txt").exists()
    assert {(work / a).stat().st_mode & 0o777 for a in ("default", "ops")} == {0o700}


async def test_a_work_folder_that_is_not_a_folder_of_the_bots_own_is_refused(
    sandboxed: GatewayClient, tmp_path: Path,
) -> None:
    """The old shared work folder may hold what earlier commands left, such as a link named like an agent:
    it never becomes that agent's work folder (it would mount what it points to, BOT_HOME itself here)."""
    from core.errors import ToolError

    home = tmp_path / "home"
    (home / "work" / "ops").symlink_to(home)
    with pytest.raises(ToolError, match="work folder"):
        await _run(sandboxed, {"command": "cat secret.key > stolen"}, agent="ops")
    with pytest.raises(ToolError, match="agent"):
        await _run(sandboxed, {"command": "touch escaped"}, agent="../x")
    assert not (home / "stolen").exists() and not (home / "x").exists()
    assert not (home / "work" / "escaped").exists()


def test_a_bot_home_inside_a_system_folder_is_hidden_whole() -> None:
    """The work folder is two below BOT_HOME now: what is hidden is BOT_HOME (its key, its database), not just
    the folder that holds the agents' work folders."""
    from bot.sandbox import Bubblewrap, Home

    # /usr/share stands for a BOT_HOME there (it must exist to be hidden); the work folder itself need not.
    argv = Bubblewrap("/usr/bin/bwrap", network=True).argv(["true"], Path("/usr/share/work/default"),
                                                           home=Home("/home/sandbox"))
    hidden = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--tmpfs"]
    assert "/usr/share" in hidden and "/home/sandbox" in hidden
    kept = Bubblewrap("/usr/bin/bwrap", network=True).argv(["true"], Path("/srv/bot/work/default"),
                                                           home=Home("/home/sandbox", Path("/srv/bot/homes/default")))
    assert ["--bind", "/srv/bot/homes/default", "/home/sandbox"] == kept[kept.index("/srv/bot/homes/default") - 1:][:3]


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

    from core.errors import ToolError

    work = sandboxed.app.settings.bot_home / "work" / "default"
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
    work = sandboxed.app.settings.bot_home / "work" / "default"
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
