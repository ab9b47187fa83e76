"""On-call approvers (issue 40.4, SPEC §17): ``oncall:<schedule id>`` approvers are whoever PagerDuty has on call
when the request is made (a fake PagerDuty REST API here), matched to Slack users by e-mail. The people are written
on the request; a rota that cannot be read falls back to ``escalate_to`` or refuses the call, and never lets
anyone else decide."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bot.app import build_application
from bot.channels import installed_channels
from bot.config.file import load_config
from bot.errors import SettingsError
from bot.oncall import MAX_BODY_BYTES, PagerDutyRota, pagerduty_client
from channels.slack.manifest import build_manifest
from core.oncall import RotaUnavailable, on_call
from tests.audit import audit_log
from tests.bot_process import run_cli, slack_env
from tests.conftest import GatewayClient
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.pagerduty import TOKEN, FakePagerDuty
from tests.fakes.server import RunningServer
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import block_action, mention

SCHEDULE = "P1ONCALL"


@pytest.fixture
async def fake_pagerduty() -> AsyncIterator[FakePagerDuty]:
    fake = FakePagerDuty()
    server = await RunningServer(fake.app()).start()
    fake.url = server.url
    yield fake
    await server.stop()


async def _start(make_settings: Any, start_gateway: Any, tmp_path: Path, pagerduty: FakePagerDuty, rules: str,
                 **settings: Any) -> GatewayClient:
    config = tmp_path / "bot.toml"
    config.write_text(rules)
    gateway: GatewayClient = await start_gateway(make_settings(
        bot_config=config, pagerduty_token=TOKEN, pagerduty_api_url=pagerduty.url, **settings))
    return gateway


def _tool_result(fake_llm: FakeLLM, index: int = 1) -> str:
    message = fake_llm.requests[index]["messages"][-1]
    assert message["role"] == "tool"
    return str(message["content"])


RULE = f'[[policies]]\ntool = "shell_run"\napprovers = ["oncall:{SCHEDULE}"]\n'


async def test_the_person_on_call_approves_and_nobody_else_may(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path,
    fake_pagerduty: FakePagerDuty,
) -> None:
    fake_pagerduty.on_call[SCHEDULE] = ["Alice@Example.com", "gina@example.com", "bot@example.com"]
    fake_slack.emails = {"alice@example.com": "U7", "gina@example.com": "U8", "bot@example.com": "U9"}
    fake_slack.people = {"U8": {"is_restricted": True}, "U9": {"is_bot": True}}  # a guest and a bot on call
    gateway = await _start(make_settings, start_gateway, tmp_path, fake_pagerduty, RULE)
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo on-call-ok"})]), Reply("done"))
    await gateway.send_event(mention("restart it"))
    [card] = await fake_slack.wait_for("chat.postMessage")
    request_id = card.params["blocks"][-1]["elements"][0]["value"]
    request = await gateway.app.approvals.get(int(request_id))
    assert request is not None and request.approvers == ("slack:U7",)  # who was on call, written on the request
    assert " · for <@U7> · expires" in json.dumps(card.params["blocks"], ensure_ascii=False)  # named on the card
    [read] = [r for r in fake_pagerduty.requests if r.path == f"/schedules/{SCHEDULE}/users"]
    assert read.authorization == f"Token token={TOKEN}" and read.query["since"] and read.query["until"]

    for outsider in ("U1", "U8", "U9"):  # the requester, the guest on call, the bot on call
        await gateway.interact(block_action("approval:approve", request_id, user=outsider))
    told = await fake_slack.wait_for("chat.postEphemeral", 3)
    assert all("can't approve" in t.params["text"] for t in told)
    await gateway.interact(block_action("approval:approve", request_id, user="U7"))
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    assert "on-call-ok" in _tool_result(fake_llm) and "exit code 0" in _tool_result(fake_llm)
    assert "Approved by <@U7>" in json.dumps(fake_slack.of("chat.update")[-1].params["blocks"])


async def test_a_rota_that_cannot_be_read_falls_back_to_escalate_to_and_says_so(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path,
    fake_pagerduty: FakePagerDuty,
) -> None:
    fake_pagerduty.status = 500
    gateway = await _start(make_settings, start_gateway, tmp_path, fake_pagerduty,
                           RULE + 'escalate_to = ["U5"]\nremind_after_s = 300\n')
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo escalated"})]), Reply("done"))
    await gateway.send_event(mention("restart it"))
    posted = await fake_slack.wait_for("chat.postMessage", 2)
    notice = next(p for p in posted if "blocks" not in p.params or "approval:approve" not in json.dumps(p.params))
    assert "could not be read" in notice.params["text"] and SCHEDULE in notice.params["text"]
    assert "escalate_to" in notice.params["text"] and "HTTP 500" in notice.params["text"]
    card = next(p for p in posted if "approval:approve" in json.dumps(p.params.get("blocks")))
    request_id = card.params["blocks"][-1]["elements"][0]["value"]
    request = await gateway.app.approvals.get(int(request_id))
    assert request is not None and request.approvers == ("U5",)  # they joined at once

    await gateway.interact(block_action("approval:approve", request_id, user="U1"))  # still not "anyone"
    assert "can't approve" in (await fake_slack.wait_for("chat.postEphemeral"))[0].params["text"]
    await gateway.interact(block_action("approval:approve", request_id, user="U5"))
    await fake_slack.wait_for("chat.postMessage", 3)
    await gateway.idle()
    assert "escalated" in _tool_result(fake_llm)
    audit = [a for a in await audit_log(gateway.app.approvals.store.db) if a.action == "approval.oncall_unavailable"]
    assert len(audit) == 1 and SCHEDULE in str(audit[0].detail) and TOKEN not in str(audit[0].detail)


@pytest.mark.parametrize(("case", "said"), [
    ("down", "PagerDuty answered HTTP 503"),
    ("nobody", "nobody is on call"),
    ("no-slack-user", "has a chat account with their e-mail"),
])
async def test_without_escalation_a_rota_that_cannot_be_read_refuses_the_call(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path,
    fake_pagerduty: FakePagerDuty, case: str, said: str,
) -> None:
    """Nobody on call, PagerDuty down, or nobody with a Slack account: refused before anyone is asked (the card
    says why, without buttons), the model is told, and the command does not run. Never "anyone may approve"."""
    fake_pagerduty.on_call[SCHEDULE] = [] if case == "nobody" else ["carol@example.com"]
    fake_pagerduty.status = 503 if case == "down" else None
    fake_slack.emails = {} if case == "no-slack-user" else {"carol@example.com": "U7"}
    gateway = await _start(make_settings, start_gateway, tmp_path, fake_pagerduty, RULE,
                           bot_approvers="requester")  # the default approvers are never the fallback
    marker = tmp_path / "home" / "work" / "default" / "ran"
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "touch ran"})]), Reply("could not"))
    await gateway.send_event(mention("do it"))
    posted = await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    card = json.dumps(posted[0].params)
    assert "approval:approve" not in card and said in card and "Cancelled" in card
    result = _tool_result(fake_llm)
    assert "was cancelled: nobody on call could be asked" in result and said in result and "did not run" in result
    assert not marker.exists()
    [audit] = [a for a in await audit_log(gateway.app.approvals.store.db) if a.action == "approval.oncall_unavailable"]
    assert json.loads(str(audit.detail))["refused"] is True and json.loads(str(audit.detail))["asked"] == []
    assert await gateway.app.approvals.pending() == []
    request = await gateway.app.approvals.get(int(audit.subject.removeprefix("approval:")))
    assert request is not None
    assert request.approvers == (f"oncall:{SCHEDULE}",)  # names nobody (not "the agent's approvers")
    assert not await gateway.app.approvals.may_decide("U1", request)


async def test_a_second_request_within_a_minute_reads_pagerduty_once(
    fake_pagerduty: FakePagerDuty,
) -> None:
    """Each schedule's answer is kept 60 s (by the injected clock); a failure is not kept; e-mail matches come from
    the channel's directory."""
    fake_pagerduty.on_call[SCHEDULE] = ["alice@example.com"]
    clock = _Clock()
    rota = PagerDutyRota(pagerduty_client(TOKEN, fake_pagerduty.url), lambda: [_Directory()], clock)
    assert await rota.people(SCHEDULE) == {"slack:U7"}
    clock.at += timedelta(seconds=59)
    assert await rota.people(SCHEDULE) == {"slack:U7"}
    assert fake_pagerduty.reads(SCHEDULE) == 1
    clock.at += timedelta(seconds=2)
    fake_pagerduty.status = 500
    with pytest.raises(RotaUnavailable, match="HTTP 500"):
        await rota.people(SCHEDULE)
    fake_pagerduty.status = None
    assert await rota.people(SCHEDULE) == {"slack:U7"}  # the failure was not cached
    assert fake_pagerduty.reads(SCHEDULE) == 3


