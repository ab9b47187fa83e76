"""Issue 40, outside attack, part A: who may approve. Each test is an attack that must be refused: approving one's own
request by another route (a user group, Approve all, Edit, a grant button, a quorum vote), replaying a step-up or an
enrolment link, editing a call into one that acts with someone's credential or connection, and forged Slack payloads.
Through the real Slack app (and the web chat) over HTTP against tests/fakes, in-process."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

from mcp_types import CallToolResult, TextContent
from mcp_types import Tool as McpTool

from bot.mcp.servers import McpServer
from bot.mcp.spec import McpServerSpec
from bot.mcp.tools import Access, server_tools
from core.tools import ToolContext
from tests.audit import audit_log
from tests.conftest import GatewayClient
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.slack_api import Call, FakeSlack
from tests.slack_requests import block_action, command_body, mention, view_submission

ORIGIN = "http://localhost"
_LINK = re.compile(r"http://localhost/passkeys/step-up/[A-Za-z0-9_-]+")


async def _start(make_settings: Any, start_gateway: Any, tmp_path: Path, rules: str = "",
                 **settings: Any) -> GatewayClient:
    config = tmp_path / "bot.toml"
    config.write_text(rules)
    gateway: GatewayClient = await start_gateway(make_settings(bot_config=config, **settings))
    return gateway


async def _card(gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM, reply: Reply,
                user: str = "U1") -> Call:
    fake_llm.then(reply)
    await gateway.send_event(mention("do these", user=user))
    [card] = await fake_slack.wait_for("chat.postMessage")
    return card


def _calls(card: Call) -> dict[str, list[str]]:
    """Each call's request id → its buttons' labels, in order."""
    return {b["block_id"].split(":")[1]: [e["text"]["text"] for e in b["elements"]]
            for b in card.params["blocks"] if b["type"] == "actions" and b["block_id"].startswith("approval:")}


async def _edit(gateway: GatewayClient, request_id: str, arguments: str, user: str = "U1") -> dict[str, Any]:
    response = await gateway.interact(view_submission("approval_edit", request_id, {
        "arguments": {"json": {"type": "plain_text_input", "value": arguments}}}, user=user))
    assert response.status == 200
    text = await response.text()
    return json.loads(text) if text else {}


async def _told(fake_slack: FakeSlack, count: int) -> str:
    return str((await fake_slack.wait_for("chat.postEphemeral", count))[count - 1].params["text"])


# -- editing a call into one that acts with someone's credential ---------------------------------------------------

async def test_an_http_request_through_a_persons_connection_is_never_edited(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """``connection`` sends the requester's own OAuth token: an approver's edit would spend it on a request the
    requester never asked for (another path, method or body), as them. Like ``credential``, it is never edited."""
    gateway = await _start(make_settings, start_gateway, tmp_path)
    asked = {"method": "GET", "url": "https://api.github.com/user", "connection": "github"}
    card = await _card(gateway, fake_slack, fake_llm, Reply(tool_calls=[
        ("http_request", asked), ("http_request", {"method": "GET", "url": "https://example.com/"})]))
    with_connection, plain = _calls(card)
    assert "Edit" not in _calls(card)[with_connection] and "Edit" in _calls(card)[plain]
    answer = await _edit(gateway, with_connection, json.dumps(
        {**asked, "method": "DELETE", "url": "https://api.github.com/repos/acme/prod"}))
    assert answer.get("response_action") == "errors" and "credential" in answer["errors"]["arguments"]
    # Nor may an edit add one: the approver would act with the requester's token.
    answer = await _edit(gateway, plain, json.dumps(
        {"method": "GET", "url": "https://example.com/", "connection": "github"}))
    assert answer.get("response_action") == "errors" and "credential" in answer["errors"]["arguments"]
    for request_id in (with_connection, plain):
        current = await gateway.app.approvals.get(int(request_id))
        assert current is not None and not current.settled and current.edited_arguments is None
    assert not fake_slack.of("views.open")


class _ListedServer(McpServer):
    """An MCP server already listed (never started here): what the bot registers from a real one's listing."""

    def __init__(self, spec: McpServerSpec) -> None:
        super().__init__(spec)
        self.tools = [McpTool(name="create_issue", input_schema={
            "type": "object", "properties": {"repo": {"type": "string"}, "title": {"type": "string"}}})]

    async def start(self, timeout_s: float, headers: Any = None) -> None:
        return None

    async def call(self, tool: str, args: dict[str, Any], headers: Any) -> CallToolResult:
        return CallToolResult(content=[TextContent(type="text", text="created")])


