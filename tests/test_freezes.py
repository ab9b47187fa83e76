"""Change freezes (SPEC §17, issue 40.6): a freeze refuses every gated call however it would run, tells the thread
why and until when, is set and lifted by admins (``/bot freeze``) and operators (``bot freeze``), holds across
replicas at once, and a request approved as a freeze begins does not run. ``[[freezes]]`` windows follow the clock."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from bot.config.file import load_config
from bot.errors import SettingsError
from core.errors import InvalidInput
from core.freezes import Freeze, Freezes, FreezeWindow, parse_until
from core.model import ApprovalStatus
from core.store import Database
from core.store.freezes import FreezeStore
from core.store.tables import ApprovalRow, FreezeRow
from core.tools import Risk, Tool, ToolContext
from tests.audit import audit_log
from tests.bot_process import run_cli
from tests.conftest import GatewayClient
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import block_action, command_body, mention

ALLOW_ECHO = '[[policies]]\ntool = "shell_run"\nmatch = "echo allowed-*"\naction = "allow"\n'
FROZEN = "refused: change freeze until "


class FixedClock:
    def __init__(self, now: datetime) -> None:
        self.at = now

    def now(self) -> datetime:
        return self.at


async def _start(make_settings: Any, start_gateway: Any, tmp_path: Path, rules: str = "",
                 **settings: Any) -> GatewayClient:
    config = tmp_path / "bot.toml"
    config.write_text(rules)
    gateway: GatewayClient = await start_gateway(make_settings(bot_config=config, bot_admins="UADMIN",
                                                               approval_poll_s=0.05, **settings))
    return gateway


async def _say(gateway: GatewayClient, text: str, *, user: str = "U1") -> str:
    resp = await gateway.interact(command_body(text, user=user))
    assert resp.status == 200
    return await resp.text()


def _tool_results(fake_llm: FakeLLM, index: int) -> list[str]:
    return [str(m["content"]) for m in fake_llm.requests[index]["messages"] if m["role"] == "tool"]


def _cards(fake_slack: FakeSlack) -> list[str]:
    return [json.dumps(c.params) for c in fake_slack.posts() if "approval:approve" in json.dumps(c.params)]


def _shell() -> Tool:
    async def run(_ctx: ToolContext, _args: dict[str, Any]) -> str:
        raise AssertionError("never run during a freeze")

    return Tool("shell_run", "run", {"type": "object"}, Risk.GATED, run)


def _env(gateway: GatewayClient) -> dict[str, str]:
    settings = gateway.app.settings
    return {"DATABASE_URL": settings.resolved_database_url, "BOT_HOME": str(settings.bot_home),
            "BOT_CONFIG": str(settings.bot_config)}


# -- the clock, the time and the rules, on core objects ------------------------------------------------------------


async def test_a_freeze_window_holds_from_each_cron_fire_for_its_duration(tmp_path: Path) -> None:
    friday = FreezeWindow("0 16 * * 5", 3600, "Friday release freeze")  # 2026-12-04 is a Friday
    assert friday.covering(datetime(2026, 12, 4, 15, 59, tzinfo=UTC)) is None
    assert friday.covering(datetime(2026, 12, 4, 16, 0, tzinfo=UTC)) == Freeze(
        "Friday release freeze", datetime(2026, 12, 4, 17, 0, tzinfo=UTC))
    assert friday.covering(datetime(2026, 12, 4, 16, 59, 59, tzinfo=UTC)) is not None
    assert friday.covering(datetime(2026, 12, 4, 17, 0, tzinfo=UTC)) is None  # its end is not in it
    assert friday.covering(datetime(2026, 12, 5, 16, 30, tzinfo=UTC)) is None  # Saturday
    # UTC, whatever zone "now" is written in: 17:30 in Berlin is 16:30 UTC.
    assert friday.covering(datetime(2026, 12, 4, 17, 30, tzinfo=ZoneInfo("Europe/Berlin"))) is not None
    # The latest fire decides its end: a minutely cron lasting a week ends a week after the last minute.
    minutely = FreezeWindow("* * * * *", 7 * 86400, "always")
    now = datetime(2026, 12, 4, 10, 30, 42, tzinfo=UTC)
    held = minutely.covering(now)
    assert held is not None and held.until == datetime(2026, 12, 11, 10, 30, tzinfo=UTC)

    clock = FixedClock(datetime(2026, 12, 4, 16, 10, tzinfo=UTC))
    db = Database(f"sqlite:///{tmp_path}/f.db")
    await db.migrate()
    try:
        freezes = Freezes(FreezeStore(db), clock, (friday,))
        assert (await freezes.active()) == Freeze("Friday release freeze", datetime(2026, 12, 4, 17, tzinfo=UTC))
        clock.at = datetime(2026, 12, 4, 17, 1, tzinfo=UTC)
        assert await freezes.active() is None
        stored = await freezes.freeze(clock.at + timedelta(hours=2), "db <!channel> migration\n", by="UADMIN")
        assert stored.reason == "db \u2039!channel\u203a migration"  # no mention rides on a reason
        assert (await freezes.active()) == stored
        clock.at = datetime(2026, 12, 11, 16, 30, tzinfo=UTC)  # the next Friday: the window again
        assert (await freezes.active()) == Freeze("Friday release freeze", datetime(2026, 12, 11, 17, tzinfo=UTC))
        assert await freezes.lift(by="UADMIN") == []  # the stored one is over; the window can't be lifted
        assert freezes.window_in_force() is not None
    finally:
        await db.close()


async def test_an_end_time_must_be_ahead_with_a_zone_and_a_freeze_needs_a_reason(tmp_path: Path) -> None:
    now = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
    assert parse_until("2h", now) == now + timedelta(hours=2)
    assert parse_until("30m", now) == now + timedelta(minutes=30)
    assert parse_until("2026-12-24T18:00+01:00", now) == datetime(2026, 12, 24, 17, 0, tzinfo=UTC)
    for bad in ("2026-12-24T18:00", "tomorrow", "2x", ""):
        with pytest.raises(InvalidInput):
            parse_until(bad, now)
    db = Database(f"sqlite:///{tmp_path}/f.db")
    await db.migrate()
    try:
        freezes = Freezes(FreezeStore(db), FixedClock(now))
        for until, reason, said in [(now - timedelta(seconds=1), "x", "not in the future"),
                                    (now + timedelta(hours=1), " \n ", "needs a reason"),
                                    (now + timedelta(days=400), "x", "at most"),
                                    (now + timedelta(hours=1), "x" * 501, "at most 500")]:
            with pytest.raises(InvalidInput, match=said):
                await freezes.freeze(until, reason, by="UADMIN")
        assert await freezes.active() is None
    finally:
        await db.close()


async def test_the_freeze_store_sets_reads_and_lifts_with_audit_lines(store_db: Database) -> None:
    """On each backend (SQLite; PostgreSQL with TEST_DATABASE_URL): a freeze ahead is not in force yet, an ended or
    lifted one is not in force any more, lifting covers those ahead too, and each change is audited."""
    store, now = FreezeStore(store_db), datetime(2026, 12, 5, 12, 0, tzinfo=UTC)

    def row(start: int, end: int, reason: str) -> FreezeRow:
        return FreezeRow(starts_at=now + timedelta(hours=start), until=now + timedelta(hours=end), reason=reason,
                         created_by="UADMIN", created_at=now)

    ended, current, longer, ahead = [await store.add(row(*r)) for r in
                                     [(-3, -1, "ended"), (-1, 1, "now"), (-1, 5, "longer"), (2, 4, "ahead")]]
    assert [f.reason for f in await store.active(now)] == ["longer", "now"]  # the longest first
    assert [f.reason for f in await store.active(now + timedelta(hours=3))] == ["longer", "ahead"]
    assert await store.lift("UOPS", now) == sorted([current.id, longer.id, ahead.id])  # type: ignore[type-var]
    assert await store.active(now) == [] and await store.active(now + timedelta(hours=3)) == []
    assert await store.lift("UOPS", now) == []
    audit = [(a.action, a.actor, a.subject) for a in await audit_log(store_db)]
    assert audit[:4] == [("freeze.set", "UADMIN", f"freeze:{f.id}") for f in (ended, current, longer, ahead)]
    assert [a[:2] for a in audit[4:]] == [("freeze.lifted", "UOPS")] * 3


@pytest.mark.parametrize(("toml", "said"), [
    ('[[freezes]]\ncron = "0 16 * * 9"\nduration_s = 60\nreason = "x"\n', "freezes[0].cron"),
    ('[[freezes]]\ncron = "0 16 * *"\nduration_s = 60\nreason = "x"\n', "5 fields"),
    ('[[freezes]]\ncron = "0 16 * * 5"\nduration_s = 0\nreason = "x"\n', "freezes[0].duration_s"),
    ('[[freezes]]\ncron = "0 16 * * 5"\nduration_s = 60\nreason = " "\n', "freezes[0].reason"),
    ('[[policies]]\ntool = "shell_run"\naction = "deny"\nduring_freeze = "ask"\n', "during_freeze"),
    ('[[policies]]\ntool = "shell_run"\nduring_freeze = "maybe"\n', "during_freeze"),
])
def test_bad_freeze_settings_are_refused_where_they_are_read(tmp_path: Path, toml: str, said: str) -> None:
    path = tmp_path / "bot.toml"
    path.write_text(toml)
    with pytest.raises(SettingsError, match=re.escape(said)):
        load_config(path)


# -- through the real Slack app -------------------------------------------------------------------------------------


async def test_a_freeze_refuses_a_gated_call_however_it_would_run_and_tells_the_thread(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_slack.status_supported = True  # the thread's status line says it too
    gateway = await _start(make_settings, start_gateway, tmp_path, ALLOW_ECHO)
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo granted"})]), Reply("ran"))
    await gateway.send_event(mention("grant it"))
    [card] = await fake_slack.wait_for("chat.postMessage")
    await gateway.interact(block_action("approval:always", card.params["blocks"][-1]["elements"][0]["value"]))
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    assert len(await gateway.app.approvals.grants()) == 1  # "Always allow" covers `echo granted` from now on

    reply = await _say(gateway, "freeze 2h release of <!channel> v2", user="UADMIN")
    assert reply.startswith("Frozen: change freeze until ") and "release of &lt;!channel&gt; v2" not in reply
    assert "release of \u2039!channel\u203a v2" in reply
    posted = len(fake_slack.posts())
    marker = tmp_path / "home" / "work" / "default" / "nope"
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo allowed-1"}),  # an allow rule
                                    ("shell_run", {"command": "echo granted"}),  # a grant
                                    ("shell_run", {"command": "touch nope"}),  # no rule: asks
                                    ("time_now", {})]),  # safe, no rule asks: unaffected
                  Reply("frozen, so nothing ran"))
    await gateway.send_event(mention("ship it"))
    await fake_slack.wait_for("chat.postMessage", posted + 2)  # one notice (for three refusals) and the answer
    await gateway.idle()
    allowed, granted, unruled, safe = _tool_results(fake_llm, 3)[-4:]
    for result in (allowed, granted, unruled):
        assert result.startswith(FROZEN) and "UTC: release of \u2039!channel\u203a v2" in result
        assert "do not retry it" in result
    assert not safe.startswith("refused") and "UTC" in safe
    assert not marker.exists()
    assert len(_cards(fake_slack)) == 1  # nobody was asked during the freeze
    notices = [c.params["text"] for c in fake_slack.posts()[posted:] if "was refused" in c.params["text"]]
    assert len(notices) == 1 and all(
        "change freeze until " in n and " UTC: release of \u2039!channel\u203a v2" in n for n in notices)
    refused = [a for a in await audit_log(gateway.app.db) if a.action == "freeze.refused"]
    assert len(refused) == 3 and {a.actor for a in refused} == {"U1"}
    statuses = [c.params["status"] for c in fake_slack.of("assistant.threads.setStatus")]
    assert any(s.startswith("is held by a change freeze until ") and s.endswith(" UTC…") for s in statuses), statuses


async def test_a_firing_s_preapproved_destination_is_refused_during_a_freeze(
    make_settings: Any, start_gateway: Any, tmp_path: Path
) -> None:
    gateway = await _start(make_settings, start_gateway, tmp_path)
    broker = gateway.app.approvals
    assert broker.freezes is not None

    async def send(_ctx: ToolContext, _args: dict[str, Any]) -> str:
        return "sent"

    tool = Tool("message_send", "post", {"type": "object"}, Risk.GATED, send, pattern_arg="channel")
    firing = ToolContext(session_id="schedule:1:1", turn_id=1, agent="default", sender="U1", interactive=False,
                         preapproved=(("message_send", "#ops"),))
    args = {"channel": "#ops", "text": "daily summary"}
    assert (await broker.authorize(firing, tool, args)).allowed  # its destination needs nobody, until a freeze
    await broker.freezes.freeze(broker.clock.now() + timedelta(minutes=30), "quarter close", by="UADMIN")
    decision = await broker.authorize(firing, tool, args)
    assert not decision.allowed and decision.result.startswith(FROZEN) and "quarter close" in decision.result


async def test_during_freeze_ask_asks_even_an_allowed_call_and_only_admins_may_approve(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    gateway = await _start(make_settings, start_gateway, tmp_path, ALLOW_ECHO + 'during_freeze = "ask"\n')
    await gateway.app.approvals.freezes.freeze(  # type: ignore[union-attr]
        gateway.app.approvals.clock.now() + timedelta(hours=1), "incident 42", by="UADMIN")
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo allowed-7"})]), Reply("ran it"))
    await gateway.send_event(mention("echo it"))
    [card] = await fake_slack.wait_for("chat.postMessage")
    buttons = card.params["blocks"][-1]["elements"]
    assert [b["text"]["text"] for b in buttons] == ["Approve", "Deny", "Edit"]  # asked, and no standing grant offered
    await gateway.interact(block_action("approval:approve", buttons[0]["value"], user="U1"))  # the requester
    [told] = await fake_slack.wait_for("chat.postEphemeral")
    assert "Only admins can approve it" in told.params["text"] and "incident 42" in told.params["text"]
    assert len(fake_llm.requests) == 1  # still waiting
    await gateway.interact(block_action("approval:approve", buttons[0]["value"], user="UADMIN"))
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    [result] = _tool_results(fake_llm, 1)
    assert "allowed-7" in result and "exit code 0" in result


async def test_bot_freeze_and_unfreeze_are_for_admins_audited_and_shown_in_status(
    make_settings: Any, start_gateway: Any, tmp_path: Path
) -> None:
    gateway = await _start(make_settings, start_gateway, tmp_path)
    assert await _say(gateway, "freeze 2h let me deploy", user="U1") == "Only admins (BOT_ADMINS) can freeze changes."
    assert await _say(gateway, "unfreeze", user="U1") == "Only admins (BOT_ADMINS) can unfreeze changes."
    assert "Not frozen: the end time" in await _say(gateway, "freeze 2020-01-01T00:00Z old", user="UADMIN")
    assert "Usage:" in await _say(gateway, "freeze 2h", user="UADMIN")
    assert "snowflake" not in await _say(gateway, "status")
    until = (datetime.now(UTC) + timedelta(days=30)).replace(second=0, microsecond=0)
    assert (await _say(gateway, f"freeze {until:%Y-%m-%dT%H:%M}Z year end", user="UADMIN")).startswith(
        f"Frozen: change freeze until {until:%Y-%m-%d %H:%M} UTC: year end.")
    assert (await _say(gateway, "status", user="U1")).endswith(
        f" :snowflake: Change freeze until {until:%Y-%m-%d %H:%M} UTC: year end.")
    assert await _say(gateway, "unfreeze", user="UADMIN") == "Lifted 1 freeze."
    assert await _say(gateway, "unfreeze", user="UADMIN") == "No freeze was set."
    assert "snowflake" not in await _say(gateway, "status")
    audit = [(a.action, a.actor) for a in await audit_log(gateway.app.db) if a.action.startswith("freeze.")]
    assert audit == [("freeze.set", "UADMIN"), ("freeze.lifted", "UADMIN")]


async def test_bot_freeze_and_unfreeze_from_the_command_line(
    make_settings: Any, start_gateway: Any, tmp_path: Path
) -> None:
    window = '[[freezes]]\ncron = "* * * * *"\nduration_s = 120\nreason = "always frozen"\n'
    gateway = await _start(make_settings, start_gateway, tmp_path, window)
    env = _env(gateway)
    code, out = await run_cli(tmp_path, env, "freeze", "--until", "2020-01-01T00:00Z", "--reason", "late")
    assert code == 2 and "not frozen: the end time 2020-01-01 00:00 UTC is not in the future" in out
    code, out = await run_cli(tmp_path, env, "freeze", "--until", "2h")
    assert code == 2 and "--reason" in out
    code, out = await run_cli(tmp_path, env, "freeze", "--until", "90m", "--reason", "db upgrade")
    assert code == 0 and "frozen (change freeze until " in out and "UTC: db upgrade)" in out, out
    freeze = await gateway.app.approvals.freezes.active()  # type: ignore[union-attr]
    assert freeze is not None and freeze.reason == "db upgrade"  # the stored one outlasts the window
    code, out = await run_cli(tmp_path, env, "unfreeze")
    assert code == 0 and "lifted freeze 1" in out and "can't be lifted" in out  # the window stays
    freeze = await gateway.app.approvals.freezes.active()  # type: ignore[union-attr]
    assert freeze is not None and freeze.reason == "always frozen"
    [set_, lifted] = [a for a in await audit_log(gateway.app.db) if a.action.startswith("freeze.")]
    assert set_.actor.startswith("operator") and lifted.action == "freeze.lifted"


async def test_a_freeze_set_on_one_replica_is_honoured_by_another_at_once(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path,
    database_url: str | None,
) -> None:
    """Two gateways on one database (SQLite here, PostgreSQL with TEST_DATABASE_URL): an admin freezes on one,
    the other refuses its next gated call at once, and runs it again once the first lifts the freeze."""
    shared = database_url or f"sqlite:///{tmp_path}/shared.db"
    config = tmp_path / "bot.toml"
    config.write_text(ALLOW_ECHO)
    here, there = [await start_gateway(make_settings(bot_config=config, bot_admins="UADMIN", database_url=shared,
                                                     bot_home=tmp_path / name)) for name in ("a", "b")]
    assert (await _say(there, "freeze 1h payments cutover", user="UADMIN")).startswith("Frozen")
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo allowed-here"})]), Reply("refused"))
    await here.send_event(mention("go"))
    await fake_slack.wait_for("chat.postMessage", 2)  # the notice and the answer
    await here.idle()
    [result] = _tool_results(fake_llm, 1)
    assert result.startswith(FROZEN) and "payments cutover" in result
    assert await _say(there, "unfreeze", user="UADMIN") == "Lifted 1 freeze."
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo allowed-again"})]), Reply("ran"))
    await here.send_event(mention("again"))
    await fake_slack.wait_for("chat.postMessage", 3)
    await here.idle()
    assert "exit code 0" in _tool_results(fake_llm, 3)[-1]


async def test_a_request_parked_before_a_freeze_and_approved_during_it_does_not_run(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """Racing a freeze: a click during it is refused (the request stays open, and runs once the freeze is lifted);
    a click whose checks passed just before the freeze was written (here: the settle alone) is caught right before
    the call would run. The freeze comes from another process (the CLI)."""
    gateway = await _start(make_settings, start_gateway, tmp_path)
    broker, env = gateway.app.approvals, _env(gateway)
    work = tmp_path / "home" / "work" / "default"

    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "touch after-lift"})]), Reply("done"))
    await gateway.send_event(mention("first"))
    [card] = await fake_slack.wait_for("chat.postMessage")
    first = card.params["blocks"][-1]["elements"][0]["value"]
    assert (await run_cli(tmp_path, env, "freeze", "--until", "1h", "--reason", "release"))[0] == 0
    await gateway.interact(block_action("approval:approve", first, user="U1"))
    [told] = await fake_slack.wait_for("chat.postEphemeral")
    assert told.params["text"].startswith("Not approved: change freeze until ") and "release" in told.params["text"]
    code, out = await run_cli(tmp_path, env, "approvals", "approve", first)  # an operator is refused too
    assert code == 4 and "Not approved: change freeze" in out
    assert (await broker.get(int(first))).status == ApprovalStatus.PENDING  # type: ignore[union-attr]
    assert (await run_cli(tmp_path, env, "unfreeze"))[0] == 0  # lifted while it waits: all as usual
    await gateway.interact(block_action("approval:approve", first, user="U1"))
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    assert (work / "after-lift").exists()

    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "touch raced"})]), Reply("not run"))
    await gateway.send_event(mention("second"))
    cards = await fake_slack.wait_for("chat.postMessage", 3)
    second = int(cards[-1].params["blocks"][-1]["elements"][0]["value"])
    assert (await run_cli(tmp_path, env, "freeze", "--until", "1h", "--reason", "release two"))[0] == 0
    won, _ = await broker.store.settle(second, ApprovalStatus.APPROVED, by="U1", reason=None,
                                       now=broker.clock.now())  # a click checked just before the freeze landed
    assert won
    async with gateway.app.db.read() as s:  # a restart finding it approved and not begun: refused all the same
        row = await s.get(ApprovalRow, second)
    assert row is not None and row.turn_id is not None
    ctx = ToolContext(session_id=row.session_id, turn_id=row.turn_id, agent="default", sender="U1",
                      call_id=row.tool_call_id)
    recovered = await broker.recover(ctx, _shell(), {"command": "touch raced"})
    assert recovered is not None and not recovered.allowed and recovered.result.startswith(FROZEN)
    await fake_slack.wait_for("chat.postMessage", 5)  # the notice and the answer
    await gateway.idle()
    [result] = _tool_results(fake_llm, 3)[-1:]
    assert result.startswith(FROZEN) and "release two" in result
    assert not (work / "raced").exists()
    refused = [a for a in await audit_log(gateway.app.db) if a.action == "freeze.refused"]
    assert [json.loads(a.detail or "{}")["request"] for a in refused] == [second, second]  # recovery, the turn
