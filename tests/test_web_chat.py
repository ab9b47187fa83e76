"""The web chat API over real HTTP: send, live events, stop, list, login and bad input."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from core.store.feedback import FeedbackStore
from tests.conftest import GatewayClient
from tests.fakes.llm import FakeLLM, Gate, HttpError, Reply
from tests.fakes.slack_api import FakeSlack

CID = "0123456789abcdef0123456789abcdef"
JSON = {"Content-Type": "application/json"}


async def _post(gw: GatewayClient, path: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async with gw.http.post(f"{gw.base}{path}", data=json.dumps(body), headers=headers or JSON) as resp:
        return resp.status, await resp.json()


async def _get(gw: GatewayClient, path: str, **kwargs: Any) -> tuple[int, Any]:
    async with gw.http.get(f"{gw.base}{path}", **kwargs) as resp:
        return resp.status, await resp.json(content_type=None)


async def _events(gw: GatewayClient, cid: str, connected: asyncio.Event) -> AsyncIterator[dict[str, Any]]:
    async with gw.http.get(f"{gw.base}/api/conversations/{cid}/events") as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        async for raw in resp.content:
            line = raw.decode().strip()
            if line == ": connected":  # the server now sends this stream every event of the conversation
                connected.set()
            elif line.startswith("data: "):
                yield json.loads(line[6:])


async def _collect(stream: AsyncIterator[dict[str, Any]], until: str, out: list[dict[str, Any]]) -> None:
    async for item in stream:
        out.append(item)
        if item["type"] == until:
            return


async def _watch(gw: GatewayClient, cid: str, until: str, out: list[dict[str, Any]]) -> asyncio.Task[None]:
    """Collect the conversation's live events into ``out`` until one of type ``until``; returns once
    the stream is connected, so nothing sent after this is missed."""
    connected = asyncio.Event()
    watcher = asyncio.create_task(_collect(_events(gw, cid, connected), until, out))
    await asyncio.wait_for(connected.wait(), 5)
    return watcher


async def test_send_and_read_back_with_live_events(gateway: GatewayClient, fake_llm: FakeLLM,
                                                   fake_slack: FakeSlack) -> None:
    seen: list[dict[str, Any]] = []
    watcher = await _watch(gateway, CID, "turn.finished", seen)
    status, body = await _post(gateway, f"/api/conversations/{CID}/messages", {"text": "hi web", "client_id": "a1"})
    assert (status, body["outcome"]) == (200, "queued")
    await asyncio.wait_for(watcher, 10)
    assert [e["type"] for e in seen] == ["message.accepted", "inputs.taken", "turn.started", "turn.finished"]
    assert seen[-1]["text"] == "echo: hi web"

    status, conv = await _get(gateway, f"/api/conversations/{CID}")
    assert status == 200 and conv["working"] is False
    assert [(m["role"], m["content"]) for m in conv["messages"]] == [("user", "hi web"), ("assistant", "echo: hi web")]
    status, listing = await _get(gateway, "/api/conversations")
    assert listing["conversations"][0] == {**listing["conversations"][0], "id": CID, "title": "hi web"}
    assert fake_slack.posts() == []  # web sessions are rendered by the web channel only

    # The same client_id again is a repeat: nothing new runs.
    status, body = await _post(gateway, f"/api/conversations/{CID}/messages", {"text": "hi web", "client_id": "a1"})
    assert body["outcome"] == "duplicate"
    await gateway.idle()
    assert len(fake_llm.requests) == 1


async def test_stop_cancels_the_running_turn(gateway: GatewayClient, fake_llm: FakeLLM) -> None:
    gate = Gate(Reply("too late"))
    fake_llm.then(gate)
    await _post(gateway, f"/api/conversations/{CID}/messages", {"text": "long job"})
    await asyncio.wait_for(gate.reached.wait(), 5)
    _, conv = await _get(gateway, f"/api/conversations/{CID}")
    assert conv["working"] is True
    status, body = await _post(gateway, f"/api/conversations/{CID}/stop", {})
    assert (status, body["stopped"], body["text"]) == (200, True, "Stopped the running turn (asked by web).")
    await gateway.idle()
    _, conv = await _get(gateway, f"/api/conversations/{CID}")
    assert [(m["role"], m["content"]) for m in conv["messages"]] == [("user", "long job"),
                                                                      ("assistant", "(stopped by web)")]
    assert (await _post(gateway, f"/api/conversations/{CID}/stop", {}))[1]["stopped"] is False
    gate.opened.set()
    # The thread still works after a stop.
    await _post(gateway, f"/api/conversations/{CID}/messages", {"text": "again"})
    await gateway.idle()
    _, conv = await _get(gateway, f"/api/conversations/{CID}")
    assert conv["messages"][-1]["content"] == "echo: again"


async def test_feedback_on_an_answer_is_recorded_for_this_conversation_only(gateway: GatewayClient) -> None:
    await _post(gateway, f"/api/conversations/{CID}/messages", {"text": "rate me"})
    await gateway.idle()
    _, conv = await _get(gateway, f"/api/conversations/{CID}")
    [answer] = [m for m in conv["messages"] if m["role"] == "assistant"]
    turn = answer["turn"]
    elsewhere = f"/api/conversations/{'f' * 32}/feedback"
    assert (await _post(gateway, elsewhere, {"turn": turn, "verdict": "positive"}))[0] == 404
    assert (await _post(gateway, f"/api/conversations/{CID}/feedback", {"turn": turn, "verdict": "meh"}))[0] == 400
    assert (await _post(gateway, f"/api/conversations/{CID}/feedback", {"turn": "1", "verdict": "positive"}))[0] == 400
    too_big = {"turn": 10**30, "verdict": "positive"}  # past any id the tables hold: refused, not a 500
    assert (await _post(gateway, f"/api/conversations/{CID}/feedback", too_big))[0] == 400
    status, body = await _post(gateway, f"/api/conversations/{CID}/feedback", {"turn": turn, "verdict": "negative"})
    assert status == 200 and body["positive"] is False and "Thanks for the feedback" in body["text"]
    [entry] = await FeedbackStore(gateway.app.db).recent()
    assert (entry.turn_id, entry.user, entry.positive, entry.session_id) == (turn, "web", False, f"web:{CID}")


async def test_a_failed_turn_leaves_a_notice(gateway: GatewayClient, fake_llm: FakeLLM) -> None:
    fake_llm.then(HttpError(401, "bad key"))
    await _post(gateway, f"/api/conversations/{CID}/messages", {"text": "hello"})
    await gateway.idle()
    _, conv = await _get(gateway, f"/api/conversations/{CID}")
    assert conv["messages"][-1]["role"] == "notice"
    assert "rejected the API key" in conv["messages"][-1]["content"]


async def test_bad_input_is_refused_clearly(gateway: GatewayClient, fake_llm: FakeLLM) -> None:
    assert (await _post(gateway, f"/api/conversations/{CID}/messages", {"text": "  "}))[0] == 400
    assert (await _post(gateway, f"/api/conversations/{CID}/messages", ["not", "an object"]))[0] == 400
    bad_client_id = {"text": "x", "client_id": "no spaces"}
    assert (await _post(gateway, f"/api/conversations/{CID}/messages", bad_client_id))[0] == 400
    assert (await _post(gateway, "/api/conversations/slack:T1:C1:1.1/messages", {"text": "x"}))[0] in (400, 404)
    status, body = await _post(gateway, "/api/conversations/NOTHEX/messages", {"text": "x"})
    assert status == 400 and "32 hex" in body["error"]
    status, body = await _post(gateway, f"/api/conversations/{CID}/messages", {"text": "x" * 40_001})
    assert status == 400 and "40000" in body["error"]
    # Other sites cannot post into the chat (CSRF): JSON only, same origin only.
    async with gateway.http.post(f"{gateway.base}/api/conversations/{CID}/messages", data="text=x",
                                 headers={"Content-Type": "application/x-www-form-urlencoded"}) as resp:
        assert resp.status == 403
    status, _ = await _post(gateway, f"/api/conversations/{CID}/messages", {"text": "x"},
                            headers={**JSON, "Origin": "http://evil.example"})
    assert status == 403
    await gateway.idle()
    assert fake_llm.requests == []


async def test_pages_and_static_files(gateway: GatewayClient) -> None:
    for path, kind in (("/", "text/html"), (f"/c/{CID}", "text/html"), ("/static/app.js", "application/javascript"),
                       ("/static/app.css", "text/css")):
        async with gateway.http.get(f"{gateway.base}{path}") as resp:
            assert resp.status == 200 and resp.content_type == kind, path
    async with gateway.http.get(f"{gateway.base}/static/../settings.py") as resp:
        assert resp.status == 404


async def test_a_page_for_a_malformed_conversation_id_is_404_and_does_not_echo_it(gateway: GatewayClient) -> None:
    # A well-formed id nobody has used yet is a new conversation (the page makes its id before the
    # first message): still 200. Anything else names no conversation, ever.
    async with gateway.http.get(f"{gateway.base}/c/{'f' * 32}") as resp:
        assert resp.status == 200
    for bad in ("abc", CID.upper(), CID + "0", "%3Cscript%3Ealert(1)%3C%2Fscript%3E", "x" * 300):
        async with gateway.http.get(f"{gateway.base}/c/{bad}") as resp:
            body = await resp.text()
            assert (resp.status, resp.content_type) == (404, "text/html"), bad
            assert "no such conversation" in body.lower() and 'href="/"' in body
            assert "<script>" not in body and "abc" not in body and "xxx" not in body


async def test_token_login_guards_everything_but_health(make_settings: Any, start_gateway: Any) -> None:
    token = "a-very-long-login-token-for-tests"
    gateway: GatewayClient = await start_gateway(make_settings(bot_web_token=token))
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as anonymous:  # IP host
        async with anonymous.get(f"{gateway.base}/", allow_redirects=False) as resp:
            assert resp.status == 302 and resp.headers["Location"] == "/login"
        async with anonymous.get(f"{gateway.base}/api/conversations") as resp:
            assert resp.status == 401
        async with anonymous.get(f"{gateway.base}/healthz") as resp:
            assert resp.status == 200
        async with anonymous.post(f"{gateway.base}/login", data={"token": "wrong"}, allow_redirects=False) as resp:
            assert resp.headers["Location"] == "/login?failed=1"
        async with anonymous.post(f"{gateway.base}/login", data={"token": token}, allow_redirects=False) as resp:
            assert resp.status == 302
            assert token not in resp.headers["Set-Cookie"]  # the cookie holds a random login id, not the token
        async with anonymous.get(f"{gateway.base}/api/conversations") as resp:
            assert resp.status == 200
    status, _ = await _get(gateway, "/api/conversations", headers={"Authorization": f"Bearer {token}"})
    assert status == 200


async def test_messages_sent_while_busy_show_as_queued_then_taken(gateway: GatewayClient, fake_llm: FakeLLM) -> None:
    gate = Gate(Reply(tool_calls=[("time_now", {})]))
    fake_llm.then(gate)
    await _post(gateway, f"/api/conversations/{CID}/messages", {"text": "first"})
    await asyncio.wait_for(gate.reached.wait(), 5)
    seen: list[dict[str, Any]] = []
    watcher = await _watch(gateway, CID, "turn.finished", seen)
    _status, body = await _post(gateway, f"/api/conversations/{CID}/messages", {"text": "second"})
    assert body["outcome"] == "queued"
    _, conv = await _get(gateway, f"/api/conversations/{CID}")
    assert [(m["content"], m["queued"]) for m in conv["messages"]] == [("first", False), ("second", True)]
    gate.opened.set()
    await asyncio.wait_for(watcher, 10)
    types = [e["type"] for e in seen]
    assert types.index("input.queued") < types.index("inputs.taken") < types.index("turn.finished")
    assert next(e for e in seen if e["type"] == "inputs.taken")["steered"] is True
    _, conv = await _get(gateway, f"/api/conversations/{CID}")
    assert not any(m["queued"] for m in conv["messages"])


async def test_approvals_in_the_web_chat(gateway: GatewayClient, fake_llm: FakeLLM) -> None:
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo from-web"})]))
    await _post(gateway, f"/api/conversations/{CID}/messages", {"text": "run it"})
    conv: dict[str, Any] = {}
    for _ in range(200):
        _, conv = await _get(gateway, f"/api/conversations/{CID}")
        if conv["approvals"]:
            break
        await asyncio.sleep(0.02)
    approval = conv["approvals"][0]
    assert (approval["tool"], approval["status"], approval["arguments"]) == (
        "shell_run", "pending", {"command": "echo from-web"})
    assert (await _post(gateway, f"/api/approvals/{approval['id']}", {"verdict": "maybe"}))[0] == 400
    assert (await _post(gateway, "/api/approvals/x", {"verdict": "approve"}))[0] == 400
    assert (await _post(gateway, "/api/approvals/999", {"verdict": "approve"}))[0] == 404
    fake_llm.then(Reply("ok, skipped"))
    status, body = await _post(gateway, f"/api/approvals/{approval['id']}", {"verdict": "deny", "reason": "no"})
    assert (status, body["won"]) == (200, True)
    status, body = await _post(gateway, f"/api/approvals/{approval['id']}", {"verdict": "approve"})
    assert status == 409 and "Already settled: Denied by web: no" in body["message"]
    await gateway.idle()
    assert "the user denied `shell_run`: no;" in fake_llm.requests[1]["messages"][-1]["content"]
    _, conv = await _get(gateway, f"/api/conversations/{CID}")
    assert conv["approvals"][0]["summary"] == "Denied by web: no"


async def test_schedules_view_lists_and_changes_schedules(gateway: GatewayClient) -> None:
    from core.model import SessionInfo
    from core.triggers import TriggerSpec

    service = gateway.app.schedules
    origin = SessionInfo(id=f"web:{CID}", channel="web", agent="default", status="idle", reply_ref={})
    mine = await service.create(prompt="report", trigger=TriggerSpec(every_seconds=3600), destination="#ops",
                                agent="default", creator="web", origin=origin, channel="slack")
    theirs = await service.create(prompt="other", trigger=TriggerSpec(every_seconds=3600), destination="#ops",
                                  agent="default", creator="U5", origin=origin, channel="slack")
    _, listing = await _get(gateway, "/api/schedules")
    rows = {s["id"]: s for s in listing["schedules"]}
    assert rows[mine.id]["can_change"] and not rows[theirs.id]["can_change"]
    assert rows[mine.id]["when"] == "every 3600 s" and rows[mine.id]["status"] == "pending_destination"
    status, body = await _post(gateway, f"/api/schedules/{theirs.id}/cancel", {})
    assert status == 403 and "only its creator" in body["error"]
    status, body = await _post(gateway, f"/api/schedules/{mine.id}/cancel", {})
    assert (status, body["message"]) == (200, f"Schedule {mine.id} cancelled.")
    status, body = await _post(gateway, f"/api/schedules/{mine.id}/pause", {})
    assert status == 409 and "cancelled" in body["error"]


async def test_the_web_chat_shows_quorum_progress_and_reminders(
    make_settings: Any, start_gateway: Any, fake_llm: FakeLLM, tmp_path: Any
) -> None:
    """A rule's request in the web chat: the web person's vote counts once, the progress and the reminder are
    in the conversation's JSON (what the page shows), and no "Always allow" is offered."""
    config = tmp_path / "bot.toml"
    config.write_text('[[policies]]\ntool = "shell_run"\napprovers = ["web", "U7"]\nquorum = 2\n'
                      'remind_after_s = 0.2\ntimeout_s = 600\n')
    gateway: GatewayClient = await start_gateway(make_settings(bot_config=config, approval_poll_s=0.05))
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo two"})]))
    await _post(gateway, f"/api/conversations/{CID}/messages", {"text": "run it"})
    approval: dict[str, Any] = {}
    for _ in range(200):
        _, conv = await _get(gateway, f"/api/conversations/{CID}")
        if conv["approvals"]:
            approval = conv["approvals"][0]
            break
        await asyncio.sleep(0.02)
    assert (approval["quorum"], approval["grantable"]) == (2, False)
    assert approval["progress"] == "0 of 2 approvals — nobody yet"
    status, body = await _post(gateway, f"/api/approvals/{approval['id']}", {"verdict": "approve"})
    assert status == 200 and body["voted"] and not body["won"] and "counted" in body["message"]
    status, body = await _post(gateway, f"/api/approvals/{approval['id']}", {"verdict": "approve"})
    assert status == 409 and "already voted" in body["message"]  # the same person: one vote
    for _ in range(200):
        _, conv = await _get(gateway, f"/api/conversations/{CID}")
        if conv["approvals"][0]["reminded"]:
            break
        await asyncio.sleep(0.02)
    shown = conv["approvals"][0]
    assert shown["reminded"] and shown["progress"] == "1 of 2 approvals — web" and shown["status"] == "pending"
