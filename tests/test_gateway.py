"""The Gateway (the one object channels call): refusals typed and answered by type, channels kept apart,
and the ``/bot schedule`` origin decided by core."""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from channels.web.adapter import refusal_status, with_refusals
from core.errors import Conflict, CoreError, InvalidInput, NotAllowed, NotFound, StoreError, Unavailable
from core.gateway import Command
from core.model import SessionInfo
from core.triggers import TriggerSpec
from tests.conftest import GatewayClient
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.server import RunningServer
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import block_action, mention

CID = "0123456789abcdef0123456789abcdef"


async def _post(gw: GatewayClient, path: str, body: Any) -> tuple[int, Any]:
    async with gw.http.post(f"{gw.base}{path}", data=json.dumps(body),
                            headers={"Content-Type": "application/json"}) as resp:
        return resp.status, await resp.json()


# -- web: a refusal's status comes from its type ----------------------------------------------------


@pytest.mark.parametrize(("error", "status"), [
    (NotAllowed("x"), 403), (NotFound("x"), 404), (Conflict("x"), 409), (InvalidInput("x"), 400),
    (Unavailable("x"), 503), (StoreError("x"), 503),
    (InvalidInput("only its creator or an admin can cancel schedule 1"), 400),  # the words decide nothing
    (NotAllowed("nothing about creators here"), 403),
])
def test_refusal_status_is_chosen_by_type(error: CoreError, status: int) -> None:
    assert refusal_status(error) == status


async def _serve(raise_it: Callable[[], Awaitable[None]]) -> tuple[int, str]:
    async def handler(_request: web.Request) -> web.Response:
        await raise_it()
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_get("/", with_refusals(handler))
    server = await RunningServer(app).start()
    try:
        async with aiohttp.ClientSession() as http, http.get(server.url) as resp:
            return resp.status, await resp.text()
    finally:
        await server.stop()


async def test_a_bug_in_core_stays_a_server_error() -> None:
    async def bug() -> None:
        raise KeyError("only its creator")  # not a refusal, whatever it says

    async def refusal() -> None:
        raise NotAllowed("no")

    status, body = await _serve(bug)
    assert status == 500 and "only its creator" not in body  # nothing of the bug is told, and not as a 4xx
    assert await _serve(refusal) == (403, json.dumps({"error": "no"}))


async def test_web_schedule_changes_answer_by_the_kind_of_refusal(gateway: GatewayClient) -> None:
    origin = SessionInfo(id=f"web:{CID}", channel="web", agent="default", status="idle", reply_ref={})
    mine = await gateway.app.schedules.create(prompt="report", trigger=TriggerSpec(every_seconds=3600),
                                              destination="#ops", agent="default", creator="web", origin=origin,
                                              channel="slack")
    # Both were 409 before: an unknown schedule, and an action nobody has.
    assert await _post(gateway, "/api/schedules/999/cancel", {}) == (404, {"error": "there is no schedule 999"})
    status, body = await _post(gateway, f"/api/schedules/{mine.id}/explode", {})
    assert status == 400 and "unknown action 'explode'" in body["error"]
    status, body = await _post(gateway, f"/api/schedules/{mine.id}/resume", {})
    assert status == 409 and "not paused" in body["error"]


# -- channels are kept apart ------------------------------------------------------------------------


