"""Outside attack on issue 40, part B (freezes, grants, on-call approvers, spending caps): each test is an attack
that worked (fixed since) or one that is refused, through the real Slack app or the core objects."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from bot.config.file import load_config
from bot.errors import SettingsError
from bot.oncall import PagerDutyRota, pagerduty_client, read_schedule
from core.errors import InvalidInput
from core.freezes import FreezeWindow, parse_until
from core.oncall import RotaUnavailable, on_call
from core.providers import Completion
from core.spending import CapsConfig, Price, SpendingCaps
from core.store import Database
from core.store.usage import Spent, UsageKey, UsageStore
from tests.conftest import GatewayClient
from tests.fakes.core import ShiftedClock
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.pagerduty import TOKEN, FakePagerDuty
from tests.fakes.server import RunningServer
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import block_action, mention

NOW = datetime(2026, 12, 15, 10, 0, tzinfo=UTC)
TODAY = "2026-12-15"
CAPPED = '[[agents]]\nname = "default"\ndaily_tokens = 1000\n'


@pytest.fixture
def clock() -> ShiftedClock:
    shifted = ShiftedClock()
    shifted.jump_to(NOW)
    return shifted


@pytest.fixture
async def fake_pagerduty() -> AsyncIterator[FakePagerDuty]:
    fake = FakePagerDuty()
    server = await RunningServer(fake.app()).start()
    fake.url = server.url
    yield fake
    await server.stop()


async def _start(make_settings: Any, start_gateway: Any, tmp_path: Path, clock: ShiftedClock, toml: str,
                 **settings: Any) -> GatewayClient:
    config = tmp_path / "bot.toml"
    config.write_text(toml, encoding="utf-8")
    gateway: GatewayClient = await start_gateway(make_settings(bot_config=config, bot_admins="UADMIN",
                                                               approval_poll_s=0.05, **settings), clock=clock)
    return gateway


async def _over_the_cap(gateway: GatewayClient) -> None:
    await UsageStore(gateway.app.db).add(UsageKey(TODAY, "default", "U1"), Spent(5_000, 0, None))


async def _continue(gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM) -> list[Any]:
    """A turn parks at the cap; an admin clicks Continue; the posts so far."""
    fake_llm.then(Reply("past the cap"))
    root = mention("hello")
    await gateway.send_event(root)
    [card] = await fake_slack.wait_for("chat.postMessage")
    assert "approval:approve" in json.dumps(card.params.get("blocks")), card.params.get("text")
    buttons = card.params["blocks"][-1]["elements"]
    assert [b["text"]["text"] for b in buttons] == ["Continue", "Stop"], json.dumps(card.params)
    await gateway.interact(block_action("approval:approve", buttons[0]["value"], user="UADMIN", thread_ts=root["ts"]))
    posts = await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    return posts


# -- freezes and caps -----------------------------------------------------------------------------------------------


async def test_a_freeze_does_not_refuse_an_admins_continue_at_a_spending_cap(
    make_settings: Any, start_gateway: Any, tmp_path: Path, clock: ShiftedClock, fake_slack: FakeSlack,
    fake_llm: FakeLLM,
) -> None:
    """Found: a cap's Continue card is no tool call, yet a freeze refused it ("Not approved: change freeze"), so
    during a freeze a capped turn could only be stopped. The freeze covers tool calls, as for a thread budget's."""
    gateway = await _start(make_settings, start_gateway, tmp_path, clock, CAPPED)
    await _over_the_cap(gateway)
    freezes = gateway.app.approvals.freezes
    assert freezes is not None
    await freezes.freeze(clock.now() + timedelta(hours=1), "release", by="UADMIN")
    posts = await _continue(gateway, fake_slack, fake_llm)
    assert [e.params["text"] for e in fake_slack.of("chat.postEphemeral")] == []
    assert posts[1].params["text"] == "past the cap" and len(fake_llm.requests) == 1


