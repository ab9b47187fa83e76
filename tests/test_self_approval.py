"""Separation of duties (SPEC §17 ``self_approval``): with it off, nobody whose words the turn took may approve
what it asks for (the asker, a steered-in sender; admins too), by any route (a Slack click, a vote, the web
chat); someone else's approval runs it; a sender may still deny; an operator from the CLI is exempt and audited as
such; and a setup nobody could approve is refused by `bot policies check`, `bot doctor` and at start."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bot.cli import main
from bot.errors import SettingsError
from core.policies import Policy, PolicyAction
from core.self_approval import REFUSED, Deciders, unsatisfiable
from tests.audit import audit_log
from tests.bot_process import run_cli, slack_env
from tests.conftest import GatewayClient
from tests.fakes.core import until
from tests.fakes.llm import FakeLLM, Gate, Reply
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import block_action, mention

CID = "0123456789abcdef0123456789abcdef"
JSON = {"Content-Type": "application/json"}


async def _start(make_settings: Any, start_gateway: Any, tmp_path: Path, rules: str = "",
                 **settings: Any) -> GatewayClient:
    config = tmp_path / "bot.toml"
    config.write_text(rules)
    gateway: GatewayClient = await start_gateway(make_settings(bot_config=config, **settings))
    return gateway


def _tool_results(fake_llm: FakeLLM) -> list[str]:
    return [str(m["content"]) for r in fake_llm.requests for m in r["messages"] if m["role"] == "tool"]


async def _card(fake_slack: FakeSlack, count: int = 1) -> tuple[str, str]:
    """The request id and the blocks (as text) of the ``count``-th post: the card."""
    card = (await fake_slack.wait_for("chat.postMessage", count))[count - 1]
    blocks = card.params["blocks"]
    return blocks[-1]["elements"][0]["value"], json.dumps(blocks)


async def _told(fake_slack: FakeSlack, count: int) -> str:
    return str((await fake_slack.wait_for("chat.postEphemeral", count))[count - 1].params["text"])


async def test_the_asker_may_not_approve_their_own_call_someone_else_may(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    gateway = await _start(make_settings, start_gateway, tmp_path,
                           '[[policies]]\ntool = "shell_run"\napprovers = ["requester", "U7"]\n'
                           'self_approval = false\n')
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo four-eyes"})]))
    await gateway.send_event(mention("run it", user="U1"))
    request_id, shown = await _card(fake_slack)
    assert "needs someone other than <@U1>" in shown
    await gateway.interact(block_action("approval:approve", request_id, user="U1"))
    assert await _told(fake_slack, 1) == REFUSED
    await gateway.interact(block_action("approval:always", request_id, user="U1"))  # no other way to say yes
    assert await _told(fake_slack, 2) == REFUSED
    stored = await gateway.app.approvals.get(int(request_id))
    assert len(fake_llm.requests) == 1 and stored is not None and stored.status == "pending"

    fake_llm.then(Reply("done"))
    await gateway.interact(block_action("approval:approve", request_id, user="U7"))
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    assert "four-eyes" in _tool_results(fake_llm)[-1]
    audit = await audit_log(gateway.app.approvals.store.db)
    refused = [a for a in audit if a.action == "approval.self_refused"]
    assert [a.actor for a in refused] == ["U1", "U1"]
    [approved] = [a for a in audit if a.action == "approval.approved"]
    assert approved.actor == "U7"


async def test_a_sender_steered_into_the_turn_may_not_approve_it_either(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """BOT_SELF_APPROVAL=false covers a call no rule decides; U2's words joined the turn at its tool step."""
    gateway = await _start(make_settings, start_gateway, tmp_path, bot_self_approval=False,
                           bot_approvers="U1,U2,U7", queue_mode="steer")
    gate = Gate(Reply(tool_calls=[("time_now", {})]))
    fake_llm.then(gate)
    root = mention("what time is it", user="U1")
    await gateway.send_event(root)
    await asyncio.wait_for(gate.reached.wait(), 10)
    await gateway.send_event(mention("then run echo steered", thread_ts=root["ts"], user="U2"))
    await until(lambda: len(fake_slack.of("reactions.add")) >= 2, what="the steered message is queued")
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo steered"})]))
    gate.opened.set()
    request_id, shown = await _card(fake_slack)
    assert "needs someone other than <@U1> and <@U2>" in shown
    await gateway.interact(block_action("approval:approve", request_id, user="U2"))
    assert await _told(fake_slack, 1) == REFUSED
    await gateway.interact(block_action("approval:approve", request_id, user="U1"))
    assert await _told(fake_slack, 2) == REFUSED
    stored = await gateway.app.approvals.get(int(request_id))
    assert stored is not None and stored.status == "pending" and set(stored.senders) >= {"U1", "U2"}

    fake_llm.then(Reply("done"))
    await gateway.interact(block_action("approval:approve", request_id, user="U7"))
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    assert "steered" in _tool_results(fake_llm)[-1]


