"""Event intake speed (issue 34): from a signed GitHub delivery to its 202, against Slack's events path (a signed
mention to its ack) in the same gateway process and run, both at the same rate while their turns complete.

    python -m bench.event_intake --rate 100 --seconds 10

The gateway runs on the embedded default with one ``[[event_sources]]`` (kind github) posting to a fake Slack
channel, and an instant fake model. First the mentions, then the deliveries (each its own thread, so every one
is a turn), then both are waited for until every one is answered. Prints ack p50/p99/max of each path, and the
ratio of the p99s (target: the delivery's p99 at most 1.5x the mention's).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import hmac
import json
import os
import re
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import free_port, pct, summary
from bench.intake_load import ROOT, TimedLLM, _cpu_s, _start, _stop
from tests.fakes.server import RunningServer
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import SIGNING_SECRET, dumps, event_body, mention, next_ts, signed_headers

LABEL = re.compile(r"load (\d+)")
GITHUB_SECRET = "bench-github-secret-0123456789"
DESTINATION = "#ops"  # a channel the fake Slack knows (COPS)


class ShortLLM(TimedLLM):
    """An instant model whose answer is one short line naming what it answered, for a mention and an event
    alike: what both paths cost is compared, not the length of an echo (an event's rendering is longer)."""

    @staticmethod
    def _echo(body: dict[str, Any]) -> str:
        users = [m for m in body["messages"] if m["role"] == "user"]
        found = LABEL.search(str(users[-1]["content"])) if users else None
        return f"answered {found[0]}" if found else "answered"


def _delivery(i: int) -> tuple[bytes, dict[str, str]]:
    body = json.dumps({"action": "completed", "workflow_run": {
        "name": f"load {i}", "conclusion": "failure", "head_branch": "main", "html_url": f"https://github.test/r/{i}",
        "run_number": i}, "repository": {"full_name": "acme/api"}, "sender": {"login": "octocat"}}).encode()
    signature = "sha256=" + hmac.new(GITHUB_SECRET.encode(), body, hashlib.sha256).hexdigest()
    return body, {"Content-Type": "application/json", "X-GitHub-Event": "workflow_run",
                  "X-GitHub-Delivery": f"{secrets.token_hex(8)}-{i}", "X-Hub-Signature-256": signature}


async def _send(http: aiohttp.ClientSession, base: str, kind: str, rate: float, indexes: range,
                acks: list[float], statuses: dict[int, int], sent: dict[int, float] | None = None) -> None:
    async def one(i: int) -> None:
        if kind == "slack":
            body = dumps(event_body(mention(f"load {i}", channel=f"C{i % 50}", ts=next_ts()),
                                    event_id=f"Ev{secrets.token_hex(4)}.{i}"))
            url, headers = f"{base}/slack/events", signed_headers(body)
            data: bytes | str = body
        else:
            data, headers = _delivery(i)
            url = f"{base}/events/ci"
        start = time.monotonic()
        if sent is not None:
            sent[i] = start
        async with http.post(url, data=data, headers=headers) as resp:
            await resp.read()
            statuses[resp.status] = statuses.get(resp.status, 0) + 1
        acks.append(time.monotonic() - start)

    tasks = []
    t0 = time.monotonic()
    for n, i in enumerate(indexes):
        delay = t0 + n / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)


async def _answered(slack: FakeSlack, wanted: set[int], timeout: float = 180) -> float:
    """Until every one of ``wanted`` has its answer posted; when the last was."""
    async with asyncio.timeout(timeout):
        while True:
            posted = {int(m[1]): c.at for c in slack.of("chat.postMessage")
                      if (m := LABEL.search(c.params.get("text") or ""))}
            if wanted <= set(posted):
                return max(posted[i] for i in wanted)
            await asyncio.sleep(0.05)


def _latencies(slack: FakeSlack, llm: TimedLLM, sent: dict[int, float]) -> tuple[float, float]:
    """p50 of sent → model request, and of model answer → Slack post."""
    posted: dict[int, float] = {}
    for call in slack.of("chat.postMessage"):
        if (m := LABEL.search(call.params.get("text") or "")) and int(m[1]) in sent:
            posted.setdefault(int(m[1]), call.at)
    to_model = [llm.asked[i] - t for i, t in sent.items() if i in llm.asked]
    to_post = [posted[i] - llm.answered[i] for i in sent if i in posted and i in llm.answered]
    return statistics.median(to_model), statistics.median(to_post)