@pytest.mark.parametrize(("answer", "said"), [
    ("401", "refused PAGERDUTY_TOKEN (401)"),
    ("302", "redirect (302), which is not followed"),
    ("many", "more than 50 people"),
    ("huge", "too large"),
    ("junk", "nobody is on call"),
])
async def test_a_hostile_or_failing_pagerduty_answer_names_nobody(
    fake_pagerduty: FakePagerDuty, answer: str, said: str, caplog: pytest.LogCaptureFixture,
) -> None:
    token = "pd-wrong-token-987654321" if answer == "401" else TOKEN
    fake_pagerduty.status = 302 if answer == "302" else None
    if answer == "many":
        fake_pagerduty.users = [{"email": f"p{n}@example.com"} for n in range(51)]
    elif answer == "huge":
        fake_pagerduty.users = [{"email": "a@example.com", "pad": "x" * MAX_BODY_BYTES}]
    elif answer == "junk":  # no address worth looking up: markup, another user's mention, nothing
        fake_pagerduty.users = [{"email": "<@U1>"}, {"email": "x@y"}, {"email": None}, "U1"]  # type: ignore[list-item]
    rota = PagerDutyRota(pagerduty_client(token, fake_pagerduty.url), lambda: [_Directory()], _Clock())
    with pytest.raises(RotaUnavailable, match=said.replace("(", r"\(").replace(")", r"\)")):
        await rota.people(SCHEDULE)
    assert token not in caplog.text and token[-4:] not in caplog.text
    assert not any("evil.invalid" in r.path for r in fake_pagerduty.requests)


