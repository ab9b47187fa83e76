"""Multi-workspace mode (issue 20): each workspace is answered with its own token, in events, clicks, commands,
what core starts (deliveries, cards, firings) and file downloads; an uninstall removes the workspace and cancels
what its conversations wait on. Driven over HTTP against the fake Slack, installs through the real OAuth flow."""

from __future__ import annotations

import json

import pytest
from sqlmodel import select

from channels.slack.tables import SlackInstallationRow
from core.store.tables import ApprovalRow
from tests.conftest import GatewayClient
from tests.fakes.core import until
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.slack_api import Call, FakeSlack
from tests.slack_requests import block_action, command_body, mention
from tests.slack_workspaces import form_in_team, install, send


def calls_in(fake_slack: FakeSlack, channel: str) -> list[Call]:
    return [c for c in fake_slack.calls if c.params.get("channel") == channel or c.params.get("channel_id") == channel]


async def test_each_workspace_is_answered_with_its_own_token(
    workspaces: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    gw = workspaces
    t1, t2 = fake_slack.token_of("T1"), fake_slack.token_of("T2")
    assert await send(gw, "T2", mention("hello from two", channel="C2", user="U2")) == 200
    assert await send(gw, "T1", mention("hello from one", channel="C1", user="U1")) == 200
    await until(lambda: len([p for p in fake_slack.posts() if "echo" in str(p.params.get("text"))]) >= 2,
                what="both answers")
    await gw.idle()
    # Everything done for a thread (status, reactions, users.info of its sender, the answer) carries its token.
    assert calls_in(fake_slack, "C2") and {c.token for c in calls_in(fake_slack, "C2")} == {t2}
    assert calls_in(fake_slack, "C1") and {c.token for c in calls_in(fake_slack, "C1")} == {t1}
    looked_up = {c.params["user"]: c.token for c in fake_slack.of("users.info")}
    assert looked_up == {"U2": t2, "U1": t1}
    # No call went out without a workspace token (the token exchange carries the client's own credentials).
    assert all(c.token in (t1, t2) for c in fake_slack.calls if c.method != "oauth.v2.access")
    # A file shared in T2 is fetched with T2's token.
    shared = mention("what is in it?", channel="C2", user="U2")
    shared["files"] = [fake_slack.share("F2", b"disk full on db-2", name="note.txt", mimetype="text/plain")]
    await send(gw, "T2", shared)
    await until(lambda: fake_slack.downloads, what="the download")
    assert fake_slack.downloads == [("F2", f"Bearer {t2}")]
    await gw.idle()
    # Re-installed into T2: a new token, used from the next call on (the old one is revoked at Slack).
    await install(gw, fake_slack, "T2")
    renewed = next(token for token, team in fake_slack.tokens.items() if team == "T2" and token != t2)
    del fake_slack.tokens[t2]
    calls = len(fake_slack.calls)
    await send(gw, "T2", mention("again", channel="C2", user="U2"))
    await until(lambda: any(p.params.get("text") == "echo: again" for p in fake_slack.posts()), what="the answer")
    await gw.idle()
    assert {c.token for c in fake_slack.calls[calls:]} == {renewed}


async def test_clicks_commands_and_a_schedule_act_in_their_workspace(
    workspaces: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    gw = workspaces
    t2 = fake_slack.token_of("T2")
    # A gated tool in a T2 thread: its card, the click on it and the answer all go with T2's token.
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo hi"})]), Reply("ran it"))
    await send(gw, "T2", mention("run it", channel="C2", user="U2"))
    card = next(c for c in await fake_slack.wait_for("chat.postMessage") if "approval" in json.dumps(c.params))
    assert card.token == t2
    value = card.params["blocks"][-1]["elements"][0]["value"]
    await gw.interact(form_in_team("T2", block_action("approval:approve", value, user="U2", channel="C2")))
    await until(lambda: any(p.params.get("text") == "ran it" for p in fake_slack.posts()), what="the answer")
    assert next(p for p in fake_slack.posts() if p.params.get("text") == "ran it").token == t2
    # A slash command from T2 makes a schedule there; its firing posts with T2's token too.
    made = await gw.interact(form_in_team("T2", command_body("schedule every 1s #acc-dest tick", user="U2",
                                                             channel="C2")))
    assert "created" in await made.text()
    await until(lambda: any("schedule_destination" in json.dumps(p.params.get("blocks")) for p in fake_slack.posts()),
                what="the destination approval")
    destination = next(p for p in fake_slack.posts() if "schedule_destination" in json.dumps(p.params.get("blocks")))
    assert destination.token == t2
    await gw.interact(form_in_team("T2", block_action(
        "approval:approve", destination.params["blocks"][-1]["elements"][0]["value"], user="U2", channel="C2")))
    await until(lambda: any(p.params.get("channel") == "CACC" for p in fake_slack.posts()), timeout=15,
                what="a firing")
    assert {p.token for p in fake_slack.posts() if p.params.get("channel") == "CACC"} == {t2}
    # Uninstalled from T2: the schedule asked for there is paused (its firings could only fail), not lost.
    await send(gw, "T2", {"type": "app_uninstalled"})
    assert [s.status for s in await gw.app.schedules.list()] == ["paused"]
    await gw.idle()


async def test_a_workspace_the_app_is_not_installed_in_gets_nothing(
    workspaces: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    gw = workspaces
    before = len(fake_slack.calls)
    await send(gw, "T3", mention("hello from three", channel="C3", user="U3"))
    await gw.idle()
    assert fake_slack.calls[before:] == [] and fake_llm.requests == []


async def test_an_uninstall_removes_the_workspace_and_cancels_what_it_waits_on(
    workspaces: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    gw = workspaces
    t2 = fake_slack.token_of("T2")
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo hi"})]))
    await send(gw, "T2", mention("run it", channel="C2", user="U2"))
    await until(lambda: any("approval" in json.dumps(c.params) for c in fake_slack.posts()), what="the card")
    # People's tokens revoked: the bot's own still works, nothing changes.
    await send(gw, "T2", {"type": "tokens_revoked", "tokens": {"oauth": ["U2"], "bot": []}})
    async with gw.app.db.read() as s:
        assert len((await s.exec(select(SlackInstallationRow))).all()) == 2
    await send(gw, "T2", {"type": "app_uninstalled"})
    async with gw.app.db.read() as s:
        teams = [r.team_id for r in (await s.exec(select(SlackInstallationRow))).all()]
    assert teams == ["T1"]
    await gw.idle()
    async with gw.app.db.read() as s:
        assert [a.status for a in (await s.exec(select(ApprovalRow))).all()] == ["cancelled"]
    assert await gw.app.dispatcher.conversations.busy_sessions("slack") == []
    assert await gw.app.gateway.history(next(iter(await _sessions(gw, "slack:T2:"))))  # its history stays
    calls = len(fake_slack.calls)
    await send(gw, "T2", mention("anyone there?", channel="C2", user="U2"))
    await gw.idle()
    assert [c for c in fake_slack.calls[calls:] if c.token == t2] == []
    # T1 is untouched.
    await send(gw, "T1", mention("still here?", channel="C1", user="U1"))
    await until(lambda: any(p.params.get("text") == "echo: still here?" for p in fake_slack.posts()), what="T1")


async def _sessions(gw: GatewayClient, prefix: str) -> list[str]:
    return [s.id for s in await gw.app.gateway.sessions("slack") if s.id.startswith(prefix)]


async def test_the_workspace_in_scope_is_never_borrowed(fake_slack: FakeSlack) -> None:
    """The explicit scope (the session being served) beats the turn's session, which beats the request's team;
    a session that names no workspace acts in none: its calls fail unsent, whatever the task inherited."""
    import contextvars

    from slack_sdk.oauth.installation_store import Bot

    from channels.slack.workspaces import (
        NoWorkspace,
        WorkspaceClient,
        current_team,
        in_workspace,
        session_team,
        set_inbound,
    )
    from core import current
    from core.model import SessionInfo, SessionStatus

    assert session_team("slack:T2:C1:1.0") == "T2" and session_team("sub:slack:T2:C1:1.0:1") == "T2"
    assert session_team("schedule:1:3", {"channel": "C9", "origin": "slack:T2:C1:1.0"}) == "T2"
    assert session_team("schedule:1:3", {"channel": "C9"}) is None and session_team("web:abc") is None
    assert session_team("slack:dest:C1") is None  # a firing's place names no workspace

    def scoped() -> list[str | None]:
        set_inbound("T1")
        seen = [current_team()]
        current.session.set(SessionInfo(id="slack:T3:C1:1.0", channel="slack", agent="default",
                                        status=SessionStatus.IDLE, reply_ref={}))
        seen.append(current_team())
        with in_workspace("T2"):
            seen.append(current_team())
        with in_workspace(None):
            seen.append(current_team())
        return seen

    assert contextvars.copy_context().run(scoped) == ["T1", "T3", "T2", None]
    assert current_team() is None  # nothing leaked into this context

    async def lookup(team: str) -> Bot | None:
        return Bot(bot_token=f"xoxb-{team.lower()}-x", bot_id="B", bot_user_id="UBOT", installed_at=0.0,
                   team_id=team) if team == "T2" else None

    client = WorkspaceClient(lookup, base_url=f"{fake_slack.url}/api/")  # type: ignore[attr-defined]
    try:
        with pytest.raises(NoWorkspace):
            await client.chat_postMessage(channel="C1", text="no workspace in scope")
        with in_workspace("T3"), pytest.raises(NoWorkspace):
            await client.chat_postMessage(channel="C1", text="not installed there")
        assert fake_slack.of("chat.postMessage") == []  # nothing was sent
        with in_workspace("T2"):
            await client.chat_postMessage(channel="C1", text="installed")
        assert [c.token for c in fake_slack.of("chat.postMessage")] == ["xoxb-t2-x"]
    finally:
        if client.session is not None:
            await client.session.close()
