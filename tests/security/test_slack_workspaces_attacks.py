"""Multi-workspace mode under attack (issue 20's review): who may install, which workspace a call acts in when
tasks outlive the request that started them, whom a person is judged against, and what an uninstall leaves.
Each test failed on the code before its fix."""

from __future__ import annotations

import asyncio
import contextvars
import json
from collections.abc import Callable
from typing import Any

import pytest
from sqlmodel import select

from channels.slack.tables import SlackInstallationRow
from core.store.tables import ApprovalRow
from tests.conftest import GatewayClient
from tests.fakes.core import until
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.slack_api import Failure, FakeSlack
from tests.slack_requests import block_action, command_body, dumps, event_body, mention, signed_headers
from tests.slack_workspaces import form_in_team, install, install_flow, send


def _port(gw: GatewayClient) -> Any:
    return next(c for c in gw.app.channels if getattr(c, "name", "") == "slack").port  # type: ignore[attr-defined]


async def _teams(gw: GatewayClient) -> list[str]:
    async with gw.app.db.read() as s:
        return sorted(r.team_id for r in (await s.exec(select(SlackInstallationRow))).all())


async def test_only_allowed_workspaces_install_and_are_served(
    make_settings: Callable[..., Any], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    """A stranger who finds the install page must not add the bot to their workspace and approve its tools."""
    gw: GatewayClient = await start_gateway(make_settings(
        slack_bot_token=None, slack_client_id=fake_slack.client_id, slack_client_secret=fake_slack.client_secret,
        slack_allowed_teams="T1,T2"))
    await install(gw, fake_slack, "T1")
    status, page = await install_flow(gw, fake_slack, "T666")
    assert status != 200 or "not in SLACK_ALLOWED_TEAMS" in page
    assert await _teams(gw) == ["T1"]
    assert [team for team in fake_slack.tokens.values()] == ["T1"]  # the refused install's token was revoked
    before = len(fake_slack.calls)
    await send(gw, "T666", mention("run it", channel="CEVIL", user="UEVIL"))
    await gw.idle()
    assert fake_slack.calls[before:] == [] and fake_llm.requests == []


async def test_without_an_allowlist_anyone_may_install_but_its_people_are_guests(
    make_settings: Callable[..., Any], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    """The install page cannot tell the operator from a stranger (behind a proxy on the same host every request
    looks local): without SLACK_ALLOWED_TEAMS nobody chose to trust an installed workspace's people."""
    gw: GatewayClient = await start_gateway(make_settings(
        slack_bot_token=None, slack_client_id=fake_slack.client_id, slack_client_secret=fake_slack.client_secret))
    async with gw.http.get(f"{gw.base}/slack/install", headers={"Host": "bot.example.com"}) as resp:
        assert resp.status == 200  # served: the contract's install page
    await install(gw, fake_slack, "T666")
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo pwned"})]), Reply("ok"))
    await send(gw, "T666", mention("run it", channel="CEVIL", user="UEVIL"))
    await until(lambda: len(fake_llm.requests) >= 2, what="the refusal reaching the model")
    await gw.idle()
    assert "not allowed for this sender" in json.dumps(fake_llm.requests[1]["messages"][-1])
    async with gw.app.db.read() as s:
        assert (await s.exec(select(ApprovalRow))).all() == []  # nobody was even asked
    assert {c.token for c in fake_slack.calls if c.params.get("channel") == "CEVIL"} == {fake_slack.token_of("T666")}


async def test_an_org_wide_install_is_refused_with_a_page_and_its_token_revoked(
    workspaces: GatewayClient, fake_slack: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = FakeSlack._oauth_access

    def org_wide(self: FakeSlack, request: Any, params: dict[str, Any]) -> dict[str, Any]:
        answer = original(self, request, params)
        if answer.get("ok"):
            answer |= {"enterprise": {"id": "E1", "name": "Org"}, "is_enterprise_install": True, "team": None}
        return answer

    monkeypatch.setattr(FakeSlack, "_oauth_access", org_wide)
    status, _page = await install_flow(workspaces, fake_slack, "E1")
    assert status < 500
    assert await _teams(workspaces) == ["T1", "T2"]
    assert "E1" not in fake_slack.tokens.values()


async def _schedule_in(gw: GatewayClient, fake_slack: FakeSlack, team: str, user: str, channel: str) -> None:
    made = await gw.interact(form_in_team(team, command_body("schedule every 1s #acc-dest tick", user=user,
                                                             channel=channel)))
    assert "created" in await made.text()

    def card() -> Any:
        return next((p for p in reversed(fake_slack.posts()) if p.params.get("channel") == channel
                     and "schedule_destination" in json.dumps(p.params.get("blocks"))), None)

    await until(card, what="the destination approval")
    await gw.interact(form_in_team(team, block_action(
        "approval:approve", card().params["blocks"][-1]["elements"][0]["value"], user=user, channel=channel)))


async def test_firings_never_act_in_the_workspace_of_whoever_touched_the_scheduler(
    workspaces: GatewayClient, fake_slack: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """APScheduler's wake-ups ran in the context of whoever added a job (a T2 request): every later firing of
    every schedule had T2 as its inbound workspace, and a turn naming none (a web chat's) acted in T2."""
    from channels.slack import workspaces as ws
    from core import current
    from core.model import SessionInfo, SessionStatus
    from core.schedules.jobs import ScheduleJobs

    seen: list[tuple[int, str | None, str | None]] = []
    original = ScheduleJobs.fire

    async def spy(self: ScheduleJobs, schedule_id: int) -> None:
        token = current.session.set(SessionInfo(id="web:operator", channel="web", agent="default",
                                                status=SessionStatus.IDLE, reply_ref={}))
        try:
            seen.append((schedule_id, ws._INBOUND.get(), ws.current_team()))
        finally:
            current.session.reset(token)
        await original(self, schedule_id)

    monkeypatch.setattr(ScheduleJobs, "fire", spy)
    gw = workspaces
    await _schedule_in(gw, fake_slack, "T1", "U1", "C1")
    await until(lambda: any(s == 1 for s, _i, _c in seen), timeout=15, what="T1's firing")
    await _schedule_in(gw, fake_slack, "T2", "U2", "C2")
    await until(lambda: any(s == 2 for s, _i, _c in seen), timeout=15, what="T2's firing")
    n = len(seen)
    await until(lambda: any(s == 1 for s, _i, _c in seen[n:]), timeout=15, what="T1's next firing")
    assert all(inbound is None and scope is None for _s, inbound, scope in seen), seen


async def test_whom_a_firings_decider_is_judged_against_is_not_the_clickers_workspace(
    make_settings: Callable[..., Any], start_gateway: Any, fake_slack: FakeSlack
) -> None:
    """A firing's place ("slack:dest:C") names no workspace; labelling a clicker by their own workspace's token
    would make any installed workspace's people members there."""
    from channels.slack.workspaces import set_inbound

    gw: GatewayClient = await start_gateway(make_settings(
        slack_bot_token=None, slack_client_id=fake_slack.client_id, slack_client_secret=fake_slack.client_secret,
        slack_allowed_teams="T1,T666"))
    for team in ("T1", "T666"):  # the clicker's workspace is installed and trusted
        await install(gw, fake_slack, team)
    port = _port(gw)

    async def click_from_t666() -> str | None:
        set_inbound("T666")  # what the middleware does for a click whose payload says T666
        label: str | None = await port.sender_trust("UOUT", "slack:dest:CACC")
        return label

    before = len(fake_slack.calls)
    assert await asyncio.create_task(click_from_t666(), context=contextvars.Context()) is None  # unknown: a guest
    assert fake_slack.token_of("T666") not in {c.token for c in fake_slack.calls[before:]}


async def test_one_dead_token_answer_does_not_make_a_workspaces_people_unknown_for_good(
    workspaces: GatewayClient, fake_slack: FakeSlack
) -> None:
    from channels.slack.workspaces import in_workspace

    port = _port(workspaces)
    fake_slack.fail_next("users.info", Failure(error="invalid_auth"))

    async def label(user: str) -> str | None:
        with in_workspace("T2"):
            found: str | None = await port.sender_trust(user, "slack:T2:C2")
            return found

    assert await asyncio.create_task(label("U2"), context=contextvars.Context()) is None
    assert await asyncio.create_task(label("U3"), context=contextvars.Context()) == "member"


async def test_the_session_is_the_workspace_bolt_authorized(
    workspaces: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    """In a channel shared with another organisation, ``team_id`` and ``authorizations[0].team_id`` differ: the
    thread belongs to (and is answered with the token of) the installation the event was delivered to."""
    body = event_body(mention("hi from a shared channel", channel="CSHARED", user="UX"))
    body["team_id"] = "T2"
    body["authorizations"][0]["team_id"] = "T1"
    await workspaces.post_raw(dumps(body), signed_headers(dumps(body)))
    await until(lambda: any(p.params.get("channel") == "CSHARED" for p in fake_slack.posts()), what="the answer")
    await workspaces.idle()
    assert {c.token for c in fake_slack.calls if c.params.get("channel") == "CSHARED"} == {fake_slack.token_of("T1")}
    assert [s.id.split(":")[1] for s in await workspaces.app.gateway.sessions("slack")] == ["T1"]


async def test_an_uninstall_also_stops_the_workspaces_firings(
    workspaces: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    """A running firing of a T2 schedule ("schedule:N:k", asked for in T2) kept its parked approval pending
    after T2 uninstalled: a re-install could still approve it."""
    gw = workspaces
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo hi"})]))
    await _schedule_in(gw, fake_slack, "T2", "U2", "C2")

    async def firing_approvals() -> list[str]:
        async with gw.app.db.read() as s:
            return [a.status for a in (await s.exec(select(ApprovalRow))).all() if a.session_id.startswith("schedule:")]

    async def parked() -> bool:
        return "pending" in await firing_approvals()

    await until(parked, timeout=15, what="a firing parked on its approval")
    await send(gw, "T2", {"type": "app_uninstalled"})

    async def settled() -> bool:
        return "pending" not in await firing_approvals()

    await until(settled, what="the firing's approval cancelled")
    assert [s.status for s in await gw.app.schedules.list()] == ["paused"]