async def test_entries_other_than_the_rota_stay_and_a_malformed_one_names_nobody() -> None:
    resolved = await on_call(["U1", "oncall:p1-lower", "oncall:" + "A" * 21], None)
    assert resolved.entries == ("U1",) and len(resolved.unavailable) == 2


def test_settings_take_oncall_approvers_and_check_the_pagerduty_url(make_settings: Any, tmp_path: Path) -> None:
    settings = make_settings(bot_approvers=f"oncall:{SCHEDULE},U1", pagerduty_token=TOKEN,
                             pagerduty_api_url="http://127.0.0.1:9/")
    assert settings.approvers == (f"oncall:{SCHEDULE}", "U1") and settings.pagerduty_api_url == "http://127.0.0.1:9"
    assert ("PAGERDUTY_TOKEN", TOKEN) in settings.named_secrets()
    for wrong in ("http://pagerduty.example.com", "ftp://127.0.0.1", "https://user:pw@api.pagerduty.com"):
        with pytest.raises(Exception, match=r"PAGERDUTY_API_URL|pagerduty_api_url"):
            make_settings(pagerduty_api_url=wrong)
    with pytest.raises(Exception, match="not a Slack user id"):
        make_settings(bot_admins=f"oncall:{SCHEDULE}")  # an admin is a person, never a rota
    with pytest.raises(Exception, match="not a Slack user id"):
        make_settings(bot_approvers="oncall:../../users")


