"""Point 9: a signed but malformed Slack payload gets a 4xx (or a 200 that does nothing), never a 5xx
(Slack retries a 5xx), and it changes nothing. Ids are shape-checked before they form session ids."""

from __future__ import annotations

import asyncio
import copy
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

import pytest
from sqlalchemy import func
from sqlmodel import col, select

from core.errors import InvalidInput
from core.model import SessionInfo
from core.store.tables import ControlRow, InputRow, MessageRow, ScheduleRow, SessionRow
from core.tools import Risk, Tool, ToolContext, run_tool
from core.triggers import TriggerSpec, parse_when
from tests.conftest import GatewayClient
from tests.fakes.llm import FakeLLM, Gate, Reply
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import block_action, dumps, event_body, mention, message, signed_headers

FORM = "application/x-www-form-urlencoded"
ARMED_SESSION = "slack:T1:C1:1.000001"


@pytest.fixture
async def armed(make_settings: Any, start_gateway: Any, fake_slack: FakeSlack) -> tuple[GatewayClient, str]:
    """A gateway with one pending approval that U1 could decide, where U1 (an admin) may also set the
    queue mode: a payload that got through would change something."""
    gateway: GatewayClient = await start_gateway(make_settings(bot_admins="U1"))
    app = gateway.app
    session = SessionInfo(id=ARMED_SESSION, channel="slack", agent=app.dispatcher.agents.default.name,
                          status="idle", reply_ref={"channel": "C1", "thread_ts": "1.000001"}, place="slack:T1:C1")
    await app.dispatcher.conversations.ensure_session(session, app.dispatcher.clock.now())
    request = await app.approvals.request(session_id=ARMED_SESSION, turn_id=None, call_id="call-1", tool="shell_run",
                                          args={"command": "id"}, agent=session.agent, place="slack:T1:C1",
                                          requester="U1")
    await fake_slack.wait_for("chat.postMessage")  # the card
    return gateway, str(request.id)


# -- payload builders ------------------------------------------------------------------------------

Mutate = Callable[[dict[str, Any]], object]