async def test_the_web_cannot_decide_or_provide_for_a_slack_conversation(
    gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo slack-only"})]))
    await gateway.send_event(mention("run it"))
    card = (await fake_slack.wait_for("chat.postMessage"))[0]
    approval_id = int(card.params["blocks"][-1]["elements"][0]["value"])
    unknown = await _post(gateway, "/api/approvals/99999", {"verdict": "approve"})
    assert unknown == (404, {"error": "no such approval request here"})
    # A Slack request's id is refused exactly as an unknown one: the web learns nothing about it.
    assert await _post(gateway, f"/api/approvals/{approval_id}", {"verdict": "approve"}) == unknown
    assert await _post(gateway, f"/api/approvals/{approval_id}", {"verdict": "always"}) == unknown
    info = await gateway.app.approvals.get(approval_id)
    assert info is not None and info.status == "pending"
    # The checks of what was sent come first, and are core's.
    too_long = await _post(gateway, f"/api/approvals/{approval_id}", {"verdict": "deny", "reason": "x" * 501})
    assert too_long == (400, {"error": "reason must be text of at most 500 characters"})
    assert (await _post(gateway, f"/api/approvals/{approval_id}", {"verdict": ["approve"]}))[0] == 400

    await gateway.app.approvals.decide(approval_id, "deny", by="test", operator=True)
    fake_llm.then(Reply("skipped"), Reply(tool_calls=[("credential_request", {"name": "acc.token", "reason": "r"})]))
    await gateway.send_event(mention("need a token"))
    posts = await fake_slack.wait_for("chat.postMessage", 3)
    request_id = next(p for p in posts if "credential:provide" in json.dumps(p.params.get("blocks")))
    value = request_id.params["blocks"][-1]["elements"][0]["value"]
    unknown = await _post(gateway, "/api/credentials/99999", {"value": "s3cret-value"})
    assert unknown == (404, {"error": "no such credential request here"})
    assert await _post(gateway, f"/api/credentials/{value}", {"value": "s3cret-value"}) == unknown
    assert await gateway.app.credentials.store.all_secrets() == []


# -- /bot schedule: core decides the origin -----------------------------------------------------------


async def test_a_command_cannot_name_a_reserved_session(gateway: GatewayClient) -> None:
    reply = await gateway.app.gateway.command(Command(
        text="schedule every 2h #acc-dest say hi", user="U1", channel="slack", place="schedule:7:1",
        reply_ref={"channel": "C1"}, trigger="t1"))
    assert reply == "Not scheduled: session id 'schedule:7:1:command-t1' is reserved"
    assert await gateway.app.schedules.list() == []


async def test_a_malformed_trigger_id_never_reaches_a_session_id(gateway: GatewayClient) -> None:
    reply = await gateway.app.gateway.command(Command(
        text="schedule every 2h #acc-dest say hi", user="U1", channel="slack", place="slack:T1:C1",
        reply_ref={"channel": "C1"}, trigger="../x y:z"))
    assert reply.startswith("Schedule 1 created")
    row = await gateway.app.schedules.store.get(1)
    assert row is not None and re.fullmatch(r"slack:T1:C1:command-[0-9a-f]{32}", row.origin_session or "")
    origin = await gateway.app.gateway.session(row.origin_session or "")
    assert origin is not None and (origin.agent, origin.place) == ("default", "slack:T1:C1")


async def test_a_provide_click_is_refused_in_cores_order(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    gateway = await start_gateway(make_settings(bot_admins="UADMIN"))
    fake_llm.then(Reply(tool_calls=[("credential_request", {"name": "acc.token", "reason": "to call the API"})]))
    await gateway.send_event(mention("check the account"))
    card = (await fake_slack.wait_for("chat.postMessage"))[0]
    request_id = card.params["blocks"][-1]["elements"][0]["value"]
    fake_llm.then(Reply("thanks"))
    stored = await gateway.app.gateway.provide(int(request_id), "s3cret-value", by="UADMIN", channel="slack")
    assert stored.stored
    for value, user in ((request_id, "U9"), (request_id, "U1"), ("99999", "U1"), ("x1", "U1")):
        await gateway.interact(block_action("credential:provide", value, user=user))
    told = await fake_slack.wait_for("chat.postEphemeral", 4)
    assert sorted((c.params["user"], c.params["text"]) for c in told) == sorted([
        # Someone who may not provide it is not told how it ended.
        ("U9", "You can't provide this credential: you are not one of its approvers."),
        ("U1", "Already settled: acc.token stored by UADMIN."),
        ("U1", "That credential request does not exist."),
        ("U1", "That button does not belong to a credential request I know."),
    ])
    assert fake_slack.of("views.open") == []