def test_bot_toml_takes_oncall_entries_of_the_right_shape(tmp_path: Path) -> None:
    config = tmp_path / "bot.toml"
    # A rota may have several people on call: a quorum above the entries named is not refused (like a group's).
    config.write_text(RULE + 'quorum = 2\nescalate_to = ["oncall:P2LEADS"]\nremind_after_s = 60\n'
                      '[[agents]]\nname = "ops"\napprovers = ["oncall:P3OPS", "U1"]\n')
    toml = load_config(config)
    assert toml.policy_list()[0].approvers == (f"oncall:{SCHEDULE}",)
    assert toml.agent_list(None)[0].approvers == ("oncall:P3OPS", "U1")
    for wrong in ("oncall:p1lower", "oncall:", "oncall:P1/../x", "oncall:" + "A" * 21):
        config.write_text(f'[[policies]]\ntool = "shell_run"\napprovers = ["{wrong}"]\n')
        with pytest.raises(SettingsError, match="oncall:<PagerDuty schedule id>"):
            load_config(config)


def test_no_channel_may_be_named_oncall(monkeypatch: pytest.MonkeyPatch) -> None:
    import bot.channels

    class Point:
        name = value = "oncall"

        def load(self) -> Any:
            return replace(installed_channels()[0], name="oncall")

    monkeypatch.setattr(bot.channels, "entry_points", lambda group: [Point()])
    with pytest.raises(SettingsError, match="no channel may be named 'oncall'"):
        installed_channels.__wrapped__()


def test_start_up_refuses_oncall_approvers_without_a_token(make_settings: Any, tmp_path: Path) -> None:
    config = tmp_path / "bot.toml"
    config.write_text(RULE)
    with pytest.raises(SettingsError) as refused:
        build_application(make_settings(bot_config=config))
    assert str(refused.value).count("\n") == 0 and "PAGERDUTY_TOKEN" in str(refused.value)


@pytest.mark.parametrize(("token", "expected"), [
    (TOKEN, "✓ pagerduty: http://127.0.0.1"),
    ("pd-wrong-token-987654321", "✗ pagerduty: http://127.0.0.1"),
    (None, "✗ pagerduty: approvers name oncall:<schedule id>, which needs PAGERDUTY_TOKEN"),
])
async def test_doctor_checks_the_token_against_pagerduty(
    tmp_path: Path, fake_slack: FakeSlack, fake_llm: FakeLLM, fake_pagerduty: FakePagerDuty, token: str | None,
    expected: str,
) -> None:
    env = slack_env(fake_slack, fake_llm, 3000) | {"BOT_APPROVERS": f"oncall:{SCHEDULE}",
                                                   "PAGERDUTY_API_URL": fake_pagerduty.url}
    _code, out = await run_cli(tmp_path, env | ({"PAGERDUTY_TOKEN": token} if token else {}), "doctor")
    assert expected in out, out
    assert "pd-wrong-token" not in out and TOKEN not in out
    if token == "pd-wrong-token-987654321":
        assert "401" in out


def test_the_manifest_asks_for_e_mail_addresses_only_for_oncall_approvers() -> None:
    assert "users:read.email" not in build_manifest("http")["oauth_config"]["scopes"]["bot"]
    assert "users:read.email" in build_manifest("socket", oncall=True)["oauth_config"]["scopes"]["bot"]


class _Clock:
    def __init__(self) -> None:
        self.at = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)

    def now(self) -> datetime:
        return self.at


class _Directory:
    """A channel's people by e-mail (the Slack port's users.lookupByEmail is exercised through the app above)."""

    name = "slack"

    async def person_by_email(self, email: str) -> str | None:
        return {"alice@example.com": "U7", "a@example.com": "U7"}.get(email)