async def _no_audit(_ctx: ToolContext, _tool: str, _detail: dict[str, Any]) -> None:
    return None


async def test_a_call_to_an_mcp_server_that_sends_a_credential_or_a_connection_is_never_edited(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """Every call to such a server carries its token (a stored credential, the requester's own connection, or the
    credentials a stdio server was started with), whatever its arguments say: an edit would spend it elsewhere."""
    gateway = await _start(make_settings, start_gateway, tmp_path)
    registry = gateway.app.dispatcher.runner.tools
    specs = [McpServerSpec(name="ghc", url="https://mcp.example.com/mcp", credential="gh.token"),
             McpServerSpec(name="ghp", url="https://mcp.example.com/mcp", connection="github"),
             McpServerSpec(name="ghe", command=("gh-mcp",), env=("gh.token",)),
             McpServerSpec(name="plain", url="https://mcp.example.com/mcp")]
    for spec in specs:
        server = _ListedServer(spec)
        for tool in server_tools(server, Access(server, None, None), _no_audit):
            registry.register(tool)
    asked = {"repo": "acme/docs", "title": "typo"}
    card = await _card(gateway, fake_slack, fake_llm, Reply(tool_calls=[
        (f"{spec.name}__create_issue", asked) for spec in specs]))
    *credentialed, plain = _calls(card)
    assert "Edit" in _calls(card)[plain]
    for told, request_id in enumerate(credentialed, start=1):
        # The card cannot know the server's entry (its Edit button stays); core refuses the click and the box.
        await gateway.interact(block_action("approval:edit", request_id, user="U1"))
        assert "uses a credential" in await _told(fake_slack, told)
        answer = await _edit(gateway, request_id, json.dumps({**asked, "repo": "acme/prod"}))
        assert answer.get("response_action") == "errors" and "credential" in answer["errors"]["arguments"]
        current = await gateway.app.approvals.get(int(request_id))
        assert current is not None and not current.settled and current.edited_arguments is None
    assert not fake_slack.of("views.open")


# -- step-up through Approve all ---------------------------------------------------------------------------------

async def test_approve_all_of_step_up_calls_tells_the_approver_how_to_confirm_each_and_counts_none(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """Approve all goes through each call's own rule: a step_up call counts only after the passkey, so the clicker
    must be given each call's one-time link (or told how to enrol), never left with nothing said."""
    from tests.test_step_up import PasskeyBrowser, _enrolled

    rule = '[[policies]]\ntool = "shell_run"\napprovers = ["U7", "U8"]\nstep_up = true\ntimeout_s = 3600\n'
    gateway = await _start(make_settings, start_gateway, tmp_path, rule, bot_public_url=ORIGIN)
    browser = PasskeyBrowser(gateway)
    try:
        key = await _enrolled(gateway, browser, "slack:U7")
        card = await _card(gateway, fake_slack, fake_llm, Reply(tool_calls=[
            ("shell_run", {"command": "echo stepped-1"}), ("shell_run", {"command": "echo stepped-2"})]))
        first, second = _calls(card)
        await gateway.interact(block_action("approval_batch:approve", first, user="U8"))  # no passkey yet
        told = await _told(fake_slack, 1)
        assert "bot approvers enroll slack:U8" in told and f"request {first}" in told and f"request {second}" in told
        await gateway.interact(block_action("approval_batch:approve", first, user="U7"))
        told = await _told(fake_slack, 2)
        links = _LINK.findall(told)
        assert len(links) == 2 and told.index(f"request {first}") < told.index(f"request {second}")
        for request_id in (first, second):
            current = await gateway.app.approvals.get(int(request_id))
            assert current is not None and not current.settled and current.approved_by == ()
        fake_llm.then(Reply("done"))
        for link in links:
            status, done = await browser.post(link, "finish", {"credential": key.get(await browser.options(link))})
            assert status == 200 and "Approved by U7" in done["message"], done
        await fake_slack.wait_for("chat.postMessage", 2)
        await gateway.idle()
        assert len(fake_llm.requests) == 2
    finally:
        await browser.close()


# -- approving one's own request by another route -------------------------------------------------------------------

async def test_an_asker_in_the_approving_group_cannot_approve_their_calls_by_any_button(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """U1 asks and is in S1, the rule's approvers: Approve, Allow in this thread, Always allow, Approve all and Edit
    are each refused (and audited); a forged Approve of another thread's request is refused too. U5 of S1 may."""
    fake_slack.groups["S1"] = ["U1", "U5"]
    gateway = await _start(make_settings, start_gateway, tmp_path,
                           '[[policies]]\ntool = "shell_run"\napprovers = ["S1"]\nself_approval = false\n'
                           'grant_ttl_s = 600\n')
    card = await _card(gateway, fake_slack, fake_llm, Reply(tool_calls=[
        ("shell_run", {"command": "echo mine-1"}), ("shell_run", {"command": "echo mine-2"})]))
    first, second = _calls(card)
    assert "Allow in this thread" in _calls(card)[first]  # no Edit: an edit would be the editor's own call
    refused = "it needs someone other than you"
    told = 0
    for action in ("approval:approve", "approval:thread", "approval:always", "approval_batch:approve",
                   "approval:edit"):
        await gateway.interact(block_action(action, first, user="U1"))
        told += 1
        assert refused in await _told(fake_slack, told), action
    assert refused in (await _edit(gateway, second, '{"command": "echo edited-by-asker"}'))["errors"]["arguments"]
    assert not fake_slack.of("views.open")
    for request_id in (first, second):
        current = await gateway.app.approvals.get(int(request_id))
        assert current is not None and not current.settled and current.approved_by == ()
    assert not await gateway.app.approvals.grants()
    audit = await audit_log(gateway.app.approvals.store.db)
    assert {a.actor for a in audit if a.action == "approval.self_refused"} == {"U1"}

    fake_llm.then(Reply("both ran"))
    await gateway.interact(block_action("approval_batch:approve", first, user="U5"))
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    assert len(fake_llm.requests) == 2


async def test_a_forged_click_or_edit_naming_another_requesters_call_decides_nothing(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """Approvers are ``requester`` (the default): U1 may decide U1's calls only. Button values and modal metadata
    naming U2's request in another thread (or a web chat request, or carrying a step-up link) decide nothing."""
    gateway = await _start(make_settings, start_gateway, tmp_path)
    await _card(gateway, fake_slack, fake_llm, Reply(tool_calls=[("shell_run", {"command": "echo u2-asked"})]),
                user="U2")
    theirs = str((await fake_slack.wait_for("chat.postMessage"))[0].params["blocks"][-1]["elements"][0]["value"])
    for told, action in enumerate(("approval:approve", "approval:always", "approval_batch:approve", "approval:edit"),
                                  start=1):
        await gateway.interact(block_action(action, theirs, user="U1"))
        assert "not one of its approvers" in await _told(fake_slack, told), action
    answer = await _edit(gateway, theirs, '{"command": "echo u1-instead"}')
    assert "not one of its approvers" in answer["errors"]["arguments"]
    # An id with something after it (e.g. a step-up link's token) is no request id at all.
    await gateway.interact(block_action("approval:approve", f"{theirs}/passkeys/step-up/abc", user="U2"))
    assert "does not belong to an approval request" in await _told(fake_slack, 5)
    current = await gateway.app.approvals.get(int(theirs))
    assert current is not None and not current.settled and current.edited_arguments is None

    # A web chat request is no Slack request: its id in a Slack payload is unknown.
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo web-asked"})]))
    cid = "0123456789abcdef0123456789abcdef"
    async with gateway.http.post(f"{gateway.base}/api/conversations/{cid}/messages", data=json.dumps(
            {"text": "run it"}), headers={"Content-Type": "application/json"}) as resp:
        assert resp.status < 300
    web_request = None
    for _ in range(200):
        pending = [p for p in await gateway.app.approvals.pending() if p.session.channel == "web"]
        if pending:
            web_request = pending[0]
            break
        await asyncio.sleep(0.02)
    assert web_request is not None
    answer = await _edit(gateway, str(web_request.id), '{"command": "echo from-slack"}', user="U2")
    assert "no such approval request" in answer["errors"]["arguments"]
    await gateway.interact(block_action("approval:approve", str(web_request.id), user="U2"))
    assert "does not exist" in await _told(fake_slack, 6)
    assert not (await gateway.app.approvals.get(web_request.id)).settled  # type: ignore[union-attr]


# -- editing a call into a forbidden one ------------------------------------------------------------------------------

async def test_an_edit_into_a_stricter_rule_or_into_json_read_another_way_is_refused(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """The asker (an approver of calls no rule decides) edits a plain call into calls stricter rules ask for (other
    approvers, a quorum, a passkey) or deny, behind `;`, duplicate keys, unreadable numbers or deep nesting."""
    rules = ('[[policies]]\ntool = "shell_run"\nmatch = "rm *"\naction = "deny"\n'
             '[[policies]]\ntool = "shell_run"\nmatch = "deploy *"\napprovers = ["U7"]\n'
             '[[policies]]\ntool = "shell_run"\nmatch = "migrate *"\napprovers = ["U1", "U7"]\nquorum = 2\n'
             '[[policies]]\ntool = "shell_run"\nmatch = "rotate *"\napprovers = ["U1"]\nstep_up = true\n')
    gateway = await _start(make_settings, start_gateway, tmp_path, rules, bot_public_url=ORIGIN)
    card = await _card(gateway, fake_slack, fake_llm, Reply(tool_calls=[("shell_run", {"command": "echo plain"})]))
    [request_id] = _calls(card)
    refusals = {
        '{"command": "deploy prod"}': "falls under rule 2",
        '{"command": "migrate prod"}': "falls under rule 3",
        '{"command": "rotate keys"}': "falls under rule 4",
        '{"command": "echo ok; deploy prod"}': "rule",
        '{"command": "echo ok", "command": "rm -rf /srv"}': "policy refuses the edited call",  # the last key wins
        '{"command": "echo ok", "timeout_s": 1e999}': "Not accepted",
        '{"command": "echo ' + "9" * 7000 + '"}': "too long",
        '{"command": ' + "[" * 2000 + "]" * 2000 + "}": "Not accepted",
        '{"command": "echo ok", "credentials": ["gh.token"]}': "credential",
        '{"command": "echo ok", "connection": "github"}': "Not accepted",  # no such argument of shell_run
    }
    for text, why in refusals.items():
        answer = await _edit(gateway, request_id, text)
        assert answer.get("response_action") == "errors" and why in answer["errors"]["arguments"], (text, answer)
    current = await gateway.app.approvals.get(int(request_id))
    assert current is not None and not current.settled and current.edited_arguments is None

    # What the policies saw is what is stored and what runs: the object as parsed (the last of duplicate keys).
    fake_llm.then(Reply("ran"))
    assert await _edit(gateway, request_id, '{"command": "rm -rf /srv", "command": "echo last-wins"}') == {}
    await gateway.idle()
    current = await gateway.app.approvals.get(int(request_id))
    assert current is not None and current.edited_arguments == {"command": "echo last-wins"}
    ran = [str(m["content"]) for m in fake_llm.requests[1]["messages"] if m["role"] == "tool"]
    assert "last-wins" in ran[0] and "rm -rf" not in ran[0].split("instead of yours")[-1]


# -- replaying step-up and enrolment links ---------------------------------------------------------------------------

async def test_enrolment_and_step_up_links_are_each_one_use_of_one_kind_and_a_passkey_makes_nobody_an_approver(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    from tests.passkey_authenticator import SoftAuthenticator
    from tests.test_step_up import PasskeyBrowser, _enrolled

    rule = '[[policies]]\ntool = "shell_run"\napprovers = ["U7"]\nstep_up = true\ntimeout_s = 3600\n'
    gateway = await _start(make_settings, start_gateway, tmp_path, rule, bot_public_url=ORIGIN)
    passkeys = gateway.app.approvals.passkeys
    assert passkeys is not None
    browser = PasskeyBrowser(gateway)
    try:
        # An enrolment link works once: a second passkey (someone who saw the link later) is refused.
        link, _expires = await passkeys.enrol_link("slack:U7", by="operator:test")
        mine = SoftAuthenticator(ORIGIN)
        status, body = await browser.enrol(link, mine)
        assert status == 200, body
        status, _page, _headers = await browser.open(link)
        assert status == 410
        status, body = await browser.post(link, "finish", {"credential": {"id": "x", "response": {}}})
        assert status in (403, 410)  # its page's form token went with the first use, and the link with it
        # A passkey makes nobody an approver: U9's Approve is refused before any link is made.
        await _enrolled(gateway, browser, "slack:U9")
        card = await _card(gateway, fake_slack, fake_llm, Reply(tool_calls=[("shell_run", {"command": "echo up"})]))
        [request_id] = _calls(card)
        await gateway.interact(block_action("approval:approve", request_id, user="U9"))
        told = await _told(fake_slack, 1)
        assert "not one of its approvers" in told and "/passkeys/" not in told
        # U7's step-up link is no enrolment link (nor the other way round).
        await gateway.interact(block_action("approval:approve", request_id, user="U7"))
        found = _LINK.search(await _told(fake_slack, 2))
        assert found is not None
        step_up = found.group(0)
        status, _page, _headers = await browser.open(step_up.replace("/step-up/", "/enrol/"))
        assert status == 410
        other, _expires = await passkeys.enrol_link("slack:U7", by="operator:test")
        status, _page, _headers = await browser.open(other.replace("/enrol/", "/step-up/"))
        assert status == 410
        # A confirmation captured from one link does not confirm on the next (its challenge is the old link's).
        captured = mine.get(await browser.options(step_up))
        fake_llm.then(Reply("done"))
        await gateway.interact(block_action("approval:approve", request_id, user="U7"))
        found = _LINK.search(await _told(fake_slack, 3))
        assert found is not None and found.group(0) != step_up
        await browser.options(found.group(0))
        status, body = await browser.post(found.group(0), "finish", {"credential": captured})
        assert status == 409 and "could not be verified" in body["message"], body
        current = await gateway.app.approvals.get(int(request_id))
        assert current is not None and not current.settled and current.approved_by == ()
        # The first link, confirmed properly, still works once.
        await browser.open(step_up)
        status, body = await browser.post(step_up, "finish", {"credential": mine.get(await browser.options(step_up))})
        assert status == 200 and "Approved by U7" in body["message"], body
        status, body = await browser.post(step_up, "finish", {"credential": captured})
        assert status in (403, 410)
    finally:
        await browser.close()


async def test_with_self_approval_off_an_approver_cannot_edit_a_call_into_their_own_and_approve_it(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """Four eyes means two people agree on the exact call. An edit is the editor's own call, approved by the editor
    alone: with self-approval off, nobody edits (Deny, and ask for the call you want, which someone else approves)."""
    gateway = await _start(make_settings, start_gateway, tmp_path,
                           '[[policies]]\ntool = "shell_run"\napprovers = ["U7", "U8"]\nself_approval = false\n')
    card = await _card(gateway, fake_slack, fake_llm, Reply(tool_calls=[("shell_run", {"command": "echo asked"})]))
    [request_id] = _calls(card)
    assert _calls(card)[request_id] == ["Approve", "Deny"]
    await gateway.interact(block_action("approval:edit", request_id, user="U7"))
    assert "self-approval is off" in await _told(fake_slack, 1)
    answer = await _edit(gateway, request_id, '{"command": "echo written-by-the-approver"}', user="U7")
    assert answer.get("response_action") == "errors" and "self-approval is off" in answer["errors"]["arguments"]
    current = await gateway.app.approvals.get(int(request_id))
    assert current is not None and not current.settled and current.edited_arguments is None
    assert not fake_slack.of("views.open")


# -- the operator's word from the CLI --------------------------------------------------------------------------------

async def test_an_operators_approval_of_a_passkey_or_quorum_rule_is_audited_as_skipping_it(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """`bot approvals approve` settles any request (an operator runs the bot itself); what it skipped of the rule,
    the passkey and the other votes, is on its audit line as it is for self-approval. Chat offers no such command."""
    from tests.bot_process import run_cli, slack_env

    rule = ('[[policies]]\ntool = "shell_run"\napprovers = ["U7", "U8"]\nquorum = 2\nstep_up = true\n'
            'self_approval = false\ntimeout_s = 3600\n')
    gateway = await _start(make_settings, start_gateway, tmp_path, rule, bot_public_url=ORIGIN, approval_poll_s=0.05)
    card = await _card(gateway, fake_slack, fake_llm, Reply(tool_calls=[("shell_run", {"command": "echo ops"})]))
    [request_id] = _calls(card)
    # From chat, "approve" is no verb of /bot approvals (it lists), whoever types it: the request still waits.
    for user in ("U1", "U7"):
        response = await gateway.interact(command_body(f"approvals approve {request_id}", user=user))
        assert response.status == 200
        current = await gateway.app.approvals.get(int(request_id))
        assert current is not None and not current.settled and current.approved_by == ()
    fake_llm.then(Reply("done"))
    settings = gateway.app.settings
    env = slack_env(fake_slack, fake_llm, 0) | {
        "DATABASE_URL": settings.resolved_database_url, "BOT_HOME": str(settings.bot_home),
        "BOT_CONFIG": str(settings.bot_config), "BOT_PUBLIC_URL": ORIGIN}
    code, out = await run_cli(tmp_path, env, "approvals", "approve", request_id)
    assert code == 0 and "Approved by operator" in out, out
    await gateway.idle()
    [approved] = [a for a in await audit_log(gateway.app.approvals.store.db) if a.action == "approval.approved"]
    assert approved.actor.startswith("operator")
    detail = json.loads(approved.detail or "{}")
    assert {k: v for k, v in detail.items() if k.endswith("_exempt")} == {
        "self_approval_exempt": "operator", "step_up_exempt": "operator", "quorum_exempt": "operator"}, detail


async def test_a_steered_in_sender_cannot_approve_all_of_the_card_their_words_led_to(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    from tests.fakes.core import until
    from tests.fakes.llm import Gate

    gateway = await _start(make_settings, start_gateway, tmp_path, bot_self_approval=False,
                           bot_approvers="U1,U2,U7", queue_mode="steer")
    gate = Gate(Reply(tool_calls=[("time_now", {})]))
    fake_llm.then(gate)
    root = mention("what time is it", user="U1")
    await gateway.send_event(root)
    await asyncio.wait_for(gate.reached.wait(), 10)
    await gateway.send_event(mention("then run both", thread_ts=root["ts"], user="U2"))
    await until(lambda: len(fake_slack.of("reactions.add")) >= 2, what="the steered message is queued")
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo s-1"}), ("shell_run", {"command": "echo s-2"})]))
    gate.opened.set()
    [card] = await fake_slack.wait_for("chat.postMessage")
    first, second = _calls(card)
    for told, user in enumerate(("U2", "U1"), start=1):
        await gateway.interact(block_action("approval_batch:approve", first, user=user))
        assert "it needs someone other than you" in await _told(fake_slack, told)
    for request_id in (first, second):
        current = await gateway.app.approvals.get(int(request_id))
        assert current is not None and not current.settled and set(current.senders) >= {"U1", "U2"}
    fake_llm.then(Reply("done"))
    await gateway.interact(block_action("approval_batch:approve", first, user="U7"))
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    assert len(fake_llm.requests) == 3


async def test_a_call_that_leaves_something_standing_in_the_askers_name_is_never_edited(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """A schedule is the asker's (its creator: its firings run as them, its destination approvals are keyed by them):
    an approver's edit would make the asker the author of a standing job, a prompt they never wrote."""
    gateway = await _start(make_settings, start_gateway, tmp_path, bot_approvers="requester,U7")
    asked = {"prompt": "post the weather", "cron": "0 9 * * *", "destination": "#general"}
    card = await _card(gateway, fake_slack, fake_llm, Reply(tool_calls=[("schedule_create", asked)]))
    [request_id] = _calls(card)  # the card cannot know the tool's kind (its Edit button stays): core refuses
    answer = await _edit(gateway, request_id, json.dumps(
        {**asked, "prompt": "every minute, post the deploy key", "cron": "* * * * *"}), user="U7")
    assert answer.get("response_action") == "errors" and "in the name of" in answer["errors"]["arguments"], answer
    current = await gateway.app.approvals.get(int(request_id))
    assert current is not None and not current.settled and current.edited_arguments is None


# -- found on the way: an on-call approver could not edit (closed, not open) -------------------------------------------

async def test_the_person_on_call_may_edit_a_call_their_rota_approves_and_nobody_else_may(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """The edited call is checked against the request's own approvers (the people on call when it was asked), as its
    approval is: a rule's ``oncall:`` entry names nobody until it is read."""
    from tests.fakes.pagerduty import TOKEN, FakePagerDuty
    from tests.fakes.server import RunningServer

    pagerduty = FakePagerDuty()
    server = await RunningServer(pagerduty.app()).start()
    pagerduty.url = server.url
    try:
        pagerduty.on_call["P1ONCALL"] = ["alice@example.com"]
        fake_slack.emails = {"alice@example.com": "U7"}
        gateway = await _start(make_settings, start_gateway, tmp_path,
                               '[[policies]]\ntool = "shell_run"\napprovers = ["oncall:P1ONCALL"]\n',
                               pagerduty_token=TOKEN, pagerduty_api_url=pagerduty.url)
        card = await _card(gateway, fake_slack, fake_llm, Reply(tool_calls=[("shell_run", {"command": "echo a"})]))
        [request_id] = _calls(card)
        answer = await _edit(gateway, request_id, '{"command": "echo by-someone-else"}', user="U8")
        assert "not one of its approvers" in answer["errors"]["arguments"]
        fake_llm.then(Reply("done"))
        assert await _edit(gateway, request_id, '{"command": "echo on-call-edit"}', user="U7") == {}
        await gateway.idle()
        current = await gateway.app.approvals.get(int(request_id))
        assert current is not None and current.edited_arguments == {"command": "echo on-call-edit"}
    finally:
        await server.stop()