# -- on-call and caps -----------------------------------------------------------------------------------------------


async def test_a_cap_s_continue_is_for_admins_and_never_reads_or_waits_on_the_on_call_rota(
    make_settings: Any, start_gateway: Any, tmp_path: Path, clock: ShiftedClock, fake_slack: FakeSlack,
    fake_llm: FakeLLM, fake_pagerduty: FakePagerDuty,
) -> None:
    """Found: a cap's park resolved the agent's ``oncall:`` approvers like a tool call's, though only admins
    decide it: PagerDuty down (500) cancelled every cap card before an admin saw it ("nobody on call could be
    asked"), and each park read PagerDuty for nothing."""
    fake_pagerduty.status = 500
    gateway = await _start(make_settings, start_gateway, tmp_path, clock,
                           CAPPED + 'approvers = ["oncall:P1ONCALL"]\n', pagerduty_token=TOKEN,
                           pagerduty_api_url=fake_pagerduty.url)
    await _over_the_cap(gateway)
    posts = await _continue(gateway, fake_slack, fake_llm)
    assert posts[1].params["text"] == "past the cap"
    assert fake_pagerduty.reads("P1ONCALL") == 0
    assert not any("on-call" in p.params.get("text", "") for p in fake_slack.posts())


# -- caps: a hostile endpoint ---------------------------------------------------------------------------------------


async def test_an_endpoint_saying_zero_tokens_cannot_switch_the_caps_off(tmp_path: Path) -> None:
    """Found: an endpoint answering ``prompt_tokens: 0, completion_tokens: 0`` (or negative figures, clamped to 0)
    had every call counted as free: no cap (and no thread budget, counted from the same figures) was ever reached.
    A request is never zero tokens: such figures are not believed and our estimates count instead."""
    db = Database(f"sqlite:///{tmp_path}/x.db")
    await db.migrate()
    try:
        clock = ShiftedClock()
        clock.jump_to(NOW)
        caps = SpendingCaps(UsageStore(db), clock, None, CapsConfig(prices={"m": Price(1.0, 1.0)}))
        zero = caps.spent("m", Completion("a long answer", input_tokens=0, output_tokens=0, usage=0),
                          estimated_input=900, estimated_output=40)
        assert zero == Spent(900, 40, 940)
        negative = caps.spent("m", Completion("a long answer", input_tokens=-5, output_tokens=-5),
                              estimated_input=900, estimated_output=40)
        assert negative == Spent(900, 40, 940)
        # Believed figures stay as said (an endpoint counts better than our estimate), an empty answer included.
        assert caps.spent("m", Completion("", input_tokens=1200, output_tokens=0), estimated_input=900,
                          estimated_output=0) == Spent(1200, 0, 1200)
        assert caps.spent("m", Completion("hi", usage=0), estimated_input=7, estimated_output=3) == Spent(7, 3, 10)
    finally:
        await db.close()


# -- freezes: hostile input ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["0001-01-01T00:00+14:00", "9999-12-31T23:59-14:00"])
def test_a_freeze_end_out_of_the_calendar_is_refused_not_a_crash(text: str) -> None:
    """Found: an end time whose UTC is outside year 1..9999 raised OverflowError out of ``/bot freeze`` and
    ``bot freeze`` instead of saying what is wrong."""
    with pytest.raises(InvalidInput, match="not a time"):
        parse_until(text, datetime(2026, 12, 5, 12, tzinfo=UTC))


# -- on-call: who counts as on call ---------------------------------------------------------------------------------


