"""Firing-time drift of scheduled sessions: how late each firing's answer lands in its channel, vs
the ideal cadence. Baseline in the same run: a bare APScheduler job (memory store) that only records
the time. The gateway's figure includes the whole firing: durable firing record, a model call to the
fake model, and the Slack post.

    python -m bench.schedule_drift --every 1 --firings 10
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from bench.common import summary
from bot.app import build_application
from bot.settings import load_settings
from tests.fakes.llm import FakeLLM
from tests.fakes.server import RunningServer
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import SIGNING_SECRET, block_action, command_body, signed_headers


def _drift(times: list[float], every: float) -> list[float]:
    """Lateness of each firing (ms) against the ideal cadence t0 + k * every, where t0 is aligned to
    the earliest firing, so every figure is >= 0 and a steady delay shows as spread, not as offset."""
    t0 = min(t - k * every for k, t in enumerate(times))
    return [(t - (t0 + k * every)) * 1000 for k, t in enumerate(times)]


async def _baseline(every: int, firings: int) -> list[float]:
    seen: list[float] = []
    done = asyncio.Event()

    async def job() -> None:
        seen.append(time.monotonic())
        if len(seen) >= firings:
            done.set()

    scheduler = AsyncIOScheduler()
    scheduler.add_job(job, "interval", seconds=every, id="bare", coalesce=True, max_instances=1)
    scheduler.start()
    await done.wait()
    scheduler.shutdown(wait=False)
    return _drift(seen, every)


async def _gateway(every: int, firings: int) -> list[float]:
    slack, llm = FakeSlack(), FakeLLM()
    slack_server, llm_server = await RunningServer(slack.app()).start(), await RunningServer(llm.app()).start()
    with tempfile.TemporaryDirectory() as home:
        settings = load_settings(
            env_file=None, bot_home=Path(home), port=0, slack_bot_token="xoxb-bench",
            slack_signing_secret=SIGNING_SECRET, slack_api_url=f"{slack_server.url}/api/",
            llm_base_url=f"{llm_server.url}/v1", llm_model="fake", log_level="WARNING", schedule_min_interval_s=1,
        )
        app = build_application(settings)
        await app.start()
        import aiohttp

        url = f"http://127.0.0.1:{app.bound_port}/slack/events"
        form = "application/x-www-form-urlencoded"
        async with aiohttp.ClientSession() as http:
            body = command_body(f"schedule every {every}s #acc-dest say hi")
            await http.post(url, data=body, headers=signed_headers(body, content_type=form))
            approval = (await slack.wait_for("chat.postMessage"))[0]
            click = block_action("approval:approve", approval.params["blocks"][-1]["elements"][0]["value"])
            await http.post(url, data=click, headers=signed_headers(click, content_type=form))

            def posts() -> list[float]:
                return [c.at for c in slack.posts() if c.params.get("channel") == "CACC"]

            while len(posts()) < firings:
                await slack.wait_for("chat.postMessage", len(slack.posts()) + 1, timeout=every * 3 + 10)
        await app.stop()
    await slack_server.stop()
    await llm_server.stop()
    return _drift(posts()[:firings], every)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--every", type=int, default=1)
    parser.add_argument("--firings", type=int, default=10)
    args = parser.parse_args()
    ours = await _gateway(args.every, args.firings)
    bare = await _baseline(args.every, args.firings)
    print(f"firing drift over {args.firings} firings every {args.every} s (ms late vs the ideal cadence)")
    for label, values in (("gateway (answer posted)", ours), ("bare APScheduler job", bare)):
        print(f"  {label:<24} median {statistics.median(values):7.1f}  max {max(values):7.1f}")
    summary("schedule firing lateness, median", statistics.median(ours), statistics.median(bare), "ms",
            "(informative; baseline: a bare APScheduler job)")
    print("  (the gateway's figures include each firing's own work: record, model call, Slack post; "
          "the cadence itself does not drift)")


if __name__ == "__main__":
    asyncio.run(main())
