"""Commands nobody was asked about and the ones people approve must not configure each other (issue 32, point 7,
and what its attack review found): an approved command's HOME is the agent's kept one, never the work folder an
allow rule's command writes to; the flag warning reads character classes and git's program-running flags; and
BOT_HOME stays hidden from the sandbox whatever links lead from it. Each test failed before its fix."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from core.policies import Policy, PolicyAction, PolicyBook
from core.tools import Risk
from tests.conftest import GatewayClient
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.slack_api import FakeSlack
from tests.security.test_sandbox import BWRAP, REQUIRED, allowing
from tests.slack_requests import block_action, mention

# -- point 7: a command an allow rule runs unasked plants a dotfile that a person-approved command then loads ----

# `git log *` is the README's own example of a glob that admits --output=FILE; --format makes the file's text.
PLANT = {"command": "git log -1 '--format=[core]%n%x09fsmonitor = touch pwned%n' --output=.gitconfig"}
APPROVED = {"command": "git status --short"}  # what the approver reads on the card: harmless


@pytest.fixture(params=["bwrap", "none"])
async def git_log_allowed(request: pytest.FixtureRequest, make_settings: Any, start_gateway: Any,
                          tmp_path: Path) -> GatewayClient:
    return await allowing("git log *", request.param, make_settings, start_gateway, tmp_path)


async def test_an_unasked_command_cannot_plant_a_dotfile_that_an_approved_command_loads(
    git_log_allowed: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path,
) -> None:
    """The fresh HOME protected unasked commands from what approved ones left, but not the other way round: an
    approved command's HOME was the work folder, which every unasked command can write. So whatever an
    allow rule admits that writes a file (git log --output, curl -o …) sets up the next *approved* command,
    the one a person read, with that person's trust and the credentials the call names."""
    work = tmp_path / "home" / "work" / "default"
    work.mkdir(parents=True, mode=0o700)
    git = ["git", "-c", "user.name=a", "-c", "user.email=a@b"]
    # as an approved `git clone … .` earlier would have left it
    await asyncio.to_thread(subprocess.run, ["git", "init", "-q", str(work)], check=True)
    await asyncio.to_thread(subprocess.run, [*git, "-C", str(work), "commit", "-q", "--allow-empty", "-m", "x"],
                            check=True)

    fake_llm.then(Reply(tool_calls=[("shell_run", PLANT)]), Reply(tool_calls=[("shell_run", APPROVED)]))
    await git_log_allowed.send_event(mention("what changed?"))
    [card] = await fake_slack.wait_for("chat.postMessage")  # only the second call is asked about
    assert "git status" in json.dumps(card.params)
    fake_llm.then(Reply("done"))
    approve = str(card.params["blocks"][-1]["elements"][0]["value"])
    await git_log_allowed.interact(block_action("approval:approve", approve))
    await fake_slack.wait_for("chat.postMessage", 2)
    await git_log_allowed.idle()
    assert (work / ".gitconfig").exists()  # written by the command nobody was asked about
    assert not (work / "pwned").exists(), "the approved `git status` ran a program an unasked command configured"


# -- point 7: the flag warning (bot policies check, doctor, start) -------------------------------------------

@pytest.mark.parametrize(("match", "call"), [
    # A character class hides every flag from the check, but the glob still admits them.
    ("kubectl get [a-z]*", "kubectl get p --kubeconfig=/work/x"),
    ("kubectl get pods -[no] *", "kubectl get pods -n --kubeconfig=/work/x"),
    # git flags after the subcommand that run a program named by the call (one an approved command left in /work).
    ("git grep *", "git grep -O/work/run.sh TODO"),
    ("git ls-remote *", "git ls-remote --upload-pack=/work/run.sh origin"),
    ("git clone *", "git clone -u /work/run.sh /work/repo copy"),
    ("git fetch *", "git fetch --upload-pack=/work/run.sh origin"),
])
def test_an_allow_glob_that_admits_a_file_loading_flag_is_always_named(match: str, call: str) -> None:
    from bot.policy_check import flag_warnings

    rule = Policy(tool="shell_run", match=match, action=PolicyAction.ALLOW)
    assert PolicyBook([rule]).rule("shell_run", {"command": call}, risk=Risk.GATED).action is PolicyAction.ALLOW
    assert flag_warnings([rule]), f"{match!r} runs {call!r} unasked, and nothing warns"


# -- point 7 / SPEC §13: BOT_HOME hidden from the sandbox in every layout ---------------------------------------

@pytest.fixture
def bot_home_in_usr(tmp_path: Path) -> Any:
    """BOT_HOME under /usr (e.g. /usr/local/var/bot), its work folder an operator's link to another disk (which
    bot.tools.shell says it allows). Needs root to make a folder under /usr."""
    import os
    import shutil
    import tempfile

    if os.geteuid() != 0 or not os.access("/usr/local/share", os.W_OK):
        pytest.skip("making a BOT_HOME under /usr needs root")
    home = Path(tempfile.mkdtemp(prefix="bot-attack2-", dir="/usr/local/share"))
    (tmp_path / "disk" / "work").mkdir(parents=True, mode=0o700)
    (home / "work").symlink_to(tmp_path / "disk" / "work")
    yield home
    shutil.rmtree(home, ignore_errors=True)


async def test_bot_home_stays_hidden_when_its_work_folder_is_a_link(
    bot_home_in_usr: Path, make_settings: Any, start_gateway: Any, tmp_path: Path,
) -> None:
    from tests.security.test_sandbox import _output, _run

    if not BWRAP and not REQUIRED:
        pytest.skip("bubblewrap is missing or cannot run here")
    gateway: GatewayClient = await start_gateway(make_settings(shell_sandbox="bwrap", bot_home=bot_home_in_usr))
    key = (bot_home_in_usr / "secret.key").read_text().strip()
    # Even a command an allow rule runs unasked: nobody looked at it.
    out = _output(await _run(gateway, {"command": f"cat {bot_home_in_usr}/secret.key; ls {bot_home_in_usr}"},
                             asked=False))
    assert key not in out, "the sandbox reads BOT_HOME's secret.key"