async def test_the_rota_is_read_for_this_moment_not_the_next_minute(
    make_settings: Any, start_gateway: Any, tmp_path: Path, clock: ShiftedClock, fake_slack: FakeSlack,
    fake_llm: FakeLLM, fake_pagerduty: FakePagerDuty,
) -> None:
    """Found: the schedule was read from now to a minute ahead, and PagerDuty names everyone on call at any time in
    that range: the next shift's person could approve up to a minute before their shift (two minutes with the
    cache). The range read is now one second."""
    fake_pagerduty.on_call["P1ONCALL"] = ["alice@example.com"]
    fake_slack.emails = {"alice@example.com": "U7"}
    gateway = await _start(make_settings, start_gateway, tmp_path, clock,
                           '[[policies]]\ntool = "shell_run"\napprovers = ["oncall:P1ONCALL"]\n',
                           pagerduty_token=TOKEN, pagerduty_api_url=fake_pagerduty.url)
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo hi"})]), Reply("done"))
    await gateway.send_event(mention("run it"))
    await fake_slack.wait_for("chat.postMessage")
    [read] = [r for r in fake_pagerduty.requests if r.path == "/schedules/P1ONCALL/users"]
    since, until = (datetime.fromisoformat(read.query[k].replace("Z", "+00:00")) for k in ("since", "until"))
    assert timedelta(0) < until - since <= timedelta(seconds=1)
    assert abs(since - clock.now()) < timedelta(seconds=5)


# -- caps: configuration -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("toml", "said"), [
    ('[[agents]]\nname = "default"\ndaily_cost = inf\n', "agents[0].daily_cost"),
    ('[[agents]]\nname = "default"\nmonthly_cost = inf\n', "agents[0].monthly_cost"),
    ('[limits]\nperson_daily_cost = inf\n', "[limits].person_daily_cost"),
])
def test_an_infinite_cost_cap_is_refused_where_it_is_read(tmp_path: Path, toml: str, said: str) -> None:
    """Found: TOML's ``inf`` passed ``gt=0``, and every model call of the agent (or of everyone, for the person's
    cap) then failed with OverflowError instead of ``bot run`` saying which line is wrong."""
    path = tmp_path / "bot.toml"
    path.write_text(toml + '[[prices]]\nmodel = "m"\ninput_per_million = 1\noutput_per_million = 1\n')
    with pytest.raises(SettingsError, match=re.escape(said)):
        load_config(path)


# -- caps: model calls besides a turn's steps ----------------------------------------------------------------------


async def _usage_calls(gateway: GatewayClient) -> int:
    return sum(line.calls for line in await UsageStore(gateway.app.db).lines(since="2000-01-01"))


