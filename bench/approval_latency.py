"""Approval-to-resume latency: from an approver's click (a signed Slack request) to the model being
asked again with the tool's result. Baseline in the same run: a safe tool's turnaround (model's tool
call answered → model asked again), which has no approval in between.

    python -m bench.approval_latency --rounds 30
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp

from bench.common import summary
from bot.app import build_application
from bot.settings import load_settings
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.server import RunningServer
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import SIGNING_SECRET, block_action, dumps, event_body, mention, signed_headers


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    slack, llm = FakeSlack(), FakeLLM()
    slack_server, llm_server = await RunningServer(slack.app()).start(), await RunningServer(llm.app()).start()
    with tempfile.TemporaryDirectory() as home:
        settings = load_settings(
            env_file=None, bot_home=Path(home), port=0, slack_bot_token="xoxb-bench",
            slack_signing_secret=SIGNING_SECRET,
            slack_api_url=f"{slack_server.url}/api/", llm_base_url=f"{llm_server.url}/v1", llm_model="fake",
            log_level="WARNING",
        )
        app = build_application(settings)
        await app.start()
        url = f"http://127.0.0.1:{app.bound_port}/slack/events"
        approval, baseline = [], []
        async with aiohttp.ClientSession() as http:
            for i in range(args.rounds):
                # Gated: shell_run `true`, approved by the requester.
                llm.then(Reply(tool_calls=[("shell_run", {"command": "true"})]), Reply("done"))
                seen = len(slack.posts())
                body = dumps(event_body(mention(f"gated {i}", channel=f"C{i}")))
                await http.post(url, data=body, headers=signed_headers(body))
                request = (await slack.wait_for("chat.postMessage", seen + 1))[seen]
                request_id = request.params["blocks"][-1]["elements"][0]["value"]
                asked = len(llm.arrivals)
                click = block_action("approval:approve", request_id, user="U1", channel=f"C{i}")
                t0 = time.perf_counter()
                form = "application/x-www-form-urlencoded"
                await http.post(url, data=click, headers=signed_headers(click, content_type=form))
                while len(llm.arrivals) <= asked:  # noqa: ASYNC110 - polling is the measurement's clock
                    await asyncio.sleep(0.0005)
                approval.append(llm.arrivals[asked] - t0)
                await slack.wait_for("chat.postMessage", seen + 2)
                # Safe: time_now, no approval.
                llm.then(Reply(tool_calls=[("time_now", {})]), Reply("done"))
                seen = len(slack.posts())
                first = len(llm.arrivals)
                body = dumps(event_body(mention(f"safe {i}", channel=f"D{i}")))
                await http.post(url, data=body, headers=signed_headers(body))
                await slack.wait_for("chat.postMessage", seen + 1)
                baseline.append(llm.arrivals[first + 1] - llm.arrivals[first])
        await app.stop()
    await slack_server.stop()
    await llm_server.stop()
    ms = lambda xs, q: sorted(xs)[min(len(xs) - 1, round(q * (len(xs) - 1)))] * 1000  # noqa: E731
    print(f"approval-to-resume over {args.rounds} rounds (click received → model asked again with the result)")
    print(f"  approved shell_run: p50 {ms(approval, .5):6.1f} ms  p99 {ms(approval, .99):6.1f} ms")
    print(f"  safe time_now turnaround (baseline): p50 {ms(baseline, .5):6.1f} ms  p99 {ms(baseline, .99):6.1f} ms")
    print(f"  ratio p50: {statistics.median(approval) / statistics.median(baseline):.2f}x")
    summary("approval click to resumed model call, p50", statistics.median(approval) * 1000,
            statistics.median(baseline) * 1000, "ms", "(informative; baseline: a safe tool's turnaround)")


if __name__ == "__main__":
    asyncio.run(main())
