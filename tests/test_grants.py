"""Scoped, expiring grants (issue 40.2, SPEC §17 "Grants and `ask` rules") through the real Slack app and the
web chat: **Allow in this thread** covers the exact call in that conversation only, **Always allow** the channel;
a rule with ``grant_ttl_s`` offers both and its grants expire (the injectable clock, no sleeps); a rule without
it offers neither; ``bot approvals grants`` shows each grant's scope, expiry and revocation."""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from bot.cli import main
from bot.config.file import load_policies
from bot.errors import SettingsError
from bot.policy_check import flag_warnings
from core.policies import Policy
from core.trust import NOT_ALLOWED
from tests.audit import audit_log
from tests.bot_process import run_cli
from tests.conftest import GatewayClient
from tests.fakes.core import ShiftedClock
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.slack_api import Call, FakeSlack
from tests.slack_requests import block_action, command_body, mention

BOTH = ["Approve", "Deny", "Always allow", "Allow in this thread", "Edit"]  # Edit: issue 40.3


@pytest.fixture(autouse=True)
def _process_database(database_url: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    if database_url:  # `bot approvals grants` reads the same database as the app
        monkeypatch.setenv("BOT_PROCESS_DATABASE_URL", database_url)


def _cards(fake_slack: FakeSlack) -> list[Call]:
    return [c for c in fake_slack.posts() if "approval:approve" in json.dumps(c.params.get("blocks") or [])]


def _buttons(card: Call) -> list[str]:
    return [b["text"]["text"] for b in card.params["blocks"][-1]["elements"]]


def _request_id(card: Call) -> str:
    return str(card.params["blocks"][-1]["elements"][0]["value"])


async def _until(condition: Any, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


async def _call(gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM, command: str, *,
                channel: str = "C1", thread_ts: str | None = None) -> tuple[str, Call | None]:
    """The model calls shell_run with ``command`` in a new thread (or the thread ``thread_ts``): returns the
    thread's ts and the approval card it asked with, or None when it ran unasked (then the turn has finished)."""
    cards, answer = len(_cards(fake_slack)), f"ran {command} {len(fake_slack.posts())}"
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": command})]), Reply(answer))
    event = mention("run it", channel=channel, thread_ts=thread_ts)
    await gateway.send_event(event)
    await _until(lambda: len(_cards(fake_slack)) > cards or any(c.params.get("text") == answer
                                                                 for c in fake_slack.posts()))
    thread = thread_ts or str(event["ts"])
    if len(_cards(fake_slack)) > cards:
        return thread, _cards(fake_slack)[-1]
    await gateway.idle()
    return thread, None


async def _click(gateway: GatewayClient, fake_slack: FakeSlack, card: Call, verdict: str, user: str = "U1") -> None:
    """Click ``verdict`` on ``card``; the call runs and its turn finishes."""
    updates = len(fake_slack.of("chat.update"))
    await gateway.interact(block_action(f"approval:{verdict}", _request_id(card), user=user))
    await fake_slack.wait_for("chat.update", updates + 1)
    await gateway.idle()


async def _dismiss(gateway: GatewayClient, card: Call) -> None:
    """An operator denies the card (its turn then finishes): it was asked, which is all a test wanted to see."""
    await gateway.app.approvals.decide(int(_request_id(card)), "deny", by="test", operator=True)
    await gateway.idle()


async def _start(make_settings: Any, start_gateway: Any, tmp_path: Path, rules: str = "", clock: Any = None,
                 **settings: Any) -> GatewayClient:
    config = tmp_path / "bot.toml"
    config.write_text(rules)
    gateway: GatewayClient = await start_gateway(make_settings(bot_config=config, **settings), clock=clock)
    return gateway


async def test_allow_in_this_thread_covers_that_exact_call_in_that_thread_only(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    gateway = await _start(make_settings, start_gateway, tmp_path, bot_admins="UADMIN")
    thread, card = await _call(gateway, fake_slack, fake_llm, "uptime")
    assert card is not None and _buttons(card) == BOTH
    for verdict in ("thread", "always"):  # someone who may not decide: told so, and nothing is granted
        await gateway.interact(block_action(f"approval:{verdict}", _request_id(card), user="U9"))
    await fake_slack.wait_for("chat.postEphemeral", 2)
    assert all("can't approve" in told for told in fake_slack.ephemerals("U9"))
    assert await gateway.app.approvals.store.grants(include_revoked=True) == []
    await _click(gateway, fake_slack, card, "thread")
    assert "Allowed in this thread by <@U1>" in json.dumps(fake_slack.of("chat.update")[-1].params["blocks"])

    # The same call again in that thread runs unasked...
    assert (await _call(gateway, fake_slack, fake_llm, "uptime", thread_ts=thread))[1] is None
    # ...another argument there is asked about...
    _same, card = await _call(gateway, fake_slack, fake_llm, "uptime -p", thread_ts=thread)
    assert card is not None
    await _dismiss(gateway, card)
    # ...and so is the same call in another thread of the same channel.
    other, card = await _call(gateway, fake_slack, fake_llm, "uptime")
    assert other != thread and card is not None
    await _click(gateway, fake_slack, card, "always")  # Always allow: the whole channel from now on
    assert "Always allowed by <@U1>" in json.dumps(fake_slack.of("chat.update")[-1].params["blocks"])
    assert (await _call(gateway, fake_slack, fake_llm, "uptime"))[1] is None  # a third thread
    _elsewhere, card = await _call(gateway, fake_slack, fake_llm, "uptime", channel="C2")  # not another channel
    assert card is not None
    await _dismiss(gateway, card)

    # Both grants are listed with their scope; the thread one can be revoked and the call asks there again.
    listing = await (await gateway.interact(command_body("approvals", user="UADMIN"))).text()
    assert "1: agent `default` may run `shell_run` in one thread of <#C1> (by <@U1>), exactly" in listing
    assert "2: agent `default` may run `shell_run` in <#C1> (by <@U1>), exactly" in listing
    audit = [json.loads(r.detail or "{}") for r in await audit_log(gateway.app.db) if r.action == "grant.created"]
    assert [(a["scope"], a["expires_at"], a["rule"]) for a in audit] == [("thread", None, None), ("place", None, None)]
    assert audit[0]["thread"] == f"slack:T1:C1:{thread}" and audit[1]["thread"] is None
    assert "revoked" in await (await gateway.interact(command_body("approvals revoke 2", user="UADMIN"))).text()
    assert "revoked" in await (await gateway.interact(command_body("approvals revoke 1", user="UADMIN"))).text()
    _same, card = await _call(gateway, fake_slack, fake_llm, "uptime", thread_ts=thread)
    assert card is not None
    await _dismiss(gateway, card)


async def test_a_thread_grant_is_the_threads_own_sub_agents_included_and_one_agents_only(
    gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    thread, card = await _call(gateway, fake_slack, fake_llm, "uptime")
    assert card is not None
    await _click(gateway, fake_slack, card, "thread")
    broker, session = gateway.app.approvals, f"slack:T1:C1:{thread}"
    asked: dict[str, Any] = {"agent": "default", "tool": "shell_run", "place": "slack:T1:C1",
                             "args": {"command": "uptime"}}
    assert await broker.granted(**asked, session_id=session)
    assert await broker.granted(**asked, session_id=f"sub:{session}:1")  # a sub-agent's session of that thread
    assert not await broker.granted(**asked, session_id="slack:T1:C1:1.000001")  # another thread
    assert not await broker.granted(**asked, session_id="sub:slack:T1:C1:1.000001:1")
    assert not await broker.granted(**asked)  # no conversation (e.g. a schedule's destination)
    assert not await broker.granted(**{**asked, "agent": "ops"}, session_id=session)  # another agent
    assert not await broker.granted(**{**asked, "place": "slack:T1:C2"}, session_id=session)
    # A grant is its maker's one decision: where they may not approve their own call, it never does.
    assert not await broker.granted(**asked, session_id=session, not_by=("U1",))
    assert await broker.granted(**asked, session_id=session, not_by=("U2",))
    # Made under no rule: a call a rule decides never finds it (the rule's approvers are not skipped).
    assert not await broker.granted(**asked, session_id=session, policy=Policy("shell_run", grant_ttl_s=60))


async def test_a_grant_ttl_rule_offers_both_grants_and_they_expire(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    clock = ShiftedClock()
    (tmp_path / "bot.toml").write_text('[[policies]]\ntool = "shell_run"\nmatch = "uptime*"\ngrant_ttl_s = 3600\n')
    settings = make_settings(bot_config=tmp_path / "bot.toml")
    gateway = await start_gateway(settings, clock=clock)
    _thread, card = await _call(gateway, fake_slack, fake_llm, "uptime")
    assert card is not None and _buttons(card) == BOTH and "a grant lasts 1 hour" in json.dumps(card.params)
    granted_at = clock.now()
    await _click(gateway, fake_slack, card, "always")
    assert "Allowed here for 1 hour by <@U1>" in json.dumps(fake_slack.of("chat.update")[-1].params["blocks"])
    assert (await _call(gateway, fake_slack, fake_llm, "uptime"))[1] is None  # covered, in another thread too

    [grant] = await gateway.app.approvals.grants()
    assert grant.expires_at is not None and abs(grant.expires_at - granted_at - timedelta(hours=1)) < \
        timedelta(seconds=5)
    assert grant.rule is not None and grant.rule.startswith("rule 1 (ask 'shell_run' matching 'uptime*')")
    [created] = [r for r in await audit_log(gateway.app.db) if r.action == "grant.created"]
    assert json.loads(created.detail or "{}")["expires_at"] == grant.expires_at.isoformat()

    # A grant made under the rule is that rule's only: not another rule's, nor the same rule once edited.
    asked: dict[str, Any] = {"agent": "default", "tool": "shell_run", "place": "slack:T1:C1",
                             "args": {"command": "uptime"}}
    rule = gateway.app.approvals.policies.policies[0]
    assert await gateway.app.approvals.granted(**asked, policy=rule)
    assert not await gateway.app.approvals.granted(**asked)  # a call no rule decides
    for stricter in (replace(rule, approvers=("U9",)), replace(rule, grant_ttl_s=60), replace(rule, number=2),
                     replace(rule, match="*")):
        assert not await gateway.app.approvals.granted(**asked, policy=stricter), stricter

    clock.jump_to(grant.expires_at + timedelta(seconds=1))  # the hour is up: asked again, with a new card
    _thread, card = await _call(gateway, fake_slack, fake_llm, "uptime")
    assert card is not None and _buttons(card) == BOTH
    assert await gateway.app.approvals.grants() == []  # no longer active...
    await _dismiss(gateway, card)

    [listed] = await gateway.app.approvals.grants(every=True)  # ...but still listed for the operator, marked
    assert listed.expiry(clock.now()) == f"expired {grant.expires_at:%Y-%m-%d %H:%M} UTC"

    # The operator's listing (its own clock: the real one, before the hour is up) shows scope, expiry, revocation.
    env = {"BOT_HOME": str(settings.bot_home)}
    if os.environ.get("BOT_PROCESS_DATABASE_URL"):
        env["DATABASE_URL"] = os.environ["BOT_PROCESS_DATABASE_URL"]
    code, out = await run_cli(tmp_path, env, "approvals", "grants")
    [line] = out.splitlines()
    assert code == 0 and line.startswith("1\tagent default\ttool shell_run\tscope place slack:T1:C1\tby U1 at ")
    assert line.endswith(f"\texpires {grant.expires_at:%Y-%m-%d %H:%M} UTC\tnot revoked\tcall uptime")
    assert (await run_cli(tmp_path, env, "approvals", "revoke", "1"))[0] == 0
    code, out = await run_cli(tmp_path, env, "approvals", "grants")
    assert code == 0 and "\trevoked by " in out and "\tcall uptime" in out


async def test_rules_without_grant_ttl_or_with_a_quorum_offer_no_grant(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    gateway = await _start(make_settings, start_gateway, tmp_path,
                           '[[policies]]\ntool = "shell_run"\nmatch = "uptime"\n\n'
                           '[[policies]]\ntool = "shell_run"\nmatch = "date"\napprovers = ["U7", "U8"]\nquorum = 2\n'
                           'grant_ttl_s = 3600\n')
    _thread, card = await _call(gateway, fake_slack, fake_llm, "uptime")
    assert card is not None and _buttons(card) == ["Approve", "Deny", "Edit"]
    await _click(gateway, fake_slack, card, "thread")  # a forged grant button: a plain approval, no grant
    assert "Approved by <@U1>" in json.dumps(fake_slack.of("chat.update")[-1].params["blocks"])
    _thread, card = await _call(gateway, fake_slack, fake_llm, "uptime")  # asked again
    assert card is not None
    await _dismiss(gateway, card)

    _thread, card = await _call(gateway, fake_slack, fake_llm, "date")
    assert card is not None and _buttons(card) == ["Approve", "Deny"]  # a grant never stands for a quorum (nor an edit)
    for voter in ("U7", "U8"):  # each grant button counts as one approval, and records nothing
        await gateway.interact(block_action("approval:thread", _request_id(card), user=voter))
    await gateway.idle()
    assert "Approved by <@U7> and <@U8>" in json.dumps(fake_slack.of("chat.update")[-1].params["blocks"])
    assert await gateway.app.approvals.store.grants(include_revoked=True) == []


async def test_allow_in_this_thread_in_the_web_chat(gateway: GatewayClient, fake_llm: FakeLLM) -> None:
    cid = "0123456789abcdef0123456789abcdef"

    async def post(path: str, body: Any) -> tuple[int, Any]:
        async with gateway.http.post(f"{gateway.base}{path}", json=body) as resp:
            return resp.status, await resp.json()

    async def approvals() -> list[dict[str, Any]]:
        return list((await conversation())["approvals"])

    async def conversation() -> dict[str, Any]:
        async with gateway.http.get(f"{gateway.base}/api/conversations/{cid}") as resp:
            return dict(await resp.json(content_type=None))

    async def ask(command: str) -> list[dict[str, Any]]:
        """The model calls shell_run: the new approvals it asked with (none: it ran, and answered)."""
        before = len(await approvals())
        answer = f"done {command} {before}"
        fake_llm.then(Reply(tool_calls=[("shell_run", {"command": command})]), Reply(answer))
        await post(f"/api/conversations/{cid}/messages", {"text": "run it"})
        async with asyncio.timeout(10):
            while True:
                conv = await conversation()
                if len(conv["approvals"]) > before or any(m["content"] == answer for m in conv["messages"]):
                    break
                await asyncio.sleep(0.01)
        return list(conv["approvals"][before:])

    [approval] = await ask("echo web")
    assert (approval["grantable"], approval["thread_grantable"], approval["grant_ttl_s"]) == (True, True, None)
    status, body = await post(f"/api/approvals/{approval['id']}", {"verdict": "thread"})
    assert (status, body["won"]) == (200, True)
    await gateway.idle()
    assert (await approvals())[0]["summary"] == "Allowed in this thread by web"
    assert await ask("echo web") == []  # ran unasked in this conversation
    await gateway.idle()
    [grant] = await gateway.app.approvals.grants()
    assert grant.thread == f"web:{cid}" and grant.expires_at is None
    assert "Allow in this thread" in (Path(__file__).parent.parent / "channels/web/static/app.js").read_text()


def test_grant_ttl_s_is_read_checked_and_told_by_the_dry_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bot.toml"
    for text, problem in [('action = "allow"\ngrant_ttl_s = 60\n', "only apply to rules that ask"),
                          ("grant_ttl_s = 0\n", "grant_ttl_s"), ("grant_ttl_s = 1e9\n", "grant_ttl_s")]:
        path.write_text(f'[[policies]]\ntool = "shell_run"\n{text}')
        with pytest.raises(SettingsError, match=problem):
            load_policies(path)
    path.write_text('[[policies]]\ntool = "shell_run"\nmatch = "uptime"\ngrant_ttl_s = 7200\n\n'
                    '[[policies]]\ntool = "shell_run"\nmatch = "date"\n\n'
                    '[[policies]]\ntool = "shell_run"\nmatch = "who"\napprovers = ["U1", "U2"]\nquorum = 2\n'
                    'grant_ttl_s = 60\n')
    first, _second, third = load_policies(path)
    assert (first.grant_ttl_s, third.grant_ttl_s) == (7200, 60)
    assert flag_warnings([third]) == ["rule 3 (ask 'shell_run' matching 'who') sets grant_ttl_s, but its quorum is 2: "
                                      "its requests offer no grant (a grant stands for one person's decision), so "
                                      "grant_ttl_s does nothing"]
    monkeypatch.setenv("BOT_CONFIG", str(path))
    monkeypatch.setenv("BOT_HOME", str(tmp_path / "home"))
    told: dict[str, str] = {}
    for command in ("uptime", "date", "who", "ls"):
        assert main(["policies", "check", "shell_run", command]) == 0
        told[command] = next(line for line in capsys.readouterr().out.splitlines() if "grants:" in line)
    assert told["uptime"] == "  grants: Always allow (this channel) and Allow in this thread, each for 2 hours"
    assert told["date"] == told["who"] == ("  grants: none (Always allow and Allow in this thread need grant_ttl_s "
                                           "and quorum 1 on a rule)")
    assert told["ls"] == "  grants: Always allow (this channel) and Allow in this thread, for good"


async def test_a_grant_never_raises_a_turns_trust(
    gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    """A member's thread grant does not let a guest's words in that thread run the call: refused before any grant
    is looked at, and nobody is asked."""
    fake_slack.people["UGUEST"] = {"is_restricted": True}
    thread, card = await _call(gateway, fake_slack, fake_llm, "uptime")
    assert card is not None
    await _click(gateway, fake_slack, card, "thread")
    cards = len(_cards(fake_slack))
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "uptime"})]), Reply("guest turn over"))
    await gateway.send_event(mention("run uptime again", user="UGUEST", thread_ts=thread))
    await _until(lambda: any(c.params.get("text") == "guest turn over" for c in fake_slack.posts()))
    await gateway.idle()
    told = [str(m["content"]) for m in fake_llm.requests[-1]["messages"] if m["role"] == "tool"][-1]
    assert f"{NOT_ALLOWED} (guest)" in told and len(_cards(fake_slack)) == cards
