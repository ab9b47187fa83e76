"""``[[policies]]`` through the real Slack app: a deny rule refuses before anyone is asked, an allow rule runs a
plain command unasked (never a compound one), a rule's approvers and timeout apply, and a quorum needs that
many distinct approvers (progress on the card, one Deny settles it)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.audit import audit_log
from tests.conftest import GatewayClient
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.server import RunningServer
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import block_action, mention


async def _start(make_settings: Any, start_gateway: Any, tmp_path: Path, rules: str, **settings: Any) -> GatewayClient:
    config = tmp_path / "bot.toml"
    config.write_text(rules)
    gateway: GatewayClient = await start_gateway(make_settings(bot_config=config, **settings))
    return gateway


def _tool_result(fake_llm: FakeLLM, index: int = 1) -> str:
    message = fake_llm.requests[index]["messages"][-1]
    assert message["role"] == "tool"
    return str(message["content"])


async def test_deny_and_allow_rules_decide_without_asking_anyone(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    gateway = await _start(make_settings, start_gateway, tmp_path,
                           '[[policies]]\ntool = "shell_run"\nmatch = "rm *"\naction = "deny"\n\n'
                           '[[policies]]\ntool = "shell_run"\nmatch = "echo allowed-*"\naction = "allow"\n')
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo ok; rm -rf x"})]), Reply("refused"))
    await gateway.send_event(mention("clean up"))
    await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()
    assert "approval policy refuses `shell_run`" in _tool_result(fake_llm) and "rule 1" in _tool_result(fake_llm)

    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo allowed-1"})]), Reply("ran it"))
    await gateway.send_event(mention("say it"))
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    assert "allowed-1" in _tool_result(fake_llm, 3) and "exit code 0" in _tool_result(fake_llm, 3)
    posted = [json.dumps(c.params) for c in fake_slack.of("chat.postMessage")]
    assert not any("approval:approve" in p for p in posted)  # nobody was asked, either time
    audit = {row.action: row for row in await audit_log(gateway.app.approvals.store.db)}
    assert audit["policy.deny"].actor == "U1" and "rule 1" in str(audit["policy.deny"].detail)
    assert audit["policy.allow"].subject == "tool:shell_run" and "rule 2" in str(audit["policy.allow"].detail)


async def test_an_allow_glob_never_lets_a_compound_command_through(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    gateway = await _start(make_settings, start_gateway, tmp_path,
                           '[[policies]]\ntool = "shell_run"\nmatch = "echo allowed-*"\naction = "allow"\n')
    marker = tmp_path / "home" / "work" / "default" / "x"
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo allowed-2; touch x"})]))
    await gateway.send_event(mention("go"))
    [card] = await fake_slack.wait_for("chat.postMessage")
    assert "approval:approve" in json.dumps(card.params["blocks"])  # asked, not run
    assert not marker.exists()


async def test_a_quorum_needs_distinct_approvers_and_shows_progress(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    gateway = await _start(make_settings, start_gateway, tmp_path,
                           '[[policies]]\ntool = "shell_run"\napprovers = ["U7", "U8", "U9"]\nquorum = 2\n'
                           'timeout_s = 600\n')
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo two-keys"})]))
    await gateway.send_event(mention("run it"))
    [card] = await fake_slack.wait_for("chat.postMessage")
    buttons = card.params["blocks"][-1]["elements"]
    assert [b["text"]["text"] for b in buttons] == ["Approve", "Deny"]  # no standing grant past a quorum
    request_id = buttons[0]["value"]
    assert "0 of 2 approvals" in json.dumps(card.params["blocks"])

    await gateway.interact(block_action("approval:approve", request_id, user="U1"))  # the requester: not named
    assert "can't approve" in (await fake_slack.wait_for("chat.postEphemeral"))[0].params["text"]
    await gateway.interact(block_action("approval:approve", request_id, user="U7"))
    [update] = await fake_slack.wait_for("chat.update")
    shown = json.dumps(update.params["blocks"])
    assert "1 of 2 approvals \\u2014 <@U7>" in shown and "approval:approve" in shown  # still open
    told = await fake_slack.wait_for("chat.postEphemeral", 2)
    assert told[1].params["text"] == "Your approval is counted: 1 of 2 approvals — U7."
    await gateway.interact(block_action("approval:always", request_id, user="U7"))  # the same person again
    told = await fake_slack.wait_for("chat.postEphemeral", 3)
    assert "already voted" in told[2].params["text"]
    assert len(fake_llm.requests) == 1  # nothing ran yet

    fake_llm.then(Reply("both agreed"))
    await gateway.interact(block_action("approval:approve", request_id, user="U8"))
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    assert "two-keys" in _tool_result(fake_llm)
    final = json.dumps(fake_slack.of("chat.update")[-1].params["blocks"])
    assert "Approved by <@U7> and <@U8>" in final and "approval:approve" not in final


async def test_one_deny_settles_a_quorum_request(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    gateway = await _start(make_settings, start_gateway, tmp_path,
                           '[[policies]]\ntool = "shell_run"\napprovers = ["U7", "U8"]\nquorum = 2\n')
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "touch never"})]), Reply("ok, not run"))
    await gateway.send_event(mention("run it"))
    [card] = await fake_slack.wait_for("chat.postMessage")
    request_id = card.params["blocks"][-1]["elements"][0]["value"]
    await gateway.interact(block_action("approval:approve", request_id, user="U7"))
    await fake_slack.wait_for("chat.update")
    await gateway.interact(block_action("approval:deny", request_id, user="U8"))
    [opened] = await fake_slack.wait_for("views.open")
    view = opened.params["view"]
    view = json.loads(view) if isinstance(view, str) else view
    from tests.slack_requests import view_submission

    await gateway.interact(view_submission(view["callback_id"], request_id, {"reason": {"text": {
        "type": "plain_text_input", "value": "not today"}}}, user="U8"))
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    assert "denied `shell_run`: not today" in _tool_result(fake_llm)
    assert not (tmp_path / "home" / "work" / "default" / "never").exists()


async def test_a_rule_s_timeout_and_approvers_replace_the_defaults(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    gateway = await _start(make_settings, start_gateway, tmp_path,
                           '[[policies]]\ntool = "shell_run"\napprovers = ["U5"]\ntimeout_s = 0.4\n',
                           approval_timeout_s=600, approval_poll_s=0.05)
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo late"})]), Reply("it expired"))
    await gateway.send_event(mention("run it"))
    [card] = await fake_slack.wait_for("chat.postMessage")
    request_id = card.params["blocks"][-1]["elements"][0]["value"]
    await gateway.interact(block_action("approval:approve", request_id, user="U1"))  # the requester is not U5
    assert "can't approve" in (await fake_slack.wait_for("chat.postEphemeral"))[0].params["text"]
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    told = _tool_result(fake_llm)
    assert told.startswith("expired: nobody decided within 0.4 seconds") and "denied" not in told
    assert "Expired" in json.dumps(fake_slack.of("chat.update")[-1].params["blocks"])


async def test_a_rule_s_request_offers_no_standing_grant_and_is_asked_again(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """A rule that names its approvers is never skipped by an "Always allow": none is offered, a forged click
    records none, and an older grant for the same call does not apply."""
    gateway = await _start(make_settings, start_gateway, tmp_path,
                           '[[policies]]\ntool = "shell_run"\napprovers = ["U1"]\n')
    for round_ in (1, 2):
        fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo same"})]), Reply(f"done {round_}"))
        await gateway.send_event(mention(f"run it {round_}"))
        cards = await fake_slack.wait_for("chat.postMessage", 2 * round_ - 1)
        card = cards[-1]
        buttons = card.params["blocks"][-1]["elements"]
        assert [b["text"]["text"] for b in buttons] == ["Approve", "Deny", "Edit"]
        await gateway.interact(block_action("approval:always", buttons[0]["value"], user="U1"))  # forged
        await fake_slack.wait_for("chat.postMessage", 2 * round_)
        await gateway.idle()
    assert await gateway.app.approvals.store.grants() == []


async def test_dm_cards_reminders_and_escalation_update_every_copy(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """notify = thread + dm: the card goes to the thread and to each approver's DM (a user group expanded);
    at remind_after_s they are reminded (thread and DM) and escalate_to joins them; a decision by the one
    who joined updates every copy in place, with no buttons left."""
    fake_slack.groups["S0OPS"] = ["U8", "U9"]
    gateway = await _start(make_settings, start_gateway, tmp_path,
                           '[[policies]]\ntool = "shell_run"\napprovers = ["U7", "S0OPS"]\nnotify = ["thread", "dm"]\n'
                           'remind_after_s = 0.3\nescalate_to = ["U5"]\ntimeout_s = 600\n',
                           approval_poll_s=0.05)
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo paged"})]))
    await gateway.send_event(mention("page them"))
    posts = await fake_slack.wait_for("chat.postMessage", 4)  # U7, U8 and U9 by DM, then the thread
    assert [p.params["channel"] for p in posts[:4]] == ["DU7", "DU8", "DU9", "C1"]
    assert all("approval:approve" in json.dumps(p.params["blocks"]) for p in posts[:4])

    posts = await fake_slack.wait_for("chat.postMessage", 9)  # the reminder, and a card to U7, U8, U9, U5
    reminder = posts[4].params
    assert reminder["channel"] == "C1" and reminder["text"].startswith(":bell: Reminder:")
    assert all(f"<@{u}>" in reminder["text"] for u in ("U7", "U5")) and "<!subteam^S0OPS>" in reminder["text"]
    assert "minutes left" in reminder["text"] or "minute left" in reminder["text"]
    assert sorted(p.params["channel"] for p in posts[5:9]) == ["DU5", "DU7", "DU8", "DU9"]

    fake_llm.then(Reply("paged"))
    request_id = posts[3].params["blocks"][-1]["elements"][0]["value"]
    await gateway.interact(block_action("approval:approve", request_id, user="U5"))  # joined at the reminder
    await fake_slack.wait_for("chat.postMessage", 10)
    await gateway.idle()
    await fake_slack.wait_for("chat.update", 8)
    updated = {(u.params["channel"], u.params["ts"]) for u in fake_slack.of("chat.update")}
    assert len(updated) == 8  # the thread card and seven DM cards
    assert all("approval:approve" not in json.dumps(u.params["blocks"]) for u in fake_slack.of("chat.update"))
    audit = [row.action for row in await audit_log(gateway.app.approvals.store.db)]
    assert "approval.reminded" in audit and "approval.approved" in audit


async def test_whom_a_rule_escalates_to_cannot_decide_before_the_reminder(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """escalate_to joins the approvers at remind_after_s, not before (a reminder far off: no race)."""
    gateway = await _start(make_settings, start_gateway, tmp_path,
                           '[[policies]]\ntool = "shell_run"\napprovers = ["U7"]\n'
                           'remind_after_s = 300\nescalate_to = ["U5"]\ntimeout_s = 600\n')
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo paged"})]))
    await gateway.send_event(mention("page them"))
    card = (await fake_slack.wait_for("chat.postMessage"))[0]
    await gateway.interact(block_action("approval:approve", card.params["blocks"][-1]["elements"][0]["value"],
                                        user="U5"))
    assert "can't approve" in (await fake_slack.wait_for("chat.postEphemeral"))[0].params["text"]
    assert "approval.approved" not in [row.action for row in await audit_log(gateway.app.approvals.store.db)]


async def test_dm_only_cards_fall_back_to_the_thread_when_the_list_is_cut(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """notify = ["dm"] with 30 people: the named one first, the first 25 by DM, and the thread has the card too
    (never a request some approver cannot find)."""
    fake_slack.groups["S0ALL"] = [f"U{n:03d}" for n in range(30)]
    gateway = await _start(make_settings, start_gateway, tmp_path,
                           '[[policies]]\ntool = "shell_run"\napprovers = ["S0ALL", "U9X"]\nnotify = ["dm"]\n')
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo many"})]))
    await gateway.send_event(mention("ask everyone"))
    posts = await fake_slack.wait_for("chat.postMessage", 26)
    channels = [p.params["channel"] for p in posts[:26]]
    assert channels[0] == "DU9X" and channels[-1] == "C1" and len(set(channels[:25])) == 25



@dataclass
class Site:
    """A local HTTP server (the test's status page) and what reached it: method, path, headers, body."""

    url: str
    seen: list[tuple[str, str, dict[str, str], str]]


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    seen: list[tuple[str, str, dict[str, str], str]] = []

    async def record(request: web.Request) -> web.Response:
        seen.append((request.method, request.path, dict(request.headers), await request.text()))
        return web.Response(text="all systems go")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    server = await RunningServer(app).start()
    yield Site(server.url, seen)
    await server.stop()


async def test_an_http_allow_rule_asks_about_headers_and_a_body_it_does_not_name(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path, site: Site
) -> None:
    """`allow "GET <status>/*"` runs a plain GET unasked, but a GET that carries a method override, a cookie or a
    body is asked about (its card shows them) and nothing is sent."""
    gateway = await _start(make_settings, start_gateway, tmp_path,
                           f'[[policies]]\ntool = "http_request"\nmatch = "GET {site.url}/status/*"\n'
                           'action = "allow"\n', http_allow_hosts="127.0.0.1")
    fake_llm.then(Reply(tool_calls=[("http_request", {"method": "GET", "url": f"{site.url}/status/now"})]),
                  Reply("status fetched"))
    await gateway.send_event(mention("status?"))
    await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()
    assert "all systems go" in _tool_result(fake_llm)  # ran, nobody asked
    assert [(m, p) for m, p, _h, _b in site.seen] == [("GET", "/status/now")]

    asked = [{"headers": {"X-HTTP-Method-Override": "DELETE"}}, {"headers": {"Cookie": "session=abc"}},
             {"body": '{"purge": true}'}]
    for n, extra in enumerate(asked, 1):
        fake_llm.then(Reply(tool_calls=[("http_request", {"method": "GET", "url": f"{site.url}/status/now",
                                                           **extra})]))
        await gateway.send_event(mention(f"status {n}?"))
        card = (await fake_slack.wait_for("chat.postMessage", 1 + n))[-1]
        shown = json.dumps(card.params["blocks"])
        assert "approval:approve" in shown, f"call {n} ran unasked"
        assert ("X-HTTP-Method-Override", "Cookie", "purge")[n - 1] in shown  # the approver sees it
    assert len(site.seen) == 1  # nothing more was sent
    audit = [row.action for row in await audit_log(gateway.app.approvals.store.db)]
    assert audit.count("policy.allow") == 1


async def test_an_http_allow_rule_that_names_a_header_runs_a_call_carrying_only_that_header(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path, site: Site
) -> None:
    gateway = await _start(make_settings, start_gateway, tmp_path,
                           f'[[policies]]\ntool = "http_request"\nmatch = "GET {site.url}/status/*"\n'
                           'action = "allow"\nheaders = ["Accept: *"]\n', http_allow_hosts="127.0.0.1")
    fake_llm.then(Reply(tool_calls=[("http_request", {"method": "GET", "url": f"{site.url}/status/now",
                                                       "headers": {"accept": "application/json"}})]),
                  Reply("accepted"))
    await gateway.send_event(mention("status as json?"))
    await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()
    assert "all systems go" in _tool_result(fake_llm)
    [(method, path, headers, _body)] = site.seen
    assert (method, path, headers.get("Accept")) == ("GET", "/status/now", "application/json")

    fake_llm.then(Reply(tool_calls=[("http_request", {"method": "GET", "url": f"{site.url}/status/now",
                                                       "headers": {"Accept": "*/*", "Cookie": "a=b"}})]))
    await gateway.send_event(mention("status with a cookie?"))
    [_answer, card] = await fake_slack.wait_for("chat.postMessage", 2)
    assert "approval:approve" in json.dumps(card.params["blocks"]) and len(site.seen) == 1


async def test_an_http_allow_rule_asks_about_an_authorization_header_hidden_in_the_url(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path, site: Site
) -> None:
    """Attack on 32.3: credentials in the URL (``user:password@``) are sent by aiohttp as an Authorization header
    the rule never names, and a deny rule on that header does not see it either. A rule with a host glob
    (``GET https://*.example.com/*``, here ``GET http://*/status/*``) runs it unasked."""
    port = site.url.rsplit(":", 1)[1]
    gateway = await _start(make_settings, start_gateway, tmp_path,
                           '[[policies]]\ntool = "http_request"\nmatch = "*"\naction = "deny"\n'
                           'headers = ["Authorization: *"]\n\n'
                           '[[policies]]\ntool = "http_request"\nmatch = "GET http://*/status/*"\naction = "allow"\n',
                           http_allow_hosts="127.0.0.1")
    url = f"http://admin:s3cret@127.0.0.1:{port}/status/now"
    fake_llm.then(Reply(tool_calls=[("http_request", {"method": "GET", "url": url})]), Reply("fetched"))
    await gateway.send_event(mention("status?"))
    await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()
    sent = [headers.get("Authorization") for _m, _p, headers, _b in site.seen]
    assert sent == [], f"sent unasked, past a deny rule on Authorization: {sent}"
