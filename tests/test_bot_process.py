"""The real ``bot run`` process: starts with no settings, refuses bad ones, and survives SIGKILL."""

from __future__ import annotations

import asyncio
import itertools
import os
from pathlib import Path
from typing import Any

import pytest

from tests.bot_process import BotProcess, post_form, run_cli, run_to_exit, send_event, slack_env
from tests.fakes.llm import FakeLLM, Gate, Reply
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import (
    block_action,
    command_body,
    mention,
    message,
)


@pytest.fixture(autouse=True)
def _process_database(database_url: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """With TEST_DATABASE_URL, the real processes share this test's fresh PostgreSQL database."""
    if database_url:
        monkeypatch.setenv("BOT_PROCESS_DATABASE_URL", database_url)


async def test_starts_with_no_settings_on_the_embedded_default(tmp_path: Path, unused_port: int) -> None:
    bot = await BotProcess(tmp_path, {"PORT": str(unused_port)}).start()
    try:
        assert f"listening on http://127.0.0.1:{unused_port}" in bot.stdout
        assert "provider: demo" in bot.stdout
        assert f"web chat: http://127.0.0.1:{unused_port}/" in bot.stdout
        assert await bot.get("/healthz") == (200, {"status": "ok"})
        status, body = await bot.get("/readyz")
        assert status == 200 and body["status"] == "ready"
        assert (tmp_path / ".bot" / "bot.db").exists() or os.environ.get("TEST_DATABASE_URL")
    finally:
        assert await bot.terminate() == 0


async def test_bad_settings_are_refused_with_a_clear_message(tmp_path: Path) -> None:
    code, out = await run_to_exit(tmp_path, {"PORT": "abc"})
    assert code == 2
    assert "PORT" in out and "abc" in out and "Traceback" not in out
    code, out = await run_to_exit(tmp_path, {"DATABASE_URL": "definitely not a url"})
    assert code == 2
    assert "DATABASE_URL" in out and "Traceback" not in out
    code, out = await run_to_exit(tmp_path, {"HOST": "0.0.0.0"})
    assert code == 2
    assert "HOST=0.0.0.0" in out and "BOT_WEB_TOKEN" in out and "Traceback" not in out


async def test_redelivery_after_a_kill_is_not_answered_twice(
    tmp_path: Path, unused_port: int, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    env = slack_env(fake_slack, fake_llm, unused_port)
    first = mention("hello once")
    bot = await BotProcess(tmp_path, env).start()
    assert await send_event(bot, first, "EvFirst") == 200
    await fake_slack.wait_for("chat.postMessage")
    await bot.kill()

    bot = await BotProcess(tmp_path, env).start()
    try:
        assert await send_event(bot, first, "EvFirst", retry=1) == 200
        assert await send_event(bot, message(first["text"], ts=first["ts"]), "EvTwin") == 200
        # A later mention in the same thread runs after anything queued there: a barrier.
        assert await send_event(bot, mention("barrier", thread_ts=first["ts"]), "EvBarrier") == 200
        posts = await fake_slack.wait_for("chat.postMessage", 2)
        await asyncio.sleep(0)  # let any stray (wrong) extra answer surface
        assert [p.params["text"] for p in posts] == ["echo: hello once", "echo: barrier"]
        assert len(fake_llm.requests) == 2
    finally:
        assert await bot.terminate() == 0


async def test_a_turn_killed_mid_flight_is_continued_after_restart(
    tmp_path: Path, unused_port: int, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    env = slack_env(fake_slack, fake_llm, unused_port)
    gate = Gate(Reply("never delivered"))
    fake_llm.then(gate)
    bot = await BotProcess(tmp_path, env).start()
    assert await send_event(bot, mention("survive this"), "EvKill") == 200
    await asyncio.wait_for(gate.reached.wait(), 10)
    await bot.kill()
    gate.opened.set()

    bot = await BotProcess(tmp_path, env).start()
    try:
        posts = await fake_slack.wait_for("chat.postMessage")
        assert posts[0].params["text"] == "echo: survive this"
        assert fake_llm.last_user_text() == "survive this"
    finally:
        assert await bot.terminate() == 0


async def test_pause_and_resume_from_the_command_line(
    tmp_path: Path, unused_port: int, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    env = slack_env(fake_slack, fake_llm, unused_port)
    bot = await BotProcess(tmp_path, env).start()
    try:
        code, out = await run_cli(tmp_path, env, "pause")
        assert code == 0 and "paused" in out
        root = mention("are you there?")
        assert await send_event(bot, root, "EvPaused") == 200
        posts = await fake_slack.wait_for("chat.postMessage")
        assert "paused by an operator" in posts[0].params["text"]
        assert fake_llm.requests == []
        code, out = await run_cli(tmp_path, env, "resume")
        assert code == 0 and "resumed" in out
        assert await send_event(bot, mention("now?", thread_ts=root["ts"]), "EvResumed") == 200
        posts = await fake_slack.wait_for("chat.postMessage", 2)
        assert posts[1].params["text"] == "echo: now?"
    finally:
        assert await bot.terminate() == 0


async def test_a_parked_approval_survives_a_kill_and_its_button_still_works(
    tmp_path: Path, unused_port: int, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    env = slack_env(fake_slack, fake_llm, unused_port) | {"APPROVAL_POLL_S": "0.1"}
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo survived"})]))
    bot = await BotProcess(tmp_path, env).start()
    assert await send_event(bot, mention("run it"), "EvPark") == 200
    request = (await fake_slack.wait_for("chat.postMessage"))[0]
    request_id = request.params["blocks"][-1]["elements"][0]["value"]
    await bot.kill()

    bot = await BotProcess(tmp_path, env).start()
    try:
        fake_llm.then(Reply("it survived"))
        assert await post_form(bot, block_action("approval:approve", request_id, user="U1")) == 200
        async with asyncio.timeout(10):
            while "it survived" not in [p.params["text"] for p in fake_slack.posts()]:
                await fake_slack.wait_for("chat.postMessage", len(fake_slack.posts()) + 1)
        # The request's message shows the decision: updated in place, or (if the kill came between
        # posting it and recording where) posted anew.
        shown = [str(c.params.get("blocks")) for c in fake_slack.of("chat.update") + fake_slack.posts()]
        assert any("Approved by" in text for text in shown)
        assert "survived" in fake_llm.requests[1]["messages"][-1]["content"]  # ran once, after the restart
        assert len(fake_llm.requests) == 2
    finally:
        assert await bot.terminate() == 0


async def test_operator_override_from_the_command_line(
    tmp_path: Path, unused_port: int, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    env = slack_env(fake_slack, fake_llm, unused_port) | {"APPROVAL_POLL_S": "0.1"}
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo by-operator"})]), Reply("operator said no"))
    bot = await BotProcess(tmp_path, env).start()
    try:
        assert await send_event(bot, mention("run it"), "EvOperator") == 200
        await fake_slack.wait_for("chat.postMessage")
        code, out = await run_cli(tmp_path, env, "approvals", "list")
        assert code == 0 and "shell_run" in out and "echo by-operator" in out
        request_id = out.split("\t", 1)[0]
        code, out = await run_cli(tmp_path, env, "approvals", "deny", request_id, "--reason", "maintenance")
        assert code == 0 and "Denied by operator" in out
        posts = await fake_slack.wait_for("chat.postMessage", 2)
        assert posts[1].params["text"] == "operator said no"
        assert "maintenance" in fake_llm.requests[1]["messages"][-1]["content"]
        updates = await fake_slack.wait_for("chat.update")  # the running process updated the message
        assert "Denied by operator" in str(updates[0].params["blocks"])
        code, out = await run_cli(tmp_path, env, "approvals", "deny", request_id)
        assert code == 4 and "Already settled" in out  # refused (see `bot --help`)
    finally:
        assert await bot.terminate() == 0


async def test_credentials_from_the_command_line(tmp_path: Path) -> None:
    import base64
    import os

    k1 = f"k1:{base64.b64encode(os.urandom(32)).decode()}"
    k2 = f"k2:{base64.b64encode(os.urandom(32)).decode()}"
    env = {"BOT_SECRET_KEYS": k1}
    code, out = await run_cli(tmp_path, env, "credentials", "set", "acc.token", stdin=b"cli-secret-value-5\n")
    assert code == 0 and "sealed with key 'k1'" in out and "cli-secret-value-5" not in out
    code, out = await run_cli(tmp_path, env, "credentials", "list")
    assert code == 0 and "acc.token" in out and "key k1" in out and "cli-secret-value-5" not in out
    code, out = await run_cli(tmp_path, {"BOT_SECRET_KEYS": f"{k2},{k1}"}, "credentials", "rotate")
    assert code == 0 and "1 re-sealed" in out
    code, out = await run_cli(tmp_path, {"BOT_SECRET_KEYS": k2}, "credentials", "list")
    assert "key k2" in out  # the old key is no longer needed
    code, out = await run_cli(tmp_path, {"BOT_SECRET_KEYS": k1}, "credentials", "rotate")
    assert code == 1 and "sealed with key 'k2', which is not configured" in out and "Traceback" not in out
    code, out = await run_cli(tmp_path, {"BOT_SECRET_KEYS": k2}, "credentials", "delete", "acc.token")
    assert code == 0 and "deleted" in out
    if not os.environ.get("TEST_DATABASE_URL"):
        assert b"cli-secret-value-5" not in (tmp_path / ".bot" / "bot.db").read_bytes()


async def test_an_active_schedule_keeps_firing_after_a_kill_without_duplicates(
    tmp_path: Path, unused_port: int, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    env = slack_env(fake_slack, fake_llm, unused_port) | {"SCHEDULE_MIN_INTERVAL_S": "1"}
    bot = await BotProcess(tmp_path, env).start()
    assert await post_form(bot, command_body("schedule every 1s #acc-dest say hi")) == 200
    approval = (await fake_slack.wait_for("chat.postMessage"))[0]
    assert await post_form(bot, block_action("approval:approve",
                                          approval.params["blocks"][-1]["elements"][0]["value"])) == 200

    def to_dest() -> list[Any]:
        return [c for c in fake_slack.posts() if c.params.get("channel") == "CACC"]

    async def wait_dest(count: int) -> None:
        async with asyncio.timeout(20):
            while len(to_dest()) < count:
                await fake_slack.wait_for("chat.postMessage", len(fake_slack.posts()) + 1, 20)

    await wait_dest(2)
    await bot.kill()
    before = len(to_dest())
    bot = await BotProcess(tmp_path, env).start()
    try:
        await wait_dest(before + 3)
        after = [c.at for c in to_dest()[before:]]
        gaps = [b - a for a, b in itertools.pairwise(after)]
        # A duplicate firing of one slot would post twice at once; start latency alone varies by a few 100 ms.
        assert all(gap > 0.2 for gap in gaps), gaps
    finally:
        assert await bot.terminate() == 0
