"""Issue 40.3 through the real Slack app: one model step's gated calls on one card (Approve all / Deny all, a decision
per call, each through its own policy), and an approver's Edit (checked by core: the editor, the schema, the
policies again, never a call that uses a credential; the model is told what ran instead)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bot.app import build_application
from core.store import ApprovalStore, Database
from tests.audit import audit_log
from tests.conftest import GatewayClient
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.slack_api import Call, Failure, FakeSlack
from tests.slack_requests import block_action, command_body, mention, view_submission

DENY_RM = '[[policies]]\ntool = "shell_run"\nmatch = "rm *"\naction = "deny"\n'


async def _start(make_settings: Any, start_gateway: Any, tmp_path: Path, rules: str = "",
                 **settings: Any) -> GatewayClient:
    config = tmp_path / "bot.toml"
    config.write_text(rules)
    gateway: GatewayClient = await start_gateway(make_settings(bot_config=config, **settings))
    return gateway


def _shell(*commands: str | dict[str, Any]) -> Reply:
    return Reply(tool_calls=[("shell_run", c if isinstance(c, dict) else {"command": c}) for c in commands])


async def _card(gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM, reply: Reply) -> Call:
    fake_llm.then(reply)
    await gateway.send_event(mention("do these"))
    [card] = await fake_slack.wait_for("chat.postMessage")
    return card


def _calls(card: dict[str, Any] | Call) -> dict[str, list[str]]:
    """Each call's request id → its buttons' labels (those still pending), in order."""
    blocks = card.params["blocks"] if isinstance(card, Call) else card["blocks"]
    return {b["block_id"].split(":")[1]: [e["text"]["text"] for e in b["elements"]]
            for b in blocks if b["type"] == "actions" and b["block_id"].startswith("approval:")}


def _batch_button(card: Call) -> str:
    [block] = [b for b in card.params["blocks"] if b["type"] == "actions"
               and b["block_id"].startswith("approval_batch:")]
    assert [e["text"]["text"] for e in block["elements"]] == ["Approve all", "Deny all"]
    return str(block["elements"][0]["value"])


def _results(fake_llm: FakeLLM, index: int = 1) -> list[str]:
    """The tool results the model got in its ``index``-th request, in call order."""
    return [str(m["content"]) for m in fake_llm.requests[index]["messages"] if m["role"] == "tool"]


def _last_card(fake_slack: FakeSlack) -> str:
    return json.dumps(fake_slack.of("chat.update")[-1].params["blocks"])


async def _edit(gateway: GatewayClient, request_id: str, arguments: str, user: str = "U1") -> dict[str, Any]:
    """Submit the edit box; what Slack was answered ({} when it closed, else the errors shown in it)."""
    response = await gateway.interact(view_submission("approval_edit", request_id, {
        "arguments": {"json": {"type": "plain_text_input", "value": arguments}}}, user=user))
    assert response.status == 200
    text = await response.text()
    return json.loads(text) if text else {}


async def test_three_gated_calls_one_card_and_approve_all_runs_each(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    gateway = await _start(make_settings, start_gateway, tmp_path)
    before = await gateway.metrics()
    card = await _card(gateway, fake_slack, fake_llm, _shell("echo one-1", "echo two-2", "echo three-3"))
    calls = _calls(card)
    every = ["Approve", "Deny", "Always allow", "Allow in this thread", "Edit"]
    assert list(calls.values()) == [every] * 3  # one card, a decision per call
    shown = json.dumps(card.params["blocks"])
    assert "echo one-1" in shown and "echo two-2" in shown and "echo three-3" in shown
    assert len(fake_slack.of("chat.postMessage")) == 1

    fake_llm.then(Reply("all three ran"))
    await gateway.interact(block_action("approval_batch:approve", _batch_button(card), user="U1"))
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    results = _results(fake_llm)
    assert ["one-1" in results[0], "two-2" in results[1], "three-3" in results[2]] == [True, True, True]
    final = _last_card(fake_slack)
    assert "approval:approve" not in final and final.count("Approved by <@U1>") == 3
    audit = [row for row in await audit_log(gateway.app.approvals.store.db) if row.action == "approval.approved"]
    assert sorted(row.subject for row in audit) == sorted(f"approval:{i}" for i in calls)  # one entry per call
    after = await gateway.metrics()
    for event in ("requested", "approved"):  # each call counted once (never again when its turn reaches it)
        series = f'chatops_approvals_total{{event="{event}"}}'
        assert after[series] - before.get(series, 0) == 3
    assert len(fake_slack.of("chat.update")) == 3  # the card updated once per decision


async def test_approve_all_with_one_call_denied_by_a_rule(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    gateway = await _start(make_settings, start_gateway, tmp_path, DENY_RM)
    card = await _card(gateway, fake_slack, fake_llm, _shell("echo kept-a", "rm -rf x", "echo kept-b"))
    assert len(_calls(card)) == 2 and "rm -rf" not in json.dumps(card.params["blocks"])  # never put to anyone
    fake_llm.then(Reply("done"))
    await gateway.interact(block_action("approval_batch:approve", _batch_button(card), user="U1"))
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    first, denied, last = _results(fake_llm)
    assert "kept-a" in first and "kept-b" in last
    assert "approval policy refuses `shell_run`" in denied and "rule 1" in denied


async def test_deny_all_denies_each_call(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    gateway = await _start(make_settings, start_gateway, tmp_path)
    card = await _card(gateway, fake_slack, fake_llm, _shell("touch no-1", "touch no-2"))
    fake_llm.then(Reply("ok"))
    await gateway.interact(block_action("approval_batch:deny", _batch_button(card), user="U1"))
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    assert all("the user denied `shell_run`" in r for r in _results(fake_llm))
    assert not list((tmp_path / "home" / "work").rglob("no-*"))
    assert _last_card(fake_slack).count("Denied by <@U1>") == 2


async def test_a_decision_per_call_updates_the_card_in_place(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    gateway = await _start(make_settings, start_gateway, tmp_path)
    card = await _card(gateway, fake_slack, fake_llm, _shell("echo mixed-1", "echo mixed-2", "echo mixed-3"))
    first, second, third = _calls(card)
    await gateway.interact(block_action("approval:approve", first, user="U1"))
    [update] = await fake_slack.wait_for("chat.update")
    assert list(_calls(update.params).keys()) == [second, third]  # settled calls lose their buttons, others keep them
    assert "Approve all" in json.dumps(update.params["blocks"])
    await gateway.interact(block_action("approval_batch:deny", first, user="U1"))  # Deny all: only what still waits
    fake_llm.then(Reply("ok"))
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    one, two, three = _results(fake_llm)
    assert "mixed-1" in one and "denied" in two and "denied" in three
    assert "approval_batch" not in _last_card(fake_slack)


async def test_approve_all_counts_one_vote_on_a_quorum_call_and_says_what_it_could_not_decide(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    gateway = await _start(make_settings, start_gateway, tmp_path,
                           '[[policies]]\ntool = "shell_run"\nmatch = "echo two-keys*"\napprovers = ["U7", "U8"]\n'
                           'quorum = 2\n')
    card = await _card(gateway, fake_slack, fake_llm, _shell("echo two-keys", "echo plain"))
    quorum_call, plain_call = _calls(card)
    assert _calls(card)[quorum_call] == ["Approve", "Deny"]  # no Edit: an edit is one person's decision
    await gateway.interact(block_action("approval_batch:approve", quorum_call, user="U7"))
    told = (await fake_slack.wait_for("chat.postEphemeral"))[0].params["text"]
    assert f"Still waiting — request {plain_call}: You can't approve this" in told  # the requester's call, not U7's
    assert "1 of 2 approvals" in told
    current = await gateway.app.approvals.get(int(quorum_call))
    assert current is not None and not current.settled and current.approved_by == ("U7",)
    await gateway.interact(block_action("approval_batch:approve", quorum_call, user="U7"))  # again: still one vote
    assert not (await gateway.app.approvals.get(int(quorum_call))).settled  # type: ignore[union-attr]
    assert len(fake_llm.requests) == 1

    fake_llm.then(Reply("both ran"))
    await gateway.interact(block_action("approval:approve", quorum_call, user="U8"))
    await gateway.interact(block_action("approval:approve", plain_call, user="U1"))
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    keys, plain = _results(fake_llm)
    assert "two-keys" in keys and "plain" in plain


async def test_an_edited_call_runs_and_the_model_is_told(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    gateway = await _start(make_settings, start_gateway, tmp_path)
    card = await _card(gateway, fake_slack, fake_llm, _shell("echo as-asked", "echo second"))
    first, second = _calls(card)
    await gateway.interact(block_action("approval:edit", first, user="U1"))
    [opened] = await fake_slack.wait_for("views.open")
    view = opened.params["view"]
    view = json.loads(view) if isinstance(view, str) else view
    assert view["callback_id"] == "approval_edit" and view["private_metadata"] == first
    box = view["blocks"][1]["element"]
    assert json.loads(box["initial_value"]) == {"command": "echo as-asked"}

    assert await _edit(gateway, first, '{"command": "echo as-edited"}') == {}  # the box closes
    await gateway.interact(block_action("approval:approve", second, user="U1"))
    fake_llm.then(Reply("ran the edited one"))
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    edited, plain = _results(fake_llm)
    assert "as-edited" in edited and "as-asked" not in edited.split("instead of yours")[-1]
    assert "an approver (U1) changed this call" in edited and '{"command": "echo as-edited"}' in edited
    assert "second" in plain
    shown = json.dumps([c.params["blocks"] for c in fake_slack.of("chat.update")])
    assert "Approved with changes by <@U1>" in shown and "echo as-edited" in shown
    audit = [row for row in await audit_log(gateway.app.approvals.store.db) if row.action == "approval.edited"]
    detail = json.loads(audit[0].detail or "{}")
    assert detail["arguments"] == {"command": "echo as-asked"} and detail["edited_arguments"] == {
        "command": "echo as-edited"} and detail["edited_by"] == "U1" and audit[0].actor == "U1"
    stored = await gateway.app.approvals.get(int(first))
    assert stored is not None and stored.arguments == {"command": "echo as-asked"}  # the ask stays as asked


async def test_an_edit_caught_by_a_deny_rule_is_refused_and_the_call_still_waits(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    gateway = await _start(make_settings, start_gateway, tmp_path, DENY_RM)
    card = await _card(gateway, fake_slack, fake_llm, _shell("echo harmless"))
    request_id = card.params["blocks"][-1]["elements"][0]["value"]
    answer = await _edit(gateway, request_id, '{"command": "rm -rf /srv"}')
    assert answer["response_action"] == "errors" and "policy refuses the edited call" in answer["errors"]["arguments"]
    assert "rule 1" in answer["errors"]["arguments"]
    current = await gateway.app.approvals.get(int(request_id))
    assert current is not None and not current.settled and current.edited_arguments is None
    refused = [row for row in await audit_log(gateway.app.approvals.store.db)
               if row.action == "approval.edit_refused"]
    assert refused and refused[0].actor == "U1"
    # A compound command hiding the forbidden part is caught the same way.
    answer = await _edit(gateway, request_id, '{"command": "echo hi; rm -rf /srv"}')
    assert answer["response_action"] == "errors"
    assert not (await gateway.app.approvals.get(int(request_id))).settled  # type: ignore[union-attr]


async def test_only_approvers_edit_and_bad_arguments_are_refused_in_the_box(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    gateway = await _start(make_settings, start_gateway, tmp_path)
    card = await _card(gateway, fake_slack, fake_llm, _shell("echo hi"))
    request_id = card.params["blocks"][-1]["elements"][0]["value"]
    await gateway.interact(block_action("approval:edit", request_id, user="U9"))
    told = (await fake_slack.wait_for("chat.postEphemeral"))[0].params["text"]
    assert "can't edit" in told and not fake_slack.of("views.open")
    answer = await _edit(gateway, request_id, '{"command": "echo mine"}', user="U9")  # a forged submission
    assert "can't edit" in answer["errors"]["arguments"]

    answer = await _edit(gateway, request_id, '{"command": "echo hi"')
    assert answer["response_action"] == "errors" and "not valid JSON" in answer["errors"]["arguments"]
    answer = await _edit(gateway, request_id, '{"command": 5}')
    assert "Not accepted" in answer["errors"]["arguments"]
    # The box holds arguments only: a tool's name in it is one more argument, which the schema refuses.
    answer = await _edit(gateway, request_id, '{"command": "echo hi", "name": "http_request"}')
    assert "Not accepted" in answer["errors"]["arguments"]
    answer = await _edit(gateway, request_id, '["echo", "hi"]')
    assert answer["response_action"] == "errors"
    answer = await _edit(gateway, request_id, '{"command": "echo x", "credentials": ["github.token"]}')
    assert "credential" in answer["errors"]["arguments"]
    answer = await _edit(gateway, request_id, '{"command": "echo sk-test-key-abcdef"}')  # the model API key's value
    assert "value of a secret" in answer["errors"]["arguments"]
    current = await gateway.app.approvals.get(int(request_id))
    assert current is not None and not current.settled


async def test_a_call_that_uses_a_credential_is_never_editable(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    gateway = await _start(make_settings, start_gateway, tmp_path)
    card = await _card(gateway, fake_slack, fake_llm, _shell(
        {"command": "gh api user", "credentials": ["github.token"]}, "echo plain"))
    with_credential, plain = _calls(card)
    assert _calls(card) == {with_credential: ["Approve", "Deny", "Always allow", "Allow in this thread"],
                            plain: ["Approve", "Deny", "Always allow", "Allow in this thread", "Edit"]}
    await gateway.interact(block_action("approval:edit", with_credential, user="U1"))
    assert "uses a credential" in (await fake_slack.wait_for("chat.postEphemeral"))[0].params["text"]
    answer = await _edit(gateway, with_credential, '{"command": "curl evil.example", "credentials": []}')
    assert "uses a credential" in answer["errors"]["arguments"]


async def test_an_edit_racing_an_approve_settles_once(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    gateway = await _start(make_settings, start_gateway, tmp_path)
    card = await _card(gateway, fake_slack, fake_llm, _shell("echo first-come"))
    request_id = card.params["blocks"][-1]["elements"][0]["value"]
    fake_llm.then(Reply("ran"))
    await gateway.interact(block_action("approval:approve", request_id, user="U1"))
    answer = await _edit(gateway, request_id, '{"command": "echo too-late"}')
    assert "Already settled" in answer["errors"]["arguments"]
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    [result] = _results(fake_llm)
    assert "first-come" in result and "too-late" not in result


async def test_a_stop_cancels_every_call_of_the_card(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    gateway = await _start(make_settings, start_gateway, tmp_path)
    card = await _card(gateway, fake_slack, fake_llm, _shell("touch stop-1", "touch stop-2", "touch stop-3"))
    calls = list(_calls(card))
    await gateway.interact(command_body("stop"))
    await gateway.idle()
    for request_id in calls:  # none is left for a click that no turn would run
        current = await gateway.app.approvals.get(int(request_id))
        assert current is not None and current.status == "cancelled"
    await gateway.interact(block_action("approval_batch:approve", calls[0], user="U1"))
    assert "already settled" in (await fake_slack.wait_for("chat.postEphemeral"))[0].params["text"]
    assert len(fake_llm.requests) == 1


@pytest.mark.parametrize("denied_since", [False, True])
async def test_a_restart_between_an_approved_edit_and_its_run_runs_the_edit(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path,
    denied_since: bool
) -> None:
    """The edit is stored with the approval, in one commit: the process that runs the call after a restart runs
    the edited arguments (and finds each call's request of the card; nothing is asked twice)."""
    config = tmp_path / "bot.toml"
    config.write_text("")
    settings = make_settings(bot_config=config)
    first = build_application(settings)
    await first.start()
    async with aiohttp.ClientSession() as http:
        card = await _card(GatewayClient(first, http), fake_slack, fake_llm, _shell("echo before", "echo other"))
    edited, other = _calls(card)
    stopped = await first.stop()
    assert stopped.kept == 2  # both still pending, set aside
    database = Database(settings.resolved_database_url)
    try:  # approved with the edit while no process runs
        won, _ = await ApprovalStore(database).approve_edited(
            int(edited), {"command": "echo after-restart"}, by="U1", now=datetime.now(UTC),
            detail={"arguments": {"command": "echo before"}, "edited_arguments": {"command": "echo after-restart"}})
        assert won
    finally:
        await database.close()

    if denied_since:  # a rule added before the run: the edited call meets it as it is about to run
        config.write_text('[[policies]]\ntool = "shell_run"\nmatch = "echo after-*"\naction = "deny"\n')
    gateway = await start_gateway(settings)
    fake_llm.then(Reply("done after the restart"))
    await gateway.interact(block_action("approval:approve", other, user="U1"))
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    ran, plain = _results(fake_llm)
    if denied_since:
        assert "approval policy refuses `shell_run`" in ran and "exit code" not in ran
    else:
        assert "after-restart" in ran and "changed this call" in ran
    assert "other" in plain
    assert len(fake_slack.of("chat.postMessage")) == 2  # the card was not posted again


async def test_the_web_chat_shows_each_call_of_a_batch_and_approves_all(
    gateway: GatewayClient, fake_llm: FakeLLM
) -> None:
    cid, headers = "0123456789abcdef0123456789abcdef", {"Content-Type": "application/json"}

    async def post(path: str, body: Any) -> tuple[int, Any]:
        async with gateway.http.post(f"{gateway.base}{path}", data=json.dumps(body), headers=headers) as resp:
            return resp.status, await resp.json()

    async def approvals() -> list[dict[str, Any]]:
        async with gateway.http.get(f"{gateway.base}/api/conversations/{cid}") as resp:
            return list((await resp.json(content_type=None))["approvals"])

    fake_llm.then(_shell("echo web-1", "echo web-2"))
    await post(f"/api/conversations/{cid}/messages", {"text": "run both"})
    shown: list[dict[str, Any]] = []
    for _ in range(200):
        if len(shown := await approvals()) == 2:
            break
        await asyncio.sleep(0.02)
    assert [a["arguments"]["command"] for a in shown] == ["echo web-1", "echo web-2"]
    assert shown[0]["batch"] and shown[0]["batch"] == shown[1]["batch"]
    assert (await post(f"/api/approvals/{shown[0]['id']}/all", {"verdict": "always"}))[0] == 400
    assert (await post("/api/approvals/999/all", {"verdict": "approve"}))[0] == 404
    fake_llm.then(Reply("both ran"))
    status, body = await post(f"/api/approvals/{shown[1]['id']}/all", {"verdict": "approve"})
    assert (status, body["decided"]) == (200, 2)
    await gateway.idle()
    assert [a["status"] for a in await approvals()] == ["approved", "approved"]
    assert "web-1" in _results(fake_llm)[0] and "web-2" in _results(fake_llm)[1]


async def test_a_batch_click_with_another_channel_s_request_id_decides_nothing(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """A forged Approve all: the id names a Slack card's request; the web chat (another channel) finds no such
    request, and a Slack user who may not decide those calls is told so by id, and nothing is decided."""
    gateway = await _start(make_settings, start_gateway, tmp_path)
    card = await _card(gateway, fake_slack, fake_llm, _shell("echo forged-1", "echo forged-2"))
    first, second = _calls(card)
    async with gateway.http.post(f"{gateway.base}/api/approvals/{first}/all", data=json.dumps({"verdict": "approve"}),
                                 headers={"Content-Type": "application/json"}) as resp:
        assert resp.status == 404
    await gateway.interact(block_action("approval_batch:approve", second, user="U9", channel="C2"))
    told = (await fake_slack.wait_for("chat.postEphemeral"))[0].params["text"]
    assert f"request {first}, request {second}" in told and "echo" not in told and "shell_run" not in told
    for request_id in (first, second):
        current = await gateway.app.approvals.get(int(request_id))
        assert current is not None and not current.settled


async def test_always_allow_on_one_call_of_a_card_covers_its_twin_and_the_twin_s_request_is_withdrawn(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    gateway = await _start(make_settings, start_gateway, tmp_path)
    card = await _card(gateway, fake_slack, fake_llm, _shell("echo twin", "echo twin"))
    first, second = _calls(card)
    fake_llm.then(Reply("both ran"))
    await gateway.interact(block_action("approval:always", first, user="U1"))
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    assert all("twin" in result for result in _results(fake_llm))
    twin = await gateway.app.approvals.get(int(second))
    assert twin is not None and twin.status == "cancelled"  # the grant ran it: nothing left to click
    assert "approval_batch" not in _last_card(fake_slack)


async def test_a_batch_slack_will_not_take_as_one_message_is_asked_card_by_card(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    gateway = await _start(make_settings, start_gateway, tmp_path)
    fake_slack.fail_next("chat.postMessage", Failure(error="msg_too_long"))
    fake_llm.then(_shell("echo split-1", "echo split-2"))
    await gateway.send_event(mention("do these"))
    posts = await fake_slack.wait_for("chat.postMessage", 2)  # the refused one is not kept
    assert [p.params["blocks"][-1]["block_id"].split(":")[0] for p in posts] == ["approval", "approval"]
    assert ["echo split-1" in json.dumps(posts[0].params), "echo split-2" in json.dumps(posts[1].params)] == [
        True, True]


async def test_a_guest_named_as_approver_can_neither_edit_nor_approve_all(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_slack.people["UGUEST"] = {"is_restricted": True}
    gateway = await _start(make_settings, start_gateway, tmp_path, bot_approvers="U1,UGUEST")
    card = await _card(gateway, fake_slack, fake_llm, _shell("echo guarded-1", "echo guarded-2"))
    first, second = _calls(card)
    answer = await _edit(gateway, first, '{"command": "echo by-guest"}', user="UGUEST")
    assert "Guests" in answer["errors"]["arguments"]
    await gateway.interact(block_action("approval_batch:approve", first, user="UGUEST"))
    told = (await fake_slack.wait_for("chat.postEphemeral"))[0].params["text"]
    assert f"Still waiting — request {first}, request {second}: You can't approve this" in told and "guest" in told
    for request_id in (first, second):
        current = await gateway.app.approvals.get(int(request_id))
        assert current is not None and not current.settled


async def test_the_web_chat_edits_a_call_and_core_checks_it(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    gateway = await _start(make_settings, start_gateway, tmp_path, DENY_RM)
    cid, headers = "0123456789abcdef0123456789abcdef", {"Content-Type": "application/json"}

    async def post(path: str, body: Any) -> tuple[int, Any]:
        async with gateway.http.post(f"{gateway.base}{path}", data=json.dumps(body), headers=headers) as resp:
            return resp.status, await resp.json()

    async def approvals() -> list[dict[str, Any]]:
        async with gateway.http.get(f"{gateway.base}/api/conversations/{cid}") as resp:
            return list((await resp.json(content_type=None))["approvals"])

    fake_llm.then(_shell("echo web-asked"))
    await post(f"/api/conversations/{cid}/messages", {"text": "run it"})
    shown: list[dict[str, Any]] = []
    for _ in range(200):
        if shown := await approvals():
            break
        await asyncio.sleep(0.02)
    [asked] = shown
    assert asked["editable"] is True
    status, body = await post(f"/api/approvals/{asked['id']}/edit", {"arguments": '{"command": "rm -rf /"}'})
    assert status == 422 and "policy refuses the edited call" in body["error"]
    assert (await post(f"/api/approvals/{asked['id']}/edit", {"arguments": {"command": "x"}}))[0] == 400
    fake_llm.then(Reply("ran the edit"))
    status, body = await post(f"/api/approvals/{asked['id']}/edit", {"arguments": '{"command": "echo web-edited"}'})
    assert (status, body["message"]) == (200, "Approved with changes by web.")
    await gateway.idle()
    [settled] = await approvals()
    assert settled["edited_arguments"] == {"command": "echo web-edited"} and settled["edited_by"] == "web"
    [result] = _results(fake_llm)
    assert "an approver (web) changed this call" in result and "web-edited" in result