async def test_a_second_slack_account_in_a_guest_role_cannot_approve_for_its_owner(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """Core cannot tell two accounts are one person; a guest account may approve nothing (core.trust), and a
    member's second account is someone else: keep approver lists to people you have verified."""
    fake_slack.people["UALT"] = {"is_restricted": True}
    gateway = await _start(make_settings, start_gateway, tmp_path, bot_self_approval=False,
                           bot_approvers="requester,UALT,U7")
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo alt"})]))
    await gateway.send_event(mention("run it", user="U1"))
    request_id, _shown = await _card(fake_slack)
    await gateway.interact(block_action("approval:approve", request_id, user="UALT"))
    assert "can't approve this" in await _told(fake_slack, 1) and "guest" in await _told(fake_slack, 1)
    stored = await gateway.app.approvals.get(int(request_id))
    assert stored is not None and stored.status == "pending" and len(fake_llm.requests) == 1


async def test_in_a_quorum_the_askers_vote_does_not_count_and_they_may_still_deny(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    gateway = await _start(make_settings, start_gateway, tmp_path,
                           '[[policies]]\ntool = "shell_run"\napprovers = ["U1", "U7", "U8"]\nquorum = 2\n'
                           'self_approval = false\n')
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo two-others"})]))
    await gateway.send_event(mention("run it", user="U1"))
    request_id, _shown = await _card(fake_slack)
    await gateway.interact(block_action("approval:approve", request_id, user="U1"))
    assert await _told(fake_slack, 1) == REFUSED
    await gateway.interact(block_action("approval:approve", request_id, user="U7"))
    assert await _told(fake_slack, 2) == "Your approval is counted: 1 of 2 approvals — U7."  # U1's never was
    fake_llm.then(Reply("done"))
    await gateway.interact(block_action("approval:approve", request_id, user="U8"))
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    assert "two-others" in _tool_results(fake_llm)[-1]

    # The asker may withdraw their own request: a deny by a sender settles it.
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo withdrawn"})]), Reply("not run"))
    await gateway.send_event(mention("run another", user="U1"))
    second, _shown = await _card(fake_slack, 3)
    request = await gateway.app.gateway.decide(int(second), "deny", "U1", "changed my mind", channel="slack")
    assert request.won
    await gateway.idle()
    assert "denied `shell_run`: changed my mind" in _tool_results(fake_llm)[-1]


async def test_admins_are_bound_too_and_an_operator_is_exempt_and_audited(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    gateway = await _start(make_settings, start_gateway, tmp_path, bot_self_approval=False, bot_admins="UADMIN",
                           approval_poll_s=0.05)
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo by-operator"})]))
    await gateway.send_event(mention("run it", user="UADMIN"))
    request_id, shown = await _card(fake_slack)
    assert "needs someone other than <@UADMIN>" in shown
    await gateway.interact(block_action("approval:approve", request_id, user="UADMIN"))
    assert await _told(fake_slack, 1) == REFUSED

    fake_llm.then(Reply("done"))
    settings = gateway.app.settings
    env = slack_env(fake_slack, fake_llm, 0) | {
        "DATABASE_URL": settings.resolved_database_url, "BOT_HOME": str(settings.bot_home),
        "BOT_ADMINS": "UADMIN", "BOT_SELF_APPROVAL": "false", "BOT_CONFIG": str(settings.bot_config)}
    code, out = await run_cli(tmp_path, env, "approvals", "approve", request_id)
    assert code == 0 and "Approved by operator" in out, out
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    assert "by-operator" in _tool_results(fake_llm)[-1]
    [approved] = [a for a in await audit_log(gateway.app.approvals.store.db) if a.action == "approval.approved"]
    assert approved.actor.startswith("operator")
    assert json.loads(approved.detail or "{}")["self_approval_exempt"] == "operator"


async def test_the_web_chat_cannot_approve_its_own_request(
    make_settings: Any, start_gateway: Any, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    gateway = await _start(make_settings, start_gateway, tmp_path, bot_self_approval=False, bot_admins="U9")
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo from-web"})]), Reply("not run"))
    async with gateway.http.post(f"{gateway.base}/api/conversations/{CID}/messages",
                                 data=json.dumps({"text": "run it"}), headers=JSON) as resp:
        assert resp.status < 300

    async def approvals() -> list[dict[str, Any]]:
        async with gateway.http.get(f"{gateway.base}/api/conversations/{CID}") as resp:
            return list((await resp.json(content_type=None))["approvals"])

    shown: list[dict[str, Any]] = []
    for _ in range(200):
        if shown := await approvals():
            break
        await asyncio.sleep(0.02)
    [approval] = shown
    assert approval["needs_other"] == "needs someone other than web"
    for verdict in ("approve", "always"):
        async with gateway.http.post(f"{gateway.base}/api/approvals/{approval['id']}",
                                     data=json.dumps({"verdict": verdict}), headers=JSON) as resp:
            assert resp.status == 403 and (await resp.json())["message"] == REFUSED
    async with gateway.http.post(f"{gateway.base}/api/approvals/{approval['id']}",
                                 data=json.dumps({"verdict": "deny", "reason": "no"}), headers=JSON) as resp:
        assert resp.status == 200 and (await resp.json())["won"]
    await gateway.idle()
    assert "the user denied `shell_run`: no;" in _tool_results(fake_llm)[-1]


async def test_an_always_allow_covers_everyone_but_the_person_who_gave_it(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """A grant is someone's approval: with self-approval off it does not cover the calls its giver asks for (nor
    one a person gave themselves before self-approval was turned off)."""
    gateway = await _start(make_settings, start_gateway, tmp_path, bot_self_approval=False, bot_approvers="U1,U7")
    call = {"command": "echo granted"}
    fake_llm.then(Reply(tool_calls=[("shell_run", call)]), Reply("ran"))
    await gateway.send_event(mention("run it", user="U1"))
    request_id, _shown = await _card(fake_slack)
    await gateway.interact(block_action("approval:always", request_id, user="U7"))
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()

    fake_llm.then(Reply(tool_calls=[("shell_run", call)]), Reply("ran again"))
    await gateway.send_event(mention("again", user="U1"))  # U7's grant: someone else approved it
    await fake_slack.wait_for("chat.postMessage", 3)
    await gateway.idle()
    assert len(fake_llm.requests) == 4 and "granted" in _tool_results(fake_llm)[-1]

    fake_llm.then(Reply(tool_calls=[("shell_run", call)]))
    await gateway.send_event(mention("mine too", user="U7"))  # U7's own call: their grant is not someone else's
    _second, shown = await _card(fake_slack, 4)
    assert "approval:approve" in shown and "needs someone other than <@U7>" in shown


# -- a setup nobody could approve ----------------------------------------------------------------------------

UNSATISFIABLE = '[[policies]]\ntool = "shell_run"\napprovers = ["requester"]\nself_approval = false\n'


def test_policies_check_refuses_a_rule_nobody_could_approve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "bot.toml"
    config.write_text(UNSATISFIABLE)
    monkeypatch.setenv("BOT_CONFIG", str(config))
    monkeypatch.setenv("BOT_HOME", str(tmp_path / "home"))
    assert main(["policies", "check", "shell_run", "echo hi"]) == 2
    err = capsys.readouterr().err
    assert "rule 1 (ask 'shell_run') refuses self-approval, and only the requester may approve it" in err
    monkeypatch.setenv("BOT_ADMINS", "U9")  # an admin may decide anything: someone can approve it
    assert main(["policies", "check", "shell_run", "echo hi"]) == 0
    monkeypatch.delenv("BOT_ADMINS")
    config.write_text("")
    monkeypatch.setenv("BOT_SELF_APPROVAL", "false")  # every call no rule decides, with BOT_APPROVERS=requester
    assert main(["policies", "check", "shell_run", "echo hi"]) == 2
    assert "BOT_SELF_APPROVAL=false, and only the requester may approve agent 'default'" in capsys.readouterr().err
    monkeypatch.setenv("BOT_APPROVERS", "requester,U7")
    assert main(["policies", "check", "shell_run", "echo hi"]) == 0
    capsys.readouterr()
    config.write_text('[[policies]]\ntool = "shell_run"\napprovers = ["U7", "U8"]\nquorum = 2\n')
    assert main(["policies", "check", "shell_run", "echo hi"]) == 0  # said, not refused: U9 may ask
    assert "warning: rule 1 (ask 'shell_run') needs 2 of its 2 named approvers" in capsys.readouterr().out


def test_who_could_approve_is_read_from_the_rule_the_agents_and_those_who_join_later() -> None:
    ask = Policy(tool="shell_run", approvers=("requester",), self_approval=False)
    ops = Deciders("ops", ("U7",))
    lone = Deciders("lone", ("requester",))
    assert len(unsatisfiable([ask], [ops], admins=(), default=True)) == 1  # the rule's own approvers
    assert unsatisfiable([replace(ask, escalate_to=("U8",), remind_after_s=60)], [ops], admins=(), default=True) == []
    assert unsatisfiable([ask], [ops], admins=("UADMIN",), default=True) == []
    unnamed = Policy(tool="shell_run", self_approval=False)  # the agent's approvers
    [line] = unsatisfiable([unnamed], [ops, lone], admins=(), default=True)
    assert "for agent 'lone'" in line
    assert unsatisfiable([replace(unnamed, self_approval=None)], [lone], admins=(), default=True) == []
    assert len(unsatisfiable([replace(unnamed, self_approval=None)], [lone], admins=(), default=False)) == 2
    assert unsatisfiable([replace(ask, action=PolicyAction.DENY, approvers=())], [ops], admins=(), default=True) == []


async def test_doctor_and_start_refuse_a_rule_nobody_could_approve(
    tmp_path: Path, fake_slack: FakeSlack, fake_llm: FakeLLM, make_settings: Any
) -> None:
    (tmp_path / "bot.toml").write_text(UNSATISFIABLE)
    env = slack_env(fake_slack, fake_llm, 3000) | {"BOT_SECRET_KEYS": "k1:" + "A" * 43 + "="}
    code, out = await run_cli(tmp_path, env, "doctor")
    assert code != 0
    [line] = [line for line in out.splitlines() if line.startswith("✗ self-approval:")]
    assert "nobody could ever approve it" in line, out
    from bot.app import build_application

    with pytest.raises(SettingsError, match="refuses self-approval, and only the requester may approve it"):
        build_application(make_settings(bot_config=tmp_path / "bot.toml"))
