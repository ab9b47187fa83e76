"""Streamed answers in Slack: how soon the first text shows after the model's first token, and how many Slack
calls a 1,000-character answer costs.

The gateway runs as a real process (SLACK_STREAMING on, its default SLACK_STREAM_DELAY_S) against the fake
Slack and a fake model that streams every answer as 1,000 characters in --pieces pieces over --write-s
seconds, as a model writing at its pace does. Mentions are sent one after another (each in its own thread);
for each answer the bench notes when the model sent its first token and when Slack got the answer's first
text (chat.startStream, or the first post), and counts the Slack calls made for that thread.

    python -m bench.streaming --answers 10
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from bench.common import free_port, pct, summary, wait_ready
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.server import RunningServer
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import SIGNING_SECRET, dumps, event_body, mention, signed_headers

ROOT = Path(__file__).resolve().parent.parent
LABEL = re.compile(r"stream (\d+)")
FIRST_TEXT = ("chat.startStream", "chat.postMessage")
ANSWER_METHODS = ("chat.startStream", "chat.appendStream", "chat.stopStream", "chat.postMessage", "chat.update")
SIGN_METHODS = ("assistant.threads.setStatus", "reactions.add", "reactions.remove")


class WritingLLM(FakeLLM):
    """Streams each answer in pieces at a writing pace, noting when each one's first token left."""

    def __init__(self, pieces: int, write_s: float) -> None:
        super().__init__()
        self.text = ("The deploy finished; here is what changed and what to watch. " * 20)[:1000]
        size = len(self.text) // pieces
        self.pieces = [self.text[i:i + size] for i in range(0, len(self.text), size)]
        self.every_s = write_s / max(len(self.pieces) - 1, 1)
        self.first_token: dict[int, float] = {}

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        users = [m.get("content") for m in body.get("messages", []) if m.get("role") == "user"]
        found = LABEL.search(str(users[-1])) if users else None
        self.then(Reply(text=self.text, pieces=self.pieces, every_s=self.every_s))
        if found:  # the first piece goes out as the response starts (no pause before it)
            self.first_token.setdefault(int(found[1]), time.monotonic())
        return await super()._handle(request)


async def measure(args: argparse.Namespace) -> tuple[list[float], list[int], list[int]]:
    slack, llm = FakeSlack(status_supported=True), WritingLLM(args.pieces, args.write_s)
    slack_server = await RunningServer(slack.app()).start()
    llm_server = await RunningServer(llm.app()).start()
    scrub = ("SLACK_", "LLM_", "BOT_", "DATABASE_", "SQLITE_")
    port = free_port()
    with tempfile.TemporaryDirectory() as home:
        env = {k: v for k, v in os.environ.items() if not k.startswith(scrub)} | {
            "SLACK_BOT_TOKEN": "xoxb-bench", "SLACK_SIGNING_SECRET": SIGNING_SECRET,
            "SLACK_API_URL": f"{slack_server.url}/api/", "LLM_BASE_URL": f"{llm_server.url}/v1",
            "LLM_API_KEY": "sk-bench", "LLM_MODEL": "fake", "LOG_LEVEL": "WARNING", "PYTHONPATH": str(ROOT),
            "PORT": str(port), "BOT_HOME": home, "SLACK_STREAMING": "true",
        }
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "bot", "run", env=env, cwd=home,
                                                    stdout=asyncio.subprocess.DEVNULL,
                                                    stderr=asyncio.subprocess.DEVNULL)
        try:
            await wait_ready(port, proc)
            delays, answer_calls, sign_calls = await _answers(port, slack, llm, args.answers)
        finally:
            proc.terminate()
            await proc.wait()
    await slack_server.stop()
    await llm_server.stop()
    return delays, answer_calls, sign_calls


async def _answers(port: int, slack: FakeSlack, llm: WritingLLM,
                   count: int) -> tuple[list[float], list[int], list[int]]:
    delays: list[float] = []
    answer_calls: list[int] = []
    sign_calls: list[int] = []
    async with aiohttp.ClientSession() as http:
        for n in range(-1, count):  # the first (-1) warms up connections and caches
            event = mention(f"stream {n + 1_000_000 if n < 0 else n}")
            body = dumps(event_body(event))
            async with http.post(f"http://127.0.0.1:{port}/slack/events", data=body,
                                 headers=signed_headers(body)) as resp:
                assert resp.status == 200, resp.status
            thread = event["ts"]
            await slack.wait_for("chat.stopStream", n + 2, timeout=60)  # one answer at a time: this one ended
            await asyncio.sleep(0.3)  # the status line's clearing follows the answer
            if n < 0:
                continue
            calls = [c for c in slack.calls if _in(c.params, slack, thread)]
            first = next(c.at for c in calls if c.method in FIRST_TEXT)
            if n == 0:
                _trace(calls, llm.first_token[n])
            delays.append(first - llm.first_token[n])
            answer_calls.append(sum(c.method in ANSWER_METHODS for c in calls))
            sign_calls.append(sum(c.method in SIGN_METHODS for c in calls))
    return delays, answer_calls, sign_calls


def _trace(calls: list[Any], first_token: float) -> None:
    """One answer's Slack calls, in order, timed from the model's first token."""
    print("one answer's Slack calls (ms after the model's first token):")
    for call in calls:
        text = call.params.get("markdown_text") or call.params.get("text") or call.params.get("status") or ""
        extra = " +metadata" if call.params.get("metadata") else ""
        extra += " +blocks" if call.params.get("blocks") else ""
        print(f"  {(call.at - first_token) * 1000:8.0f}  {call.method:<30} {len(str(text)):5d} chars{extra}")


def _in(params: dict[str, object], slack: FakeSlack, thread: str) -> bool:
    """Whether a call was made in ``thread`` (by its thread ts, or the ts of a message in it)."""
    if thread in (params.get("thread_ts"), params.get("timestamp")):
        return True
    ts = params.get("ts")
    return any(m["ts"] == ts and m.get("thread_ts") == thread for m in slack.messages) if ts else False


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--answers", type=int, default=10)
    parser.add_argument("--pieces", type=int, default=50, help="pieces each 1,000-character answer streams in")
    parser.add_argument("--write-s", type=float, default=2.0, help="seconds the model takes to write an answer")
    args = parser.parse_args()
    delays, answer_calls, sign_calls = await measure(args)
    print(f"streamed answers: {args.answers} answers of 1,000 characters, each written over {args.write_s:g} s "
          f"in {args.pieces} pieces (SLACK_STREAM_DELAY_S default)")
    print(f"first streamed text after the first token: p50 {statistics.median(delays) * 1000:.0f} ms, "
          f"p99 {pct(delays, 99) * 1000:.0f} ms")
    print(f"Slack calls per answer: answer {statistics.mean(answer_calls):.1f} "
          f"(start, appends, stop), status {statistics.mean(sign_calls):.1f}")
    summary("first streamed text after the model's first token, p50", statistics.median(delays) * 1000, 500,
            "ms", "<= 500 ms (baseline: the limit)")
    # Baseline: one call per piece the model wrote, the naive stream (plus its start and stop).
    summary("Slack calls per 1,000-character answer (status line included)",
            statistics.mean(answer_calls) + statistics.mean(sign_calls), args.pieces + 2, "calls",
            "(informative: keep it low; baseline: a call per model piece)")


if __name__ == "__main__":
    asyncio.run(main())
