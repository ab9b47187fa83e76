"""Ack latency of signed mentions while the model is slow: the gateway vs a bare slack-bolt app.

Both run as real processes against the same fake Slack and fake model (which takes --model-delay
seconds per answer). Mentions are sent at --rate per second for --seconds; every ack is timed.

    python -m bench.ack_latency --rate 50 --seconds 10 --model-delay 10
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from bench.common import free_port, pct, summary, wait_ready
from tests.fakes.llm import FakeLLM
from tests.fakes.server import RunningServer
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import SIGNING_SECRET, dumps, event_body, mention, signed_headers

ROOT = Path(__file__).resolve().parent.parent


async def _start(argv: list[str], env: dict[str, str], cwd: Path) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(*argv, env=env, cwd=cwd, stdout=asyncio.subprocess.DEVNULL,
                                                stderr=asyncio.subprocess.DEVNULL)
    # The gateway answers 503 until recovery is done: its load starts once /readyz says so.
    await wait_ready(int(env["PORT"]), proc, "/readyz" if "bot" in argv else "/healthz")
    return proc


async def _load(port: int, rate: float, seconds: float, label: str) -> list[float]:
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    url = f"http://127.0.0.1:{port}/slack/events"
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:

        async def one(i: int) -> None:
            body = dumps(event_body(mention(f"{label} {i}", channel=f"C{i % 50}")))
            headers = signed_headers(body)
            start = time.perf_counter()
            async with http.post(url, data=body, headers=headers) as resp:
                await resp.read()
                statuses[resp.status] = statuses.get(resp.status, 0) + 1
            latencies.append(time.perf_counter() - start)

        tasks = []
        total = int(rate * seconds) if rate else int(seconds)
        t0 = time.perf_counter()
        for i in range(total):
            delay = t0 + i / rate - time.perf_counter() if rate else 0
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)
    if set(statuses) != {200}:
        print(f"  {label}: non-200 answers: {statuses}", file=sys.stderr)
    return latencies


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rate", type=float, default=50)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--model-delay", type=float, default=10)
    parser.add_argument("--burst", type=int, default=0, help="send this many at once instead of at --rate")
    parser.add_argument("--noop-baseline", action="store_true", help="the bare app only acknowledges")
    args = parser.parse_args()

    slack, llm = FakeSlack(), FakeLLM(delay_s=args.model_delay)
    slack_server = await RunningServer(slack.app()).start()
    llm_server = await RunningServer(llm.app()).start()
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK_", "LLM_", "BOT_", "DATABASE_"))}
    env = base_env | {
        "SLACK_BOT_TOKEN": "xoxb-bench", "SLACK_SIGNING_SECRET": SIGNING_SECRET,
        "SLACK_API_URL": f"{slack_server.url}/api/", "LLM_BASE_URL": f"{llm_server.url}/v1",
        "LLM_API_KEY": "sk-bench", "LLM_MODEL": "fake", "LOG_LEVEL": "WARNING",
    }
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as home:
        for label, argv in (
            ("bare slack-bolt", [sys.executable, "-m", "bench.baseline_app"]),
            ("gateway", [sys.executable, "-m", "bot", "run"]),
        ):
            port = free_port()
            cwd = ROOT if label != "gateway" else Path(home)
            extra = {"BASELINE_NOOP": "1"} if args.noop_baseline else {}
            proc = await _start(argv, env | extra | {"PORT": str(port), "PYTHONPATH": str(ROOT)}, cwd)
            try:
                if args.burst:
                    results[label] = await _load(port, 0, args.burst, label)
                else:
                    results[label] = await _load(port, args.rate, args.seconds, label)
            finally:
                proc.terminate()
                try:
                    await asyncio.wait_for(proc.wait(), 5)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
    await slack_server.stop()
    await llm_server.stop()

    load = f"a burst of {args.burst}" if args.burst else f"{int(args.rate * args.seconds)} at {args.rate:g}/s"
    baseline = "acks only" if args.noop_baseline else "acks, calls the model, posts"
    print(f"ack latency, {load} signed mentions, model takes {args.model_delay:g} s per answer; "
          f"bare app: {baseline}")
    print(f"{'app':<16} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for label, values in results.items():
        print(f"{label:<16} {statistics.median(values) * 1000:8.1f} {pct(values, 99) * 1000:8.1f} "
              f"{max(values) * 1000:8.1f}")
    base, ours = results["bare slack-bolt"], results["gateway"]
    print(f"ratio gateway/bare: p50 {statistics.median(ours) / statistics.median(base):.2f}x, "
          f"p99 {pct(ours, 99) / pct(base, 99):.2f}x")
    name = f"ack p99, burst of {args.burst}" if args.burst else f"ack p99 at {args.rate:g}/s"
    summary(name, pct(ours, 99) * 1000, pct(base, 99) * 1000, "ms", "<= 1.5x; every ack < 3 s")
    summary(name.replace("p99", "p50"), statistics.median(ours) * 1000, statistics.median(base) * 1000, "ms",
            "(informative)")
    print(f"slowest ack: {max(ours) * 1000:.0f} ms (Slack's limit: 3000 ms)")


if __name__ == "__main__":
    asyncio.run(main())
