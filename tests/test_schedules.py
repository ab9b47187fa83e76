"""Scheduled sessions: created by the model, approved twice, fired by APScheduler into a channel."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from typing import Any

import pytest

from core.store.schedules import ScheduleStore
from tests.conftest import GatewayClient
from tests.fakes.core import until
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.slack_api import Failure, FakeSlack
from tests.slack_requests import block_action, command_body, mention

HI = "echo: say hi"


def _buttons(call: Any) -> list[dict[str, Any]]:
    return call.params["blocks"][-1]["elements"]


def _posts_to(fake_slack: FakeSlack, channel: str, text: str | None = None) -> list[Any]:
    return [c for c in fake_slack.posts()
            if c.params.get("channel") == channel and text in (None, c.params.get("text"))]


async def _wait_posts(fake_slack: FakeSlack, channel: str, count: int, timeout: float = 15,
                      text: str | None = None) -> list[Any]:
    async with asyncio.timeout(timeout):
        while len(_posts_to(fake_slack, channel, text)) < count:
            await fake_slack.wait_for("chat.postMessage", len(fake_slack.posts()) + 1, timeout)
    return _posts_to(fake_slack, channel, text)


async def _firings(gateway: GatewayClient, schedule_id: int) -> int:
    """How many firings the schedule has started (counted as each starts, before any answer)."""
    return next(s.firings for s in await gateway.app.schedules.list() if s.id == schedule_id)


async def _firing_gaps(gateway: GatewayClient, schedule_id: int) -> list[float]:
    """Seconds between firings as the scheduler started them (not as their answers reached Slack)."""
    rows = sorted(await ScheduleStore(gateway.app.db).firings(schedule_id), key=lambda f: f.n)
    return [(b.started_at - a.started_at).total_seconds() for a, b in itertools.pairwise(rows)]


def _destination_cards(fake_slack: FakeSlack) -> list[Any]:
    return [p for p in fake_slack.posts() if "schedule_destination" in json.dumps(p.params.get("blocks"))]


async def _start_metronome(gateway: GatewayClient, fake_slack: FakeSlack) -> int:
    """Another schedule, every second into #acc-dest ("echo: tick"): the scheduler's clock, made visible."""
    cards = len(_destination_cards(fake_slack))
    made = await gateway.interact(command_body("schedule every 1s #acc-dest tick"))
    found = re.search(r"Schedule (\d+) created", await made.text())
    assert found is not None
    await until(lambda: len(_destination_cards(fake_slack)) > cards, what="the destination approval")
    await gateway.interact(block_action("approval:approve", _buttons(_destination_cards(fake_slack)[-1])[0]["value"]))
    await _wait_posts(fake_slack, "CACC", 1, text="echo: tick")
    return int(found.group(1))


async def _slots_pass(gateway: GatewayClient, metronome: int, slots: int = 3) -> None:
    """Until the metronome has fired ``slots`` more times: an every-second schedule has had at least
    ``slots - 1`` whole slots in which it would have fired (the scheduler's own clock, not a sleep)."""
    start = await _firings(gateway, metronome)

    async def passed() -> bool:
        return await _firings(gateway, metronome) >= start + slots

    await until(passed, timeout=15, what=f"{slots} firings of the metronome")


@pytest.fixture
async def scheduling(make_settings: Any, start_gateway: Any) -> GatewayClient:
    client: GatewayClient = await start_gateway(make_settings(schedule_min_interval_s=1, bot_admins="UADMIN"))
    return client


async def _create_active(gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM, every: int = 1) -> None:
    fake_llm.then(Reply(tool_calls=[("schedule_create", {"prompt": "say hi", "every_seconds": every,
                                                         "destination": "#acc-dest"})]))
    await gateway.send_event(mention("every second post hi to #acc-dest"))
    tool_approval = (await fake_slack.wait_for("chat.postMessage"))[0]
    assert "schedule_create" in json.dumps(tool_approval.params["blocks"])
    fake_llm.then(Reply("Scheduled; waiting for the destination approval."))
    await gateway.interact(block_action("approval:approve", _buttons(tool_approval)[0]["value"]))
    posts = await fake_slack.wait_for("chat.postMessage", 3)
    destination = next(p for p in posts if "schedule_destination" in json.dumps(p.params.get("blocks")))
    assert "#acc-dest" in json.dumps(destination.params["blocks"])
    assert "becomes active once someone approves" in fake_llm.requests[1]["messages"][-1]["content"]
    pending = await gateway.app.schedules.list()
    assert pending and pending[0].status == "pending_destination"
    await gateway.interact(block_action("approval:approve", _buttons(destination)[0]["value"]))


