"""SIGKILL at chosen points, then restart: exactly one outcome in the thread, nothing run twice,
nothing parked lost (SPEC §10). And SIGTERM drains within its window."""

from __future__ import annotations

import asyncio
import json
import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from core.store import CredentialStore, Database
from tests.bot_process import BotProcess, post_form, send_event, slack_env
from tests.fakes.core import until
from tests.fakes.llm import FakeLLM, Gate, Reply
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import block_action, command_body, mention, view_submission


@pytest.fixture(autouse=True)
def _process_database(database_url: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    if database_url:
        monkeypatch.setenv("BOT_PROCESS_DATABASE_URL", database_url)


def _texts(fake_slack: FakeSlack, channel: str | None = None) -> list[str]:
    return [str(c.params.get("text")) for c in fake_slack.posts()
            if channel is None or c.params.get("channel") == channel]


async def _until_announced(home: Path, request_id: int) -> None:
    """Until the bot has recorded where it posted the credential request (read from its database)."""
    db = Database(os.environ.get("BOT_PROCESS_DATABASE_URL") or f"sqlite:///{home / '.bot' / 'bot.db'}")
    try:
        async def announced() -> bool:
            info = await CredentialStore(db).get(request_id)
            return info is not None and info.announcement is not None

        await until(announced, what=f"credential request {request_id}'s message recorded")
    finally:
        await db.close()


async def _wait_text(fake_slack: FakeSlack, text: str, timeout: float = 20) -> None:
    async with asyncio.timeout(timeout):
        while not any(text in t for t in _texts(fake_slack)):
            await fake_slack.wait_for("chat.postMessage", len(fake_slack.posts()) + 1, timeout)


async def test_kill_while_waiting_for_a_credential(
    tmp_path: Path, unused_port: int, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    env = slack_env(fake_slack, fake_llm, unused_port) | {"APPROVAL_POLL_S": "0.1"}
    fake_llm.then(Reply(tool_calls=[("credential_request", {"name": "kill.token", "reason": "test"})]))
    bot = await BotProcess(tmp_path, env).start()
    await send_event(bot, mention("need a token"), "EvCred")
    request = (await fake_slack.wait_for("chat.postMessage"))[0]
    request_id = request.params["blocks"][-1]["elements"][0]["value"]
    await _until_announced(tmp_path, int(request_id))  # the restart updates that message: it must be known
    await bot.kill()

    bot = await BotProcess(tmp_path, env).start()
    try:
        fake_llm.then(Reply("token in hand"))
        values = {"value": {"value": {"type": "plain_text_input", "value": "after-restart-secret"}}}
        assert await post_form(bot, view_submission("credential_provide", request_id, values)) == 200
        await _wait_text(fake_slack, "token in hand")
        assert _texts(fake_slack).count("token in hand") == 1
        assert "kill.token is now stored" in fake_llm.requests[-1]["messages"][-1]["content"]
    finally:
        assert await bot.terminate() == 0


async def test_a_turn_resumed_after_a_kill_clears_the_sign_the_dead_process_showed(
    tmp_path: Path, unused_port: int, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    env = slack_env(fake_slack, fake_llm, unused_port) | {"SLACK_PROGRESS_DELAY_S": "0.2"}  # the default
    gate = Gate(Reply("never seen"))
    fake_llm.then(gate)
    event = mention("think hard")
    bot = await BotProcess(tmp_path, env).start()
    try:
        await send_event(bot, event, "EvSign")
        await asyncio.wait_for(gate.reached.wait(), 10)
        added = await fake_slack.wait_for("reactions.add")  # still working after the delay: the sign shows
        assert (added[0].params["name"], added[0].params["timestamp"]) == ("eyes", event["ts"])
        await bot.kill()
        fake_llm.then(Reply("done after all"))  # the resumed turn ends well within the delay
        bot = await BotProcess(tmp_path, env).start()
        await _wait_text(fake_slack, "done after all")
        removed = await fake_slack.wait_for("reactions.remove")
        assert (removed[0].params["name"], removed[0].params["timestamp"]) == ("eyes", event["ts"])
    finally:
        gate.opened.set()
        assert await bot.terminate() == 0


async def test_kill_during_a_tool_call_never_runs_it_again(
    tmp_path: Path, unused_port: int, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    env = slack_env(fake_slack, fake_llm, unused_port)
    log = tmp_path / ".bot" / "work" / "default" / "runs.log"
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo started >> runs.log; sleep 3; echo done"})]))
    bot = await BotProcess(tmp_path, env).start()
    await send_event(bot, mention("run the slow thing"), "EvTool")
    approval = (await fake_slack.wait_for("chat.postMessage"))[0]
    await post_form(bot, block_action("approval:approve", approval.params["blocks"][-1]["elements"][0]["value"]))
    async with asyncio.timeout(10):
        while not log.exists():
            await asyncio.sleep(0.05)
    await bot.kill()  # the command is running

    fake_llm.then(Reply("it may or may not have finished"))
    bot = await BotProcess(tmp_path, env).start()
    try:
        await _wait_text(fake_slack, "it may or may not have finished")
        await asyncio.sleep(3.5)  # the orphaned first run ends; a second run would append again
        assert log.read_text().count("started") == 1
        told = fake_llm.requests[-1]["messages"][-1]["content"]
        assert "interrupted" in told and "unknown whether it completed" in told
        assert _texts(fake_slack).count("it may or may not have finished") == 1
    finally:
        assert await bot.terminate() == 0


async def test_kill_right_after_a_schedule_fires(
    tmp_path: Path, unused_port: int, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    env = slack_env(fake_slack, fake_llm, unused_port) | {"SCHEDULE_MIN_INTERVAL_S": "1"}
    gate = Gate(Reply("the one firing"))
    bot = await BotProcess(tmp_path, env).start()
    at = (datetime.now(UTC) + timedelta(seconds=3)).replace(microsecond=0).isoformat().replace("+00:00", "")
    await post_form(bot, command_body(f"schedule at {at} #acc-dest say once"))
    approval = (await fake_slack.wait_for("chat.postMessage"))[0]
    fake_llm.then(gate, Reply("the one firing"))
    await post_form(bot, block_action("approval:approve", approval.params["blocks"][-1]["elements"][0]["value"]))
    await asyncio.wait_for(gate.reached.wait(), 15)  # the firing is in its model call
    await bot.kill()
    gate.opened.set()

    bot = await BotProcess(tmp_path, env).start()
    try:
        await _wait_text(fake_slack, "the one firing")
        await asyncio.sleep(1.5)
        assert _texts(fake_slack, "CACC") == ["the one firing"]  # posted once, top-level, not fired again
        from tests.bot_process import run_cli

        _code, out = await run_cli(tmp_path, env, "schedules", "list")
        assert "\tdone\t" in out and "firings 1" in out
    finally:
        assert await bot.terminate() == 0


async def test_sigterm_drains_then_the_restart_finishes_the_turn(
    tmp_path: Path, unused_port: int, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    env = slack_env(fake_slack, fake_llm, unused_port) | {"SHUTDOWN_DRAIN_S": "1"}
    gate = Gate(Reply("never seen"))
    fake_llm.then(gate, Reply("finished after the redeploy"))
    bot = await BotProcess(tmp_path, env).start()
    await send_event(bot, mention("a long one"), "EvTerm")
    await asyncio.wait_for(gate.reached.wait(), 10)
    started = time.monotonic()
    assert await bot.terminate(timeout=10) == 0
    assert time.monotonic() - started < 6  # the drain window (1 s) plus shutting down
    gate.opened.set()

    bot = await BotProcess(tmp_path, env).start()
    try:
        await _wait_text(fake_slack, "finished after the redeploy")
        assert _texts(fake_slack) == ["finished after the redeploy"]
        assert json.dumps(fake_llm.requests[-1]).count("a long one") == 1
    finally:
        assert await bot.terminate() == 0





async def test_every_acknowledged_mention_of_a_burst_is_answered_once_after_a_kill(
    tmp_path: Path, unused_port: int, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    """Accepts are committed in groups: an ack means its group committed. Killed right after the last ack
    of a burst (some turns running, most waiting), the restart answers each of them exactly once."""
    fake_llm.delay_s = 0.2  # turns are still at work when the process dies
    env = slack_env(fake_slack, fake_llm, unused_port)
    bot = await BotProcess(tmp_path, env).start()
    events = [mention(f"burst {n}", channel=f"C{n}") for n in range(40)]
    statuses = await asyncio.gather(*(send_event(bot, event, f"EvBurst{n}") for n, event in enumerate(events)))
    assert statuses == [200] * 40
    await bot.kill()
    assert len(_texts(fake_slack)) < 40  # the kill came before every turn had answered

    bot = await BotProcess(tmp_path, env).start()
    try:
        async def all_answered() -> bool:
            return all(any(f"burst {n}" in t for t in _texts(fake_slack)) for n in range(40))

        await until(all_answered, timeout=30, what="every acknowledged mention answered")
        await asyncio.sleep(0.5)  # a second answer to any of them would be posted by now
        for n in range(40):
            assert sum(t == f"echo: burst {n}" for t in _texts(fake_slack)) == 1, f"burst {n}"
    finally:
        assert await bot.terminate() == 0