async def test_a_context_window_summary_is_counted_like_any_model_call(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    """Found: the summary of a long thread (up to a context window of input) was a model call that no cap, no `bot
    usage` line and no /metrics figure saw: long threads spent past every cap unseen."""
    gateway: GatewayClient = await start_gateway(make_settings(llm_context_tokens=8_000))
    root = mention("start " + "s" * 12_000)
    fake_llm.then(Reply("first answer"))
    await gateway.send_event(root)
    await fake_slack.wait_for("chat.postMessage", 1)
    fake_llm.then(Reply("second answer"))
    await gateway.send_event(mention("more " + "m" * 12_000, thread_ts=root["ts"]))
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    assert fake_llm.summaries >= 1
    assert await _usage_calls(gateway) == len(fake_llm.requests)


async def test_the_memory_pass_is_counted_and_refused_past_a_cap(
    make_settings: Any, start_gateway: Any, tmp_path: Path, clock: ShiftedClock, fake_slack: FakeSlack,
    fake_llm: FakeLLM, caplog: pytest.LogCaptureFixture,
) -> None:
    """Found: the memory pass (MEMORY_PASS=true) made a model call after each turn that caps neither checked nor
    counted. It is now counted under the turn's agent and person, and a cap reached by the turn stops it."""
    gateway = await _start(make_settings, start_gateway, tmp_path, clock, CAPPED, memory_pass=True)
    fake_llm.then(Reply("Use the blue-green flag."), Reply("- Staging deploys use the blue-green flag"))
    await gateway.send_event(mention("how do staging deploys work? we use the blue-green flag"))
    await fake_slack.wait_for("chat.postMessage", 1)
    await gateway.idle()
    for _ in range(50):  # the pass runs on the bus, after the turn
        if await _usage_calls(gateway) >= 2:
            break
        await asyncio.sleep(0.02)
    assert len(fake_llm.requests) == 2 and await _usage_calls(gateway) == 2
    # The next turn's answer reaches the agent's daily cap: no pass after it.
    spent = sum(line.input_tokens + line.output_tokens for line in await UsageStore(gateway.app.db).lines(since=TODAY))
    await UsageStore(gateway.app.db).add(UsageKey(TODAY, "default", "U1"), Spent(max(0, 999 - spent), 0, None))
    fake_llm.then(Reply("Tuesdays."), Reply("- Releases go out on Tuesdays"))
    await gateway.send_event(mention("when do releases go out? on Tuesdays"))
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    async with asyncio.timeout(5):  # the pass ends before its call, told why in the log
        while not any("memory pass" in r.getMessage() and "daily token cap" in r.getMessage()
                      for r in caplog.records):
            await asyncio.sleep(0.01)
    assert len(fake_llm.requests) == 3


# -- freezes: [[freezes]] windows read as cron reads them ----------------------------------------------------------


def test_a_freeze_window_with_a_day_and_a_weekday_covers_either_as_cron_does() -> None:
    """Found: ``0 16 1 * 5`` is, for cron, 16:00 on the 1st and on every Friday; APScheduler needs both, so the
    window held only on a Friday the 1st and gated calls ran through every other Friday's freeze."""
    window = FreezeWindow("0 16 1 * 5", 3600, "month start and Fridays")
    assert window.covering(datetime(2026, 12, 4, 16, 30, tzinfo=UTC)) is not None  # a Friday, not the 1st
    assert window.covering(datetime(2026, 12, 1, 16, 30, tzinfo=UTC)) is not None  # the 1st, a Tuesday
    assert window.covering(datetime(2026, 12, 5, 16, 30, tzinfo=UTC)) is None  # Saturday the 5th
    # Starred fields keep cron's own reading: both must hold (every other day, on Fridays only).
    both = FreezeWindow("0 16 */2 * 5", 3600, "x")
    assert both.covering(datetime(2026, 12, 11, 16, 30, tzinfo=UTC)) is not None  # Friday the 11th
    assert both.covering(datetime(2026, 12, 4, 16, 30, tzinfo=UTC)) is None  # Friday the 4th: an even day
    assert both.covering(datetime(2026, 12, 1, 16, 30, tzinfo=UTC)) is None  # the 1st, a Tuesday


def test_a_freeze_window_that_never_fires_is_refused_where_it_is_read(tmp_path: Path) -> None:
    """A never-firing window (31 February) held nothing, and each gated call's check searched years for it."""
    path = tmp_path / "bot.toml"
    path.write_text('[[freezes]]\ncron = "0 0 31 2 *"\nduration_s = 60\nreason = "x"\n')
    with pytest.raises(SettingsError, match="never fires"):
        load_config(path)


# -- on-call: a hostile PagerDuty answer ---------------------------------------------------------------------------


class _Directory:
    name = "slack"

    async def person_by_email(self, email: str) -> str | None:
        return {"alice@example.com": "U7"}.get(email)


@pytest.mark.parametrize("body", [b"[" * 200_000, b'{"users": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"])
async def test_a_deeply_nested_pagerduty_answer_is_a_rota_that_cannot_be_read(body: bytes) -> None:
    """Found: JSON nested deeper than Python's recursion limit (well under the 1 MB read) raised RecursionError out
    of the rota instead of RotaUnavailable: the request crashed where it should fall back to escalate_to."""
    async def users(_request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/schedules/{schedule}/users", users)
    server = await RunningServer(app).start()
    try:
        clock = ShiftedClock()
        rota = PagerDutyRota(pagerduty_client(TOKEN, server.url), lambda: [_Directory()], clock)
        with pytest.raises(RotaUnavailable):
            await rota.people("P1ONCALL")
        resolved = await on_call(["oncall:P1ONCALL", "U9"], rota)
        assert resolved.entries == ("U9",) and resolved.unavailable[0][0] == "P1ONCALL"
    finally:
        await server.stop()


# -- caps: a person past their cap steering into another's turn ----------------------------------------------------


async def test_a_person_past_their_cap_cannot_spend_through_another_persons_turn(tmp_path: Path) -> None:
    """Found: once U2 reached ``person_daily_tokens`` their own turns stopped, but their messages steered into U1's
    running turn made the model work for them on U1's cap. Every sender's person cap is checked now (U1 still
    pays for the turn); interactive turns park on the usual admins' Continue for it."""
    from core.errors import BudgetExhausted
    from core.spending import PersonCaps
    from core.tools import ToolContext

    db = Database(f"sqlite:///{tmp_path}/x.db")
    await db.migrate()
    try:
        clock = ShiftedClock()
        clock.jump_to(NOW)
        caps = SpendingCaps(UsageStore(db), clock, None, CapsConfig(person=PersonCaps(daily_tokens=1_000)))
        await UsageStore(db).add(UsageKey(TODAY, "other-agent", "U2"), Spent(5_000, 0, None))
        alone = ToolContext(session_id="s:1", turn_id=1, agent="default", sender="U1", senders=("U1",))
        await caps.before_call(alone, "default")  # U1 is under their cap
        joined = ToolContext(session_id="s:1", turn_id=1, agent="default", sender="U1", senders=("U1", "U2"))
        with pytest.raises(BudgetExhausted, match="U2's daily token cap"):
            await caps.before_call(joined, "default")
        events = ToolContext(session_id="s:1", turn_id=1, agent="default", sender="U1", senders=("U1", "event:ci"))
        await caps.before_call(events, "default")  # an event's words are nobody's
    finally:
        await db.close()


# -- freezes: a call approved before the freeze that waits for a connection's consent ------------------------------


async def test_a_call_approved_before_a_freeze_and_parked_for_consent_does_not_go_on_during_it(
    connected_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, oauth: Any,
) -> None:
    """Found: a gated call approved (or allowed) before a freeze that then waited for an OAuth consent (up to
    CONNECTION_TIMEOUT_S, 30 minutes) sent its request once someone connected, in the middle of the freeze. It is
    checked again when the pause ends, as an approval is checked right before its call runs."""
    from tests.test_connections import approve, call, consent, personal_link, resource_calls

    gateway: GatewayClient = await start_gateway(connected_settings(bot_admins="UADMIN"))
    fake_llm.then(call(oauth))
    await gateway.send_event(mention("who am I on github?"))
    await approve(gateway, fake_slack, 1)
    await fake_slack.wait_for("chat.postMessage", 2)  # "Connect github to continue"
    freezes = gateway.app.approvals.freezes
    assert freezes is not None
    await freezes.freeze(gateway.app.approvals.clock.now() + timedelta(hours=1), "release 7", by="UADMIN")
    fake_llm.then(Reply("frozen, so I did not look"))
    status, page, _hops = await consent(await personal_link(fake_slack))
    assert status == 200, page
    await fake_slack.wait_for("chat.postMessage", 4)  # the freeze notice and the answer
    await gateway.idle()
    assert resource_calls(oauth) == []
    told = fake_llm.requests[1]["messages"][-1]["content"]
    assert "change freeze until " in told and "release 7" in told


async def test_a_freeze_set_on_a_machine_whose_clock_runs_ahead_holds_at_once_everywhere(tmp_path: Path) -> None:
    """Found: a stored freeze began at the setter's "now": set with `bot freeze` on a host whose clock ran two
    minutes ahead, it was reported as set but not in force on the replicas for those two minutes."""
    from core.freezes import Freezes
    from core.store.freezes import FreezeStore

    db = Database(f"sqlite:///{tmp_path}/f.db")
    await db.migrate()
    try:
        ahead, replica = ShiftedClock(), ShiftedClock()
        ahead.jump_to(NOW + timedelta(minutes=2))
        replica.jump_to(NOW)
        await Freezes(FreezeStore(db), ahead).freeze(NOW + timedelta(hours=1), "cutover", by="operator:ops")
        held = await Freezes(FreezeStore(db), replica).active()
        assert held is not None and held.reason == "cutover"
    finally:
        await db.close()


async def test_a_pagerduty_answer_dripped_a_byte_at_a_time_ends_at_the_deadline() -> None:
    """Found: the client's timeout is per read, so an answer sent a byte at a time (each well within it) held the
    read, and a worker thread of the event loop's default executor, for as long as the server liked (the wait
    gave up, the thread did not). The answer now has a deadline, and reads run on the rota's own threads."""
    stop = asyncio.Event()

    async def users(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        await response.write(b'{"users": [')
        while not stop.is_set():
            await response.write(b" ")
            await asyncio.sleep(0.05)
        return response

    app = web.Application()
    app.router.add_get("/schedules/{schedule}/users", users)
    server = await RunningServer(app).start()
    loop = asyncio.get_running_loop()
    try:
        client = pagerduty_client(TOKEN, server.url, timeout_s=0.5)
        started = loop.time()
        with pytest.raises(RotaUnavailable, match="did not answer in time"):
            await asyncio.wait_for(asyncio.to_thread(read_schedule, client, "P1ONCALL", NOW), 5)  # the read itself
        assert loop.time() - started < 3
        rota = PagerDutyRota(client, lambda: [_Directory()], ShiftedClock(), timeout_s=0.5)
        with pytest.raises(RotaUnavailable):
            await rota.people("P1ONCALL")
        rota.close()
    finally:
        stop.set()
        await server.stop()


async def test_the_on_call_cache_never_outlives_its_minute_when_the_clock_is_set_back(
    fake_pagerduty: FakePagerDuty,
) -> None:
    """Found: the cache kept an answer while ``now - read_at < 60 s``, which a clock set back (a restored VM, a
    corrected host) makes true for as long as it was set back: the shift's old person stayed on call for hours."""
    fake_pagerduty.on_call["P1ONCALL"] = ["alice@example.com"]
    clock = ShiftedClock()
    clock.jump_to(NOW)
    rota = PagerDutyRota(pagerduty_client(TOKEN, fake_pagerduty.url), lambda: [_Directory()], clock)
    try:
        assert await rota.people("P1ONCALL") == frozenset({"slack:U7"})
        fake_pagerduty.on_call["P1ONCALL"] = ["bob@example.com"]  # the shift changes
        clock.jump_to(NOW - timedelta(hours=2))
        with pytest.raises(RotaUnavailable, match="none of the 1 people"):  # read again: bob has no chat account
            await rota.people("P1ONCALL")
        assert fake_pagerduty.reads("P1ONCALL") == 2
    finally:
        rota.close()


async def test_two_replicas_counting_at_once_lose_no_call(tmp_path: Path, database_url: str | None) -> None:
    """Two processes count calls for the same agent, person and day at the same moment: an upsert that adds, so
    no count is lost (SQLite here, PostgreSQL with TEST_DATABASE_URL)."""
    url = database_url or f"sqlite:///{tmp_path}/shared.db"
    here, there = Database(url), Database(url)
    await here.migrate()
    try:
        key = UsageKey(TODAY, "replicas", "U1")
        await asyncio.gather(*(UsageStore(db).add(key, Spent(10, 5, 7)) for _ in range(20) for db in (here, there)))
        [line] = await UsageStore(here).lines(since=TODAY, agent="replicas")
        assert (line.calls, line.input_tokens, line.output_tokens, line.cost_micros) == (40, 400, 200, 280)
    finally:
        await here.close()
        await there.close()