async def test_a_schedule_fires_into_its_channel_and_obeys_pause_resume_cancel(
    scheduling: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    gateway = scheduling
    await _create_active(gateway, fake_slack, fake_llm)
    firings = await _wait_posts(fake_slack, "CACC", 3)
    assert all(p.params["text"] == HI for p in firings)
    assert all(not p.params.get("thread_ts") for p in firings)  # top-level messages
    gaps = await _firing_gaps(gateway, 1)
    assert all(0.5 < gap < 2.5 for gap in gaps), gaps
    notices = [p.params["text"] for p in fake_slack.posts() if "Schedule 1 is active" in p.params["text"]]
    assert notices
    metronome = await _start_metronome(gateway, fake_slack)

    denied = await gateway.interact(command_body("schedules pause 1", user="U9"))
    assert "only its creator or an admin" in await denied.text()
    paused = await gateway.interact(command_body("schedules pause 1", user="U1"))
    assert "paused" in await paused.text()
    count, started = len(_posts_to(fake_slack, "CACC", HI)), await _firings(gateway, 1)
    await _slots_pass(gateway, metronome)
    assert len(_posts_to(fake_slack, "CACC", HI)) <= count + 1  # at most one that was already running
    assert await _firings(gateway, 1) <= started + 1  # (one may have been starting as the pause landed)
    count = len(_posts_to(fake_slack, "CACC", HI))
    resumed = await gateway.interact(command_body("schedules resume 1", user="UADMIN"))
    assert "resumed" in await resumed.text()
    await _wait_posts(fake_slack, "CACC", count + 2, text=HI)
    listing = await gateway.interact(command_body("schedules"))
    assert "every 1 s" in await listing.text() and "posted (ts" in await listing.text()
    cancelled = await gateway.interact(command_body("schedules cancel 1", user="U1"))
    assert "cancelled" in await cancelled.text()
    count, started = len(_posts_to(fake_slack, "CACC", HI)), await _firings(gateway, 1)
    await _slots_pass(gateway, metronome)
    assert len(_posts_to(fake_slack, "CACC", HI)) <= count + 1
    assert await _firings(gateway, 1) <= started + 1
    schedule = (await gateway.app.schedules.list())[0]
    assert schedule.status == "cancelled" and schedule.firings >= 5
    await gateway.app.schedules.change(metronome, "cancel", by="U1", channel="slack")


async def test_two_failed_deliveries_tell_the_creator(
    scheduling: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    gateway = scheduling
    await _create_active(gateway, fake_slack, fake_llm)
    await _wait_posts(fake_slack, "CACC", 1)
    for _ in range(50):  # from now on #acc-dest refuses every post (the creator's DM still goes through)
        fake_slack.fail_next("chat.postMessage", Failure(error="not_in_channel", channel="CACC"))
    async with asyncio.timeout(10):
        while not fake_slack.of("conversations.open"):
            await asyncio.sleep(0.05)
    dm = await _wait_posts(fake_slack, "DU1", 1)
    assert "failed twice in a row" in dm[0].params["text"] and "not_in_channel" in dm[0].params["text"]

    async def failed_thrice() -> bool:
        return (await gateway.app.schedules.list())[0].failures >= 3

    await until(failed_thrice, what="a third failed delivery, counted")
    schedule = (await gateway.app.schedules.list())[0]
    assert (schedule.last_outcome or "").startswith("failed") and "not_in_channel" in (schedule.last_outcome or "")
    assert len(_posts_to(fake_slack, "DU1")) == 1  # told once, when it started failing
    await gateway.app.schedules.change(schedule.id or 0, "cancel", by="U1", channel="slack")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({"cron": "61 * * * *"}, "invalid cron"),
        ({"cron": "* * *"}, "5 fields"),
        ({"every_seconds": 10, "timezone": "Mars/Olympus"}, "unknown timezone"),
        ({"at": "2001-01-01T00:00:00"}, "in the past"),
        ({"at": "next tuesday"}, "ISO 8601"),
        ({"every_seconds": 10, "cron": "* * * * *"}, "exactly one"),
        ({"every_seconds": 10, "destination": "#nowhere"}, "no channel #nowhere"),
        ({"every_seconds": 10, "destination": "#outside"}, "invite it there first"),
    ],
)
async def test_bad_schedules_are_refused_and_nothing_is_stored(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, args: dict[str, Any],
    expected: str,
) -> None:
    gateway = await start_gateway(make_settings(schedule_min_interval_s=5))
    call = {"prompt": "p", "destination": "#acc-dest", **args}
    fake_llm.then(Reply(tool_calls=[("schedule_create", call)]), Reply("ok"))
    await gateway.send_event(mention("schedule it"))
    approval = (await fake_slack.wait_for("chat.postMessage"))[0]
    await gateway.interact(block_action("approval:approve", _buttons(approval)[0]["value"]))
    await fake_slack.wait_for("chat.postMessage", 2)
    result = fake_llm.requests[1]["messages"][-1]["content"]
    assert result.startswith("error:") and expected in result, result
    assert await gateway.app.schedules.list() == []