def _set(path: str, value: Any) -> Mutate:
    """Set (or with ``...`` delete) one dotted path in a payload."""
    def mutate(body: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target: Any = body
        for key in parents:
            target = target[int(key)] if isinstance(target, list) else target[key]
        if value is ...:
            del target[last]
        else:
            target[last] = value
    return mutate


def _event(mutate: Mutate, *, kind: str = "mention") -> tuple[str, str]:
    event = mention("approve everything") if kind == "mention" else message("hi", channel="D1", channel_type="im")
    body = event_body(event)
    mutate(body)
    return dumps(body), "application/json"


def _click(request_id: str, mutate: Mutate) -> tuple[str, str]:
    payload = {
        "type": "block_actions", "team": {"id": "T1"}, "user": {"id": "U1"}, "api_app_id": "A1", "token": "legacy",
        "trigger_id": "111.222.abc", "channel": {"id": "C1"},
        "container": {"type": "message", "message_ts": "1.000002", "channel_id": "C1"},
        "message": {"ts": "1.000002", "text": ""},
        "actions": [{"action_id": "approval:approve", "block_id": f"approval:{request_id}", "value": request_id,
                     "type": "button", "action_ts": "1.1"}],
    }
    mutate(payload)
    return urlencode({"payload": json.dumps(payload)}), FORM


def _submit(request_id: str, mutate: Mutate, *, callback: str = "approval_deny") -> tuple[str, str]:
    values = ({"reason": {"text": {"type": "plain_text_input", "value": "no"}}} if callback == "approval_deny"
              else {"value": {"value": {"type": "plain_text_input", "value": "s3cret"}}})
    payload = {
        "type": "view_submission", "team": {"id": "T1"}, "user": {"id": "U1"}, "api_app_id": "A1",
        "token": "legacy", "trigger_id": "111.222.abc",
        "view": {"id": "V1", "type": "modal", "callback_id": callback, "private_metadata": request_id,
                 "state": {"values": values}},
    }
    mutate(payload)
    return urlencode({"payload": json.dumps(payload)}), FORM


def _interaction(payload: Any) -> tuple[str, str]:
    return urlencode({"payload": payload if isinstance(payload, str) else json.dumps(payload)}), FORM


def _command(mutate: Mutate, *, as_json: bool = False) -> tuple[str, str]:
    form: dict[str, Any] = {"command": "/bot", "text": "queue collect", "user_id": "U1", "channel_id": "C1",
                            "team_id": "T1", "response_url": "http://127.0.0.1:9/resp", "trigger_id": "111.222.abc",
                            "token": "legacy"}
    mutate(form)
    return (json.dumps(form), "application/json") if as_json else (urlencode(form), FORM)


def _noop(_body: dict[str, Any]) -> None:
    return None


# Each case: (name, build(request_id) -> (body, content type)).
EVENTS: list[tuple[str, Callable[[str], tuple[str, str]]]] = [
    ("event is a list", lambda _r: _event(_set("event", [1]))),
    ("event is a string", lambda _r: _event(_set("event", "x"))),
    ("event.type missing", lambda _r: _event(_set("event.type", ...))),
    ("event.type a number", lambda _r: _event(_set("event.type", 5))),
    ("event.user a number", lambda _r: _event(_set("event.user", 5))),
    ("event.user an object", lambda _r: _event(_set("event.user", {"id": "U1"}))),
    ("event.user with a colon", lambda _r: _event(_set("event.user", "U1:evil"))),
    ("event.channel an object", lambda _r: _event(_set("event.channel", {"id": "C1"}))),
    ("event.channel a number", lambda _r: _event(_set("event.channel", 7))),
    ("event.channel with a colon", lambda _r: _event(_set("event.channel", "C1:evil"))),
    ("event.channel a path", lambda _r: _event(_set("event.channel", "../C1"))),
    ("event.channel lower case", lambda _r: _event(_set("event.channel", "c1"))),
    ("event.ts a float", lambda _r: _event(_set("event.ts", 1.5))),
    ("event.ts not a timestamp", lambda _r: _event(_set("event.ts", "1.1:evil"))),
    ("event.thread_ts a number", lambda _r: _event(_set("event.thread_ts", 12))),
    ("event.thread_ts a path", lambda _r: _event(_set("event.thread_ts", "../../x"))),
    ("team_id a number", lambda _r: _event(_set("team_id", 1))),
    ("team_id an object", lambda _r: _event(_set("team_id", {"id": "T1"}))),
    ("team_id with a colon", lambda _r: _event(_set("team_id", "T1:C2"))),
    ("event.team with a colon", lambda _r: _event(lambda b: (b.pop("team_id"), b.pop("authorizations"),
                                                            _set("event.team", "T1:C9")(b)))),
    ("authorizations a string", lambda _r: _event(_set("authorizations", "x"))),
    ("authorizations [1]", lambda _r: _event(_set("authorizations", [1]))),
    ("event.text an object", lambda _r: _event(_set("event.text", {"a": 1}))),
    ("event.text a list", lambda _r: _event(_set("event.text", ["<@UBOT> hi"]))),
    ("event.files a string", lambda _r: _event(_set("event.files", "x"))),
    ("event.files [1]", lambda _r: _event(_set("event.files", [1]))),
    ("event.blocks an object", lambda _r: _event(_set("event.blocks", {"a": 1}))),
    ("event.subtype a list", lambda _r: _event(_set("event.subtype", ["x"]))),
    ("DM user a number", lambda _r: _event(_set("event.user", 3), kind="dm")),
    ("DM channel_type an object", lambda _r: _event(_set("event.channel_type", {"im": True}), kind="dm")),
    ("DM bot_id an object", lambda _r: _event(_set("event.bot_id", {"x": 1}), kind="dm")),
    ("event_id an object", lambda _r: _event(_set("event_id", {"x": 1}))),
]

ACTIONS: list[tuple[str, Callable[[str], tuple[str, str]]]] = [
    ("click: user is a string", lambda r: _click(r, _set("user", "U1"))),
    ("click: user missing", lambda r: _click(r, _set("user", ...))),
    ("user.id a number", lambda r: _click(r, _set("user", {"id": 1}))),
    ("user.id with a colon", lambda r: _click(r, _set("user", {"id": "U1:x"}))),
    ("user a list", lambda r: _click(r, _set("user", ["U1"]))),
    ('actions: ["x"]', lambda r: _click(r, _set("actions", ["x"]))),
    ("actions missing", lambda r: _click(r, _set("actions", ...))),
    ("actions empty", lambda r: _click(r, _set("actions", []))),
    ("actions a string", lambda r: _click(r, _set("actions", "approval:approve"))),
    ("action_id a number", lambda r: _click(r, _set("actions.0.action_id", 5))),
    ("action_id missing", lambda r: _click(r, _set("actions.0.action_id", ...))),
    ("action value an object", lambda r: _click(r, _set("actions.0.value", {"id": r}))),
    ("action value a number", lambda r: _click(r, _set("actions.0.value", int(r)))),
    ("channel a string", lambda r: _click(r, _set("channel", "C1"))),
    ("channel.id a number", lambda r: _click(r, _set("channel", {"id": 1}))),
    ("channel.id with a colon", lambda r: _click(r, _set("channel", {"id": "C1:evil"}))),
    ("container a string", lambda r: _click(r, _set("container", "x"))),
    ("container a list", lambda r: _click(r, _set("container", [1]))),
    ("team a number", lambda r: _click(r, _set("team", 5))),
    ("trigger_id an object", lambda r: _click(r, _set("trigger_id", {"a": 1}))),
    ("message a string", lambda r: _click(r, _set("message", "x"))),
    ("payload is a list", lambda _r: _interaction([1, 2])),
    ("payload is not JSON", lambda _r: _interaction("{nope")),
    ("payload is a number", lambda _r: _interaction("5")),
    ("unknown button, user a string", lambda r: _click(r, lambda p: (_set("actions.0.action_id", "other")(p),
                                                                     _set("user", "U1")(p)))),
]

VIEWS: list[tuple[str, Callable[[str], tuple[str, str]]]] = [
    ("view.state a string", lambda r: _submit(r, _set("view.state", "x"))),
    ("view.state.values a list", lambda r: _submit(r, _set("view.state.values", [1]))),
    ("values block a string", lambda r: _submit(r, _set("view.state.values", {"reason": "x"}))),
    ("values element a string", lambda r: _submit(r, _set("view.state.values", {"reason": {"text": "x"}}))),
    ("value an object", lambda r: _submit(r, _set("view.state.values.reason.text.value", {"a": 1}))),
    ("private_metadata an object", lambda r: _submit(r, _set("view.private_metadata", {"id": r}))),
    ("private_metadata a number", lambda r: _submit(r, _set("view.private_metadata", int(r)))),
    ("submit: user is a string", lambda r: _submit(r, _set("user", "U1"))),
    ("submit: user missing", lambda r: _submit(r, _set("user", ...))),
    ("view a string", lambda r: _submit(r, _set("view", "approval_deny"))),
    ("view missing", lambda r: _submit(r, _set("view", ...))),
    ("callback_id a number", lambda r: _submit(r, _set("view.callback_id", 5))),
    ("credential state a string", lambda r: _submit(r, _set("view.state", "x"), callback="credential_provide")),
    ("credential value an object", lambda r: _submit(
        r, _set("view.state.values.value.value.value", ["x"]), callback="credential_provide")),
    ("credential user a string", lambda r: _submit(r, _set("user", "U1"), callback="credential_provide")),
    ("view_closed with user a string", lambda r: _submit(r, lambda p: (_set("type", "view_closed")(p),
                                                                       _set("user", "U1")(p)))),
    ("view_closed with view a list", lambda r: _submit(r, lambda p: (_set("type", "view_closed")(p),
                                                                     _set("view", [1])(p)))),
]

OTHERS: list[tuple[str, Callable[[str], tuple[str, str]]]] = [
    ("block_suggestion, user a string", lambda _r: _interaction({
        "type": "block_suggestion", "user": "U1", "team": {"id": "T1"}, "action_id": "a", "block_id": "b",
        "value": "x", "view": {"id": "V1", "callback_id": "c"}})),
    ("block_suggestion, value an object", lambda _r: _interaction({
        "type": "block_suggestion", "user": {"id": "U1"}, "team": {"id": "T1"}, "action_id": "a",
        "block_id": "b", "value": {"x": 1}, "container": "x"})),
    ("shortcut, user a number", lambda _r: _interaction({
        "type": "shortcut", "callback_id": "s", "user": 5, "team": {"id": "T1"}, "trigger_id": "1.2.a"})),
    ("message_action, channel a list", lambda _r: _interaction({
        "type": "message_action", "callback_id": "s", "user": {"id": "U1"}, "team": {"id": "T1"},
        "channel": [1], "message": "x", "trigger_id": "1.2.a"})),
    ("command without user_id", lambda _r: _command(_set("user_id", ...))),
    ("command without channel_id", lambda _r: _command(_set("channel_id", ...))),
    ("command without team_id", lambda _r: _command(_set("team_id", ...))),
    ("command with channel_id C1:evil", lambda _r: _command(_set("channel_id", "C1:evil"))),
    ("command with team_id ../T1", lambda _r: _command(_set("team_id", "../T1"))),
    ("command with user_id lower case", lambda _r: _command(_set("user_id", "u1"))),
    ("command text an object (JSON)", lambda _r: _command(_set("text", {"a": "queue collect"}), as_json=True)),
    ("command user_id a list (JSON)", lambda _r: _command(_set("user_id", ["U1"]), as_json=True)),
    ("command trigger_id an object (JSON)", lambda _r: _command(_set("trigger_id", {"a": 1}), as_json=True)),
    ("schedule command with channel_id C1:evil", lambda _r: _command(
        lambda f: (_set("channel_id", "C1:evil")(f), _set("text", "schedule every 2m #acc-dest hi")(f)))),
]

CASES = EVENTS + ACTIONS + VIEWS + OTHERS


async def _stored(gateway: GatewayClient) -> dict[str, Any]:
    """What a payload could have changed: sessions, inputs, switches, schedules, the approval."""
    async with gateway.app.db.read() as s:
        counts = {table.__name__: int((await s.exec(select(func.count()).select_from(table))).one())
                  for table in (SessionRow, InputRow, ScheduleRow)}
        keys = sorted((await s.exec(select(ControlRow.key).where(col(ControlRow.key).like("queue_mode:%")))).all())
    approvals = [(a.id, a.status) for a in await gateway.app.approvals.pending()]
    return {**counts, "queue_modes": keys, "pending": approvals}


@pytest.mark.parametrize(("name", "build"), CASES, ids=[c[0] for c in CASES])
async def test_a_malformed_signed_payload_gets_no_5xx_and_changes_nothing(
    armed: tuple[GatewayClient, str], fake_llm: FakeLLM, fake_slack: FakeSlack, name: str,
    build: Callable[[str], tuple[str, str]],
) -> None:
    gateway, request_id = armed
    before = await _stored(gateway)
    posts_before = len(fake_slack.posts())
    body, content_type = build(request_id)
    resp = await gateway.post_raw(body, signed_headers(body, content_type=content_type))
    assert resp.status < 500, f"{name}: {resp.status}"
    await gateway.idle()
    assert await _stored(gateway) == before
    assert fake_llm.requests == []
    assert len(fake_slack.posts()) == posts_before
    assert fake_slack.of("views.open") == []


@pytest.mark.parametrize(("name", "build"), [c for c in CASES if c[0] in (
    "event is a list", "click: user is a string", "view.state a string", "command without user_id")])
async def test_a_malformed_unsigned_payload_is_still_refused_as_unsigned(
    armed: tuple[GatewayClient, str], name: str, build: Callable[[str], tuple[str, str]],
) -> None:
    gateway, request_id = armed
    body, content_type = build(request_id)
    resp = await gateway.post_raw(body, {"Content-Type": content_type})
    assert resp.status == 401, name
    stale = signed_headers(body, content_type=content_type, timestamp=int(time.time()) - 600)
    assert (await gateway.post_raw(body, stale)).status == 401, name


async def test_the_well_formed_versions_still_work(
    armed: tuple[GatewayClient, str], fake_slack: FakeSlack, fake_llm: FakeLLM,
) -> None:
    """The builders above are valid without their mutation: the refusals are about the odd shapes."""
    gateway, request_id = armed
    body, content_type = _command(_noop)
    resp = await gateway.post_raw(body, signed_headers(body, content_type=content_type))
    assert resp.status == 200 and "now collect" in await resp.text()
    body, content_type = _click(request_id, _noop)
    assert (await gateway.post_raw(body, signed_headers(body, content_type=content_type))).status == 200
    await gateway.idle()
    assert (await gateway.app.approvals.get(int(request_id))).status == "approved"  # type: ignore[union-attr]
    body, content_type = _event(_noop)
    assert (await gateway.post_raw(body, signed_headers(body, content_type=content_type))).status == 200
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    assert fake_llm.requests and fake_llm.requests[0]["messages"][-1]["content"] == "approve everything"


async def test_an_internal_failure_after_a_valid_payload_is_still_a_5xx(
    gateway: GatewayClient, fake_llm: FakeLLM,
) -> None:
    """A valid message our code could not store is answered 500, so Slack delivers it again."""
    async def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("the database is gone")

    gateway.app.dispatcher.accept = broken  # type: ignore[method-assign]
    resp = await gateway.send_event(copy.deepcopy(mention("hello")))
    assert resp.status == 500


async def test_socket_mode_acknowledges_a_malformed_envelope_and_ignores_it(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
) -> None:
    """Socket Mode has no HTTP status: a malformed envelope is acknowledged (so it is not resent), and
    nothing in it is used."""
    settings = make_settings(slack_signing_secret=None, slack_app_token="xapp-1-test-app-token")
    gateway: GatewayClient = await start_gateway(settings)
    for name in ("event.channel with a colon", "event.text an object", "team_id with a colon", "event is a list"):
        body, _ = dict(EVENTS)[name]("1")
        envelope = await fake_slack.push_socket_event(json.loads(body))
        await fake_slack.wait_for_ack(envelope)
    good = mention("still listening")
    await fake_slack.wait_for_ack(await fake_slack.push_socket_event(event_body(good)))
    posts = await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()
    assert [p.params["text"] for p in posts] == ["echo: still listening"]
    assert len(fake_llm.requests) == 1
    async with gateway.app.db.read() as s:
        assert list((await s.exec(select(SessionRow.id))).all()) == [f"slack:T1:C1:{good['ts']}"]


# -- what a payload says, not only its shape (the outside review) -----------------------------------

ODD_COMMANDS = [
    # ids people type: ASCII digits only, and never more than the database holds
    ("approvals revoke \u00b2", "is not a grant id"),
    ("approvals revoke \u0661\u0662", "is not a grant id"),
    ("approvals revoke 99999999999999999999999", "is not a grant id"),
    ("schedules cancel ²", "is not a schedule id"),
    ("schedules resume \u0663", "is not a schedule id"),
    ("schedules pause 99999999999999999999999", "is not a schedule id"),
    # durations and dates: bounded, read strictly
    ("schedule every 99999999999999999999999999999d #ops hi", "at most 366 days"),
    ("schedule every 367d #ops hi", "at most 366 days"),
    ("schedule every ²m #ops hi", "cannot read the interval"),
    ("schedule at 9999-12-31T23:59 tz America/New_York #ops hi", "at most 10 years ahead"),
]


@pytest.mark.parametrize(("text", "answer"), ODD_COMMANDS, ids=[c[0] for c in ODD_COMMANDS])
async def test_a_slash_command_with_odd_numbers_is_answered_not_a_5xx(
    armed: tuple[GatewayClient, str], fake_llm: FakeLLM, text: str, answer: str,
) -> None:
    gateway, _request_id = armed  # U1 is an admin here: the ids reach the database
    before = await _stored(gateway)
    resp = await gateway.post_raw(*_signed_command(text))
    assert resp.status == 200, f"{text!r}: {resp.status}"
    assert answer in await resp.text()
    await gateway.idle()
    assert await _stored(gateway) == before
    assert fake_llm.requests == []


def _signed_command(text: str, *, user: str = "U1") -> tuple[str, dict[str, str]]:
    body, content_type = _command(_set("text", text))
    body = body.replace("user_id=U1", f"user_id={user}")
    return body, signed_headers(body, content_type=content_type)


def test_schedule_triggers_are_bounded_wherever_they_come_from() -> None:
    """The model's schedule_create passes every_seconds and at straight to TriggerSpec."""
    now = datetime(2026, 1, 1, tzinfo=UTC)
    for spec, why in [(TriggerSpec(every_seconds=10**30), "at most 366 days"),
                      (TriggerSpec(every_seconds=366 * 86400 + 1), "at most 366 days"),
                      (TriggerSpec(every_seconds=True), "every_seconds must be a whole number"),
                      (TriggerSpec(every_seconds=10**400), "at most 366 days"),
                      (TriggerSpec(at="9999-12-31T23:59:00-05:00"), "at most 10 years ahead"),
                      (TriggerSpec(at="2036-06-01T00:00:00"), "at most 10 years ahead")]:
        with pytest.raises(InvalidInput, match=why):
            spec.check(now, 60)
    TriggerSpec(every_seconds=366 * 86400).check(now, 60)
    TriggerSpec(at="2035-12-31T00:00:00").check(now, 60)
    assert parse_when("every 5m #ops hi") == (TriggerSpec(every_seconds=300), "#ops hi")
    assert parse_when("every 30 seconds #ops hi") == (TriggerSpec(every_seconds=30), "#ops hi")
    for text in ("every ²m #ops hi", "every \u0661\u0662m #ops hi", "every 1h2 #ops hi", "every 1x #ops hi"):
        with pytest.raises(InvalidInput):
            parse_when(text)


async def _texts(gateway: GatewayClient) -> list[str]:
    """Every free text the database holds."""
    async with gateway.app.db.read() as s:
        return [*(await s.exec(select(InputRow.text))).all(), *(await s.exec(select(MessageRow.content))).all(),
                *(await s.exec(select(ScheduleRow.prompt))).all()]


async def test_nul_and_lone_surrogates_from_slack_are_repaired_before_use(
    gateway: GatewayClient, fake_llm: FakeLLM, fake_slack: FakeSlack,
) -> None:
    """A NUL would make PostgreSQL refuse the row and a lone surrogate cannot be encoded at all: the
    message used to get a 500 (and Slack retried it). Now NUL is dropped, a lone surrogate becomes U+FFFD."""
    event = mention("hello\x00 there")
    event["text"] = "\ud800 " + event["text"]
    body = dumps(event_body(event))
    assert "\\ud800" in body and "\\u0000" in body
    resp = await gateway.post_raw(body, signed_headers(body))
    assert resp.status == 200
    await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()
    assert fake_llm.requests[0]["messages"][-1]["content"] == "\ufffd  hello there"

    resp = await gateway.post_raw(*_signed_command("schedule every 1h #ops hi\x00 there"))
    assert resp.status == 200 and "created" in await resp.text()
    texts = await _texts(gateway)
    assert "hi there" in texts  # (a form body cannot carry a lone surrogate)
    assert not [t for t in texts if "\x00" in t or any("\ud800" <= c <= "\udfff" for c in t)]


async def test_socket_mode_repairs_them_too(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
) -> None:
    settings = make_settings(slack_signing_secret=None, slack_app_token="xapp-1-test-app-token")
    gateway: GatewayClient = await start_gateway(settings)
    event = mention("hi\x00 there \udc00")
    await fake_slack.wait_for_ack(await fake_slack.push_socket_event(event_body(event)))
    await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()
    assert fake_llm.requests[0]["messages"][-1]["content"] == "hi there \ufffd"


async def test_a_models_odd_text_is_repaired_and_odd_arguments_are_refused(
    make_settings: Any, start_gateway: Any, fake_llm: FakeLLM, fake_slack: FakeSlack,
) -> None:
    """Model output is input too: a lone surrogate in tool arguments crashed the turn (the grant
    lookup could not encode it); a NUL in them would reach a card, a grant and a command line."""
    gateway: GatewayClient = await start_gateway(make_settings(shell_sandbox="none"))
    fake_llm.then(Reply(tool_calls=[("shell_run", '{"command": "echo \\ud800 hi"}'),
                                    ("shell_run", '{"command": "echo \\u0000 hi"}'),
                                    ("time_now", '{"timezone": "\\udc00"}')]),
                  Reply("done \ud83d and\x00 more"))
    await gateway.send_event(mention("go"))
    posts = await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()
    assert posts[0].params["text"] == "done \ufffd and more"
    results = [m["content"] for m in fake_llm.requests[1]["messages"] if m["role"] == "tool"]
    assert results == ["error: arguments for shell_run contain invalid Unicode (a lone surrogate)",
                       "error: arguments for shell_run contain a NUL character",
                       "error: arguments for time_now contain invalid Unicode (a lone surrogate)"]
    assert await gateway.app.approvals.pending() == []
    texts = await _texts(gateway)
    assert "done \ufffd and more" in texts
    assert not [t for t in texts if "\x00" in t or any("\ud800" <= c <= "\udfff" for c in t)]


async def test_a_tools_output_is_repaired_before_anyone_stores_it() -> None:
    """A shell's output may hold NUL bytes (``printf 'a\\0b'``); stored as is, PostgreSQL refuses the row."""
    async def odd(_ctx: ToolContext, _args: dict[str, Any]) -> str:
        return "a\x00b\udc80c"

    tool = Tool(name="odd", description="", parameters={"type": "object"}, risk=Risk.SAFE, function=odd)
    ctx = ToolContext(session_id="s", turn_id=1, agent="default", sender="U1")
    assert await run_tool(tool, ctx, {}) == "ab\ufffdc"


async def test_a_failure_while_answering_a_command_or_a_click_is_a_200_with_an_answer(
    armed: tuple[GatewayClient, str], fake_slack: FakeSlack,
) -> None:
    """Slack never retries a slash command or a click: a 500 only shows the person a cryptic
    failure. Our own failure is logged and the person is told, with a 200. (Events keep their 500,
    so Slack delivers them again: see test_an_internal_failure_after_a_valid_payload_is_still_a_5xx.)"""
    gateway, request_id = armed

    async def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("the database is gone")

    gateway.app.dispatcher.stop_place = broken  # type: ignore[method-assign]
    gateway.app.approvals.decide = broken  # type: ignore[method-assign]
    resp = await gateway.post_raw(*_signed_command("stop"))
    assert resp.status == 200
    assert "Something went wrong on my side (RuntimeError)" in json.loads(await resp.text())["text"]
    body, content_type = _click(request_id, _noop)
    resp = await gateway.post_raw(body, signed_headers(body, content_type=content_type))
    assert resp.status == 200
    await fake_slack.wait_for("chat.postEphemeral")
    assert "Something went wrong on my side (RuntimeError)" in fake_slack.ephemerals("U1")[0]
    body, content_type = _submit(request_id, _noop)
    resp = await gateway.post_raw(body, signed_headers(body, content_type=content_type))
    assert resp.status == 200


async def _card(fake_slack: FakeSlack) -> Any:
    async with asyncio.timeout(10):
        while True:
            for call in fake_slack.posts():
                if any(b.get("type") == "actions" for b in call.params.get("blocks") or ()):
                    return call
            await asyncio.sleep(0.02)


def _asked_by(card: Any) -> str:
    return " ".join(e["text"] for b in card.params["blocks"] if b.get("type") == "context" for e in b["elements"])


async def test_a_card_names_everyone_whose_messages_the_turn_took(
    make_settings: Any, start_gateway: Any, fake_llm: FakeLLM, fake_slack: FakeSlack,
) -> None:
    """U1 asks something harmless; while it runs U2 replies in the thread and that message is steered
    into U1's turn. The command the model then asks for may be U2's idea: the card says so. Who may
    approve does not widen: with BOT_APPROVERS=requester that is still U1 only (the turn's first sender)."""
    gateway: GatewayClient = await start_gateway(make_settings(shell_sandbox="none"))
    gate = Gate(then=Reply(tool_calls=[("time_now", {})]))
    fake_llm.then(gate, Reply(tool_calls=[("shell_run", {"command": "echo from-u2"})]))
    root = mention("what time is it?", user="U1")
    await gateway.send_event(root)
    await gate.reached.wait()
    await gateway.send_event(message("also run echo from-u2", user="U2", thread_ts=root["ts"]))
    await gateway.send_event(mention("and say hi", user="U3", thread_ts=root["ts"]))
    async with gateway.app.db.read() as s:  # both wait for the running turn
        async with asyncio.timeout(5):
            while len((await s.exec(select(InputRow.id))).all()) < 3:
                await asyncio.sleep(0.02)
    gate.opened.set()
    card = await _card(fake_slack)
    assert "Asked by <@U1> (with messages from <@U2> and <@U3>)" in _asked_by(card)
    request_id = card.params["blocks"][-1]["elements"][0]["value"]
    assert (await gateway.app.approvals.get(int(request_id))).other_senders == ("U2", "U3")  # type: ignore[union-attr]

    fake_llm.then(Reply("done"))
    await gateway.interact(block_action("approval:approve", request_id, user="U2"))
    await fake_slack.wait_for("chat.postEphemeral")
    assert "can't approve" in fake_slack.ephemerals("U2")[0]
    await gateway.interact(block_action("approval:approve", request_id, user="U1"))
    update = await fake_slack.wait_for("chat.update")
    await gateway.idle()
    assert "(with messages from <@U2> and <@U3>)" in json.dumps(update[0].params["blocks"])


async def test_the_web_chat_reads_ids_and_text_the_same_way(gateway: GatewayClient, fake_llm: FakeLLM) -> None:
    """The same input through the web chat's API: ids too large for the database were a 500, and so
    was a message holding a lone surrogate."""
    cid = "0123456789abcdef0123456789abcdef"
    for path, body in [("/api/schedules/99999999999999999999/pause", {}), ("/api/schedules/%D9%A3/pause", {}),
                       ("/api/approvals/99999999999999999999", {"verdict": "approve"}),
                       ("/api/credentials/99999999999999999999", {"value": "x"})]:
        async with gateway.http.post(f"{gateway.base}{path}", data=json.dumps(body),
                                     headers={"Content-Type": "application/json"}) as resp:
            assert resp.status == 400, path
    async with gateway.http.post(f"{gateway.base}/api/conversations/{cid}/messages",
                                 data=json.dumps({"text": "hi\x00 there \ud800"}),
                                 headers={"Content-Type": "application/json"}) as resp:
        assert resp.status == 200
    await gateway.idle()
    assert fake_llm.requests[0]["messages"][-1]["content"] == "hi there \ufffd"
