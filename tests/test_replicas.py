"""Two `bot run` replicas on one PostgreSQL database (SPEC §11). Runs only with TEST_DATABASE_URL."""

from __future__ import annotations

import asyncio
import base64
import itertools
import os
import socket
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from tests.bot_process import BotProcess, post_form, send_event, slack_env
from tests.fakes.llm import FakeLLM
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import block_action, command_body, mention

pytestmark = pytest.mark.skipif(not os.environ.get("TEST_DATABASE_URL"), reason="needs TEST_DATABASE_URL")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _replicas(tmp_path: Path, fake_slack: FakeSlack, fake_llm: FakeLLM, database_url: str,
                    **extra: str) -> list[BotProcess]:
    keys = f"k1:{base64.b64encode(os.urandom(32)).decode()}"  # replicas must share their keys
    bots = []
    for name in ("a", "b"):
        home = tmp_path / name
        home.mkdir()
        env = slack_env(fake_slack, fake_llm, _port()) | {"DATABASE_URL": database_url, "BOT_SECRET_KEYS": keys,
                                                         "SCHEDULE_MIN_INTERVAL_S": "1", **extra}
        bots.append(await BotProcess(home, env).start())
    return bots


async def test_two_replicas_answer_every_mention_once(
    tmp_path: Path, fake_slack: FakeSlack, fake_llm: FakeLLM, database_url: str
) -> None:
    bots = await _replicas(tmp_path, fake_slack, fake_llm, database_url, QUEUE_MODE="followup")
    try:
        events = [mention(f"question {i}", channel=f"C{i % 7}") for i in range(200)]
        await asyncio.gather(*(send_event(bot, event, f"EvR{i}") for i, (bot, event)
                               in enumerate(zip(itertools.cycle(bots), events, strict=False))))
        # The same deliveries again, to the other replica: nothing new.
        await asyncio.gather(*(send_event(bots[(i + 1) % 2], event, f"EvR{i}", retry=1)
                               for i, event in enumerate(events[:50])))
        # One thread, messages alternating between replicas: its turns never overlap.
        root = mention("thread start", channel="CT")
        await send_event(bots[0], root, "EvT0")
        for i in range(6):
            await send_event(bots[i % 2], mention(f"follow {i}", channel="CT", thread_ts=root["ts"]), f"EvT{i + 1}")
        posts = await fake_slack.wait_for("chat.postMessage", 207, timeout=90)
        await asyncio.sleep(1)
        answered = [(p.params["channel"], p.params.get("thread_ts"), p.params["text"]) for p in fake_slack.posts()]
        assert len(answered) == 207 == len(set(answered)), "every mention answered exactly once"
        assert sorted(t for c, _, t in answered if c != "CT") == sorted(f"echo: question {i}" for i in range(200))
        assert len(posts) == 207
        dsn = make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)
        conn = await asyncpg.connect(dsn)
        try:
            rows = await conn.fetch("SELECT started_at, finished_at FROM turns WHERE session_id = $1 "
                                    "ORDER BY started_at", f"slack:T1:CT:{root['ts']}")
        finally:
            await conn.close()
        assert len(rows) == 7
        for before, after in itertools.pairwise(rows):
            assert before["finished_at"] <= after["started_at"], "two turns of one thread overlapped"
    finally:
        for bot in bots:
            await bot.terminate()


async def test_the_scheduler_moves_when_its_leader_dies(
    tmp_path: Path, fake_slack: FakeSlack, fake_llm: FakeLLM, database_url: str
) -> None:
    bots = await _replicas(tmp_path, fake_slack, fake_llm, database_url)
    try:
        await post_form(bots[0], command_body("schedule every 1s #acc-dest tick"))
        approval = (await fake_slack.wait_for("chat.postMessage"))[0]
        request_id = approval.params["blocks"][-1]["elements"][0]["value"]
        await post_form(bots[1], block_action("approval:approve", request_id))  # clicked on the other replica

        def ticks() -> list[Any]:
            return [c for c in fake_slack.posts() if c.params.get("channel") == "CACC"]

        async def wait_ticks(count: int) -> None:
            async with asyncio.timeout(30):
                while len(ticks()) < count:
                    await fake_slack.wait_for("chat.postMessage", len(fake_slack.posts()) + 1, 30)

        await wait_ticks(3)
        dsn = make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)
        conn = await asyncpg.connect(dsn)
        try:
            holder = await conn.fetchval("SELECT holder FROM leases WHERE name = 'scheduler'")
        finally:
            await conn.close()
        leader = next(b for b in bots if b.proc is not None and f":{b.proc.pid}:" in str(holder))
        await leader.kill()
        killed_at = len(ticks())
        await wait_ticks(killed_at + 3)  # the other replica took over (lease 2 s)
        after = [c.at for c in ticks()[killed_at - 1:]]
        assert all(b - a > 0.2 for a, b in itertools.pairwise(after)), "a slot was posted twice"
        conn = await asyncpg.connect(dsn)
        try:
            started = [r["started_at"] for r in await conn.fetch("SELECT started_at FROM firings ORDER BY n")]
        finally:
            await conn.close()
        gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(started)]
        assert all(gap >= 0.5 for gap in gaps), gaps  # one firing per slot, across the takeover
    finally:
        for bot in bots:
            if bot.proc is not None and bot.proc.returncode is None:
                await bot.terminate()