async def test_interval_floor_and_slash_command(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    gateway = await start_gateway(make_settings(schedule_min_interval_s=60))
    floor = await gateway.interact(command_body("schedule every 30s #acc-dest post the time"))
    assert "Not scheduled: every_seconds must be at least 60" in await floor.text()
    made = await gateway.interact(command_body("schedule every 2m #acc-dest post the time"))
    assert "Schedule 1 created (every 120 s" in await made.text()
    approval = (await fake_slack.wait_for("chat.postMessage"))[0]
    assert approval.params["channel"] == "C1" and not approval.params.get("thread_ts")
    await gateway.interact(block_action("approval:deny", _buttons(approval)[0]["value"]))
    from tests.slack_requests import view_submission

    await gateway.interact(view_submission("approval_deny", _buttons(approval)[0]["value"], {}))
    await fake_slack.wait_for("chat.postMessage", 2)
    assert "was not started" in fake_slack.posts()[1].params["text"]
    assert (await gateway.app.schedules.list())[0].status == "cancelled"


async def _store_active_schedule(settings: Any, *, old_job: bool) -> None:
    """Before the gateway starts: schedule 1 (every second to #acc-dest) active in the table and, with
    ``old_job``, its APScheduler job written exactly as the code before the split wrote it."""
    import pickle
    from datetime import UTC, datetime, timedelta

    from sqlalchemy import create_engine

    from core.model import ScheduleStatus
    from core.store import Database
    from core.store.schedules import ScheduleStore
    from core.store.tables import ScheduleRow
    from core.triggers import TriggerSpec

    settings.bot_home.mkdir(mode=0o700, parents=True, exist_ok=True)
    db = Database(settings.resolved_database_url)
    await db.migrate()
    now = datetime.now(UTC)
    spec = TriggerSpec(every_seconds=1)
    await ScheduleStore(db).add(ScheduleRow(
        prompt="say hi", trigger=spec.to_json(), destination="#acc-dest", destination_id="CACC", channel="slack",
        agent="default", creator="U1", status=ScheduleStatus.ACTIVE, created_at=now))
    if old_job:
        from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore

        trigger = spec.build(now - timedelta(days=1), 0)
        state = {"version": 1, "id": "schedule:1", "func": "core.schedules:run_schedule", "trigger": trigger,
                 "executor": "default", "args": (1,), "kwargs": {}, "name": "run_schedule",
                 "misfire_grace_time": 300, "coalesce": True, "max_instances": 1, "next_run_time": now}
        engine = create_engine(db.sync_url)
        jobs = SQLAlchemyJobStore(engine=engine)
        jobs.jobs_t.create(engine, checkfirst=True)
        with engine.begin() as conn:
            conn.execute(jobs.jobs_t.insert().values(id="schedule:1", next_run_time=now.timestamp(),
                                                     job_state=pickle.dumps(state, pickle.HIGHEST_PROTOCOL)))
        engine.dispose()
    await db.close()


async def test_a_job_stored_before_the_split_still_fires(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, caplog: pytest.LogCaptureFixture
) -> None:
    """The job store names the job function ``core.schedules:run_schedule`` (the module before the split):
    after the upgrade that job fires as it did, before the table sync could have added a new one."""
    settings = make_settings(schedule_min_interval_s=1)
    await _store_active_schedule(settings, old_job=True)
    gateway = await start_gateway(settings)
    posts = await _wait_posts(fake_slack, "CACC", 1, timeout=4)  # the table sync runs after 5 s
    assert posts[0].params["text"] == "echo: say hi"
    assert not [r for r in caplog.records if "Unable to restore job" in r.getMessage()]
    await gateway.app.schedules.change(1, "cancel", by="U1", channel="slack")


async def test_the_job_entry_point_takes_only_a_schedule_id(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack
) -> None:
    """A job row written by someone else (crafted arguments) fires nothing; a real id still does."""
    from core.schedules import run_schedule

    settings = make_settings(schedule_min_interval_s=1)
    await _store_active_schedule(settings, old_job=False)  # active, but no job: only our calls fire it
    gateway = await start_gateway(settings)
    for crafted in ("1", True, 1.0, -1, 0, 10**30, [1], "__import__('os').system('id')"):
        await run_schedule(crafted)  # type: ignore[arg-type]
    assert (await gateway.app.schedules.list())[0].firings == 0 and not _posts_to(fake_slack, "CACC")
    await run_schedule(1)
    assert (await gateway.app.schedules.list())[0].firings >= 1  # (the table sync may add its job after 5 s)
    assert _posts_to(fake_slack, "CACC")[0].params["text"] == "echo: say hi"
    await gateway.app.schedules.change(1, "cancel", by="U1", channel="slack")


async def test_a_restart_between_asking_and_recording_the_destination_approval_asks_once(tmp_path: Any) -> None:
    """A stop right after the destination approval was asked, before its id was stored on the schedule:
    the next start finds that request (same call) instead of posting a second card."""
    from datetime import UTC, datetime

    from core.agents import Agent, AgentDirectory
    from core.approval_policy import ApprovalPolicy
    from core.approvals import ApprovalBroker
    from core.clock import SystemClock
    from core.events import ApprovalRequested, EventBus
    from core.model import ApprovalStatus, ScheduleStatus, SessionInfo, SessionStatus
    from core.schedules import ScheduleService
    from core.schedules.service import destination_args, destination_place
    from core.store import ApprovalStore, ConversationStore, Database
    from core.store.tables import ScheduleRow
    from core.tools import DESTINATION_TOOL
    from core.triggers import TriggerSpec

    db = Database(f"sqlite:///{tmp_path / 'bot.sqlite3'}")
    await db.migrate()
    clock, bus = SystemClock(), EventBus()
    asked: list[int] = []

    async def count(event: Any) -> None:
        if isinstance(event, ApprovalRequested):
            asked.append(event.request.id)

    bus.subscribe(count)
    approvals = ApprovalBroker(ApprovalStore(db), bus, clock, ApprovalPolicy(("U1",), ()),
                               AgentDirectory([Agent()]), timeout_s=60, poll_s=0.05)
    conversations, store = ConversationStore(db), ScheduleStore(db)
    origin = SessionInfo(id="slack:T1:C1:command-1", channel="slack", agent="default", status=SessionStatus.IDLE,
                         reply_ref={"channel": "C1"}, place="slack:T1:C1")
    await conversations.ensure_session(origin, clock.now())
    row = await store.add(ScheduleRow(
        prompt="hi", trigger=TriggerSpec(every_seconds=3600).to_json(), destination="#ops", destination_id="C2",
        channel="slack", agent="default", creator="U2", origin_session=origin.id,
        status=ScheduleStatus.PENDING_DESTINATION, created_at=datetime.now(UTC)))
    first = await approvals.request(session_id=origin.id, turn_id=None, call_id=f"schedule:{row.id}",
                                    tool=DESTINATION_TOOL, args=destination_args(row), agent="default",
                                    place=destination_place(row), requester="U2")
    await bus.drain(timeout=5)
    asked.clear()  # the card of the process that stopped
    service = ScheduleService(store, conversations, approvals, bus, clock)
    await service.start()  # the restart
    await until(lambda: _approval_recorded(store, row.id))
    decided = await approvals.decide(first.id, "approve", by="U1")
    assert decided.won and decided.request is not None and decided.request.status == ApprovalStatus.APPROVED
    await until(lambda: _status_is(store, row.id, ScheduleStatus.ACTIVE))
    await service.stop()
    await bus.drain(timeout=5)
    assert asked == []  # no second card
    assert (await store.get(row.id or 0)).approval_id == first.id  # type: ignore[union-attr]
    await db.close()


async def _approval_recorded(store: ScheduleStore, schedule_id: int | None) -> bool:
    row = await store.get(schedule_id or 0)
    return row is not None and row.approval_id is not None


async def _status_is(store: ScheduleStore, schedule_id: int | None, status: str) -> bool:
    row = await store.get(schedule_id or 0)
    return row is not None and row.status == status