async def measure(rate: float, seconds: float) -> dict[str, list[float]]:
    slack, llm = FakeSlack(), ShortLLM()
    slack_server = await RunningServer(slack.app()).start()
    llm_server = await RunningServer(llm.app()).start()
    count = int(rate * seconds)
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        (home / "bot.toml").write_text(
            f'[[event_sources]]\nname = "ci"\nkind = "github"\nsecret_env = "BENCH_GITHUB_SECRET"\n'
            f'destination = "{DESTINATION}"\nrate_per_minute = {count * 4}\n')
        scrub = ("SLACK_", "LLM_", "BOT_", "DATABASE_", "SQLITE_")
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(scrub)} | {
            "SLACK_BOT_TOKEN": "xoxb-bench", "SLACK_SIGNING_SECRET": SIGNING_SECRET,
            "SLACK_API_URL": f"{slack_server.url}/api/", "LLM_BASE_URL": f"{llm_server.url}/v1",
            "LLM_API_KEY": "sk-bench", "LLM_MODEL": "fake", "LOG_LEVEL": "WARNING", "PYTHONPATH": str(ROOT),
            "PORT": str(port), "BOT_HOME": str(home), "BENCH_GITHUB_SECRET": GITHUB_SECRET,
        }
        proc = await _start([sys.executable, "-m", "bot", "run"], env, home, home / "output.log")
        base = f"http://127.0.0.1:{port}"
        try:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                             timeout=aiohttp.ClientTimeout(total=60)) as http:
                offset = 0
                for kind in ("slack", "events"):  # a few of each first: connections and caches warm
                    await _send(http, base, kind, 50, range(1_000_000 + offset, 1_000_000 + offset + 10), [], {})
                    offset += 10
                await _answered(slack, set(range(1_000_000, 1_000_000 + offset)))
                gc.collect()
                gc.freeze()
                for kind in ("slack", "events"):
                    acks: list[float] = []
                    statuses: dict[int, int] = {}
                    indexes = range(offset, offset + count)
                    cpu_before = _cpu_s(proc.pid)
                    t0 = time.monotonic()
                    sent: dict[int, float] = {}
                    await _send(http, base, kind, rate, indexes, acks, statuses, sent)
                    done = await _answered(slack, set(indexes)) - t0
                    cpu = _cpu_s(proc.pid) - cpu_before
                    print(f"  {kind}: {cpu * 1000 / count:.1f} ms of CPU each", file=sys.stderr)
                    to_model, to_post = _latencies(slack, llm, sent)
                    print(f"  {kind}: sent → model request p50 {to_model * 1000:.1f} ms, model answer → Slack post "
                          f"p50 {to_post * 1000:.1f} ms", file=sys.stderr)
                    wanted = 200 if kind == "slack" else 202
                    if set(statuses) != {wanted}:
                        print(f"  {kind}: unexpected answers {statuses}", file=sys.stderr)
                    print(f"  {kind}: all {count} answered {done:.2f} s after the first was sent", file=sys.stderr)
                    results[kind] = acks
                    offset += count
        except BaseException:
            print((home / "output.log").read_text()[-3000:], file=sys.stderr)
            raise
        finally:
            await _stop(proc)
            problems = [line for line in (home / "output.log").read_text().splitlines()
                        if " WARNING " in line or " ERROR " in line]
            if problems:  # what the gateway complained of (a figure measured through errors means little)
                print(f"  the gateway logged {len(problems)} warning(s)/error(s), e.g.:", *problems[:5],
                      sep="\n    ", file=sys.stderr)
    await slack_server.stop()
    await llm_server.stop()
    return results


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=100)
    parser.add_argument("--seconds", type=float, default=10)
    args = parser.parse_args()
    results = await measure(args.rate, args.seconds)
    print(f"event intake: {int(args.rate * args.seconds)} signed GitHub deliveries at {args.rate:g}/s against as many "
          "signed Slack mentions, one gateway process (SQLite), turns completing meanwhile")
    print(f"{'path':<28} {'p50':>8} {'p99':>8} {'max':>8}  (ms)")
    for label, acks in (("Slack mention → ack", results["slack"]), ("GitHub delivery → 202", results["events"])):
        print(f"{label:<28} {statistics.median(acks) * 1000:8.1f} {pct(acks, 99) * 1000:8.1f} {max(acks) * 1000:8.1f}")
    summary(f"delivery → 202 p99 at {args.rate:g}/s (vs Slack's events path)", pct(results["events"], 99) * 1000,
            pct(results["slack"], 99) * 1000, "ms", "<= 1.5x")


if __name__ == "__main__":
    asyncio.run(main())
