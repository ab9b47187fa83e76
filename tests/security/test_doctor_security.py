"""``bot doctor`` reports the sandbox in effect, the egress policy, and approvers that let anyone in a
channel approve their own shell commands (issue 12, point 12)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bot_process import run_cli, slack_env
from tests.fakes.llm import FakeLLM
from tests.fakes.slack_api import FakeSlack
from tests.security.test_sandbox import BWRAP, REQUIRED, _fake_bin

KEYS = {"BOT_SECRET_KEYS": "k1:" + "A" * 43 + "="}


async def _doctor(tmp_path: Path, fake_slack: FakeSlack, fake_llm: FakeLLM, **env: str) -> str:
    code, out = await run_cli(tmp_path, slack_env(fake_slack, fake_llm, 3000) | KEYS | env, "doctor")
    assert "Traceback" not in out, out
    assert code == 0, out  # none of these is a failure: the bot starts, with or without shell_run
    return out


def _line(out: str, name: str) -> str:
    found = [line for line in out.splitlines() if line[2:].startswith(name + ":")]
    assert len(found) == 1, out
    following = out.splitlines()[out.splitlines().index(found[0]) + 1]
    return found[0] + ("\n" + following if following.startswith("  fix:") else "")


@pytest.mark.skipif(not BWRAP and not REQUIRED, reason="bubblewrap is missing or cannot run here")
async def test_working_sandbox_default_egress_and_requester_only_approvers(
    tmp_path: Path, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    out = await _doctor(tmp_path, fake_slack, fake_llm)
    assert _line(out, "sandbox").startswith("✓ sandbox: bubblewrap"), out
    assert _line(out, "egress") == ("✓ egress: http_request refuses loopback, private and link-local addresses; "
                                    "never this bot's own listener"), out
    approvers = _line(out, "approvers")
    assert approvers.startswith("! approvers: ") and "BOT_APPROVERS" in approvers and "requester" in approvers
    assert "approve their own shell commands" in approvers and "fix:" in approvers

    named = await _doctor(tmp_path, fake_slack, fake_llm, BOT_APPROVERS="U0OPS")
    assert "approvers:" not in named


@pytest.mark.parametrize("broken_bwrap", [False, True])
async def test_without_bubblewrap_doctor_says_how_to_fix_it(
    tmp_path: Path, fake_slack: FakeSlack, fake_llm: FakeLLM, broken_bwrap: bool
) -> None:
    out = await _doctor(tmp_path, fake_slack, fake_llm, PATH=_fake_bin(tmp_path, broken_bwrap=broken_bwrap))
    line = _line(out, "sandbox")
    assert line.startswith("! sandbox: shell_run is off"), out
    assert "install bubblewrap" in line and "SHELL_SANDBOX=none" in line
    assert "approvers:" not in out  # shell_run is off: nothing to approve


async def test_shell_sandbox_none_and_lifted_egress_are_warnings(
    tmp_path: Path, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    out = await _doctor(tmp_path, fake_slack, fake_llm, SHELL_SANDBOX="none", HTTP_ALLOW_PRIVATE="true")
    assert _line(out, "sandbox").startswith("! sandbox: SHELL_SANDBOX=none"), out
    assert "unsandboxed" in _line(out, "sandbox")
    egress = _line(out, "egress")
    assert egress.startswith("! egress:") and "HTTP_ALLOW_PRIVATE=true" in egress and "lifted" in egress
    assert _line(out, "approvers").startswith("! approvers:")  # shell_run is on (unsandboxed)

    hosts = await _doctor(tmp_path, fake_slack, fake_llm, SHELL_SANDBOX="none",
                          HTTP_ALLOW_HOSTS="grafana.internal,10.0.0.12")
    egress = _line(hosts, "egress")
    assert egress.startswith("✓ egress: http_request refuses loopback, private and link-local addresses")
    assert "except grafana.internal, 10.0.0.12" in egress
