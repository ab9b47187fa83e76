"""Realistic intake load (SPEC §15): signed mentions arrive while turns complete, the gateway vs a bare
slack-bolt app in the same run, against the same fake Slack and an instant fake model.

    python -m bench.intake_load --rate 100 --seconds 10          # sustained load
    python -m bench.intake_load --burst 200                      # all at once
    python -m bench.intake_load --rate 10 --seconds 10 --signs --model-delay 0.5   # first visible sign
    python -m bench.intake_load --rate 100 --seconds 10 --database-url postgresql://... --replicas 2
    python -m bench.intake_load --rate 100 --seconds 10 --context   # also a gateway with 50 skills and pinned memories

Every mention opens its own thread (its own session). For each app it prints: the time until every
mention is answered, ack p50/p99/max, event → model request p50, model answer → Slack post p50 and,
for the gateway, the first visible sign (a reaction or a thread status) p99.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import gc
import os
import re
import secrets
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from bench import statement_count
from bench.common import free_port, pct, summary, wait_ready
from tests.fakes.llm import FakeLLM
from tests.fakes.server import RunningServer
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import SIGNING_SECRET, dumps, event_body, mention, next_ts, signed_headers

ROOT = Path(__file__).resolve().parent.parent
LABEL = re.compile(r"load (\d+)")
SIGN_METHODS = ("reactions.add", "assistant.threads.setStatus")
RUN = secrets.token_hex(4)


class TimedLLM(FakeLLM):
    """The fake model, noting when each mention's request arrived and when its answer left; it answers
    at once, or after ``delay`` seconds (turns that outlast the progress sign's delay)."""

    def __init__(self, delay: float = 0.0) -> None:
        super().__init__()
        self.delay = delay
        self.asked: dict[int, float] = {}
        self.answered: dict[int, float] = {}

    async def _handle(self, request: web.Request) -> web.Response:
        arrived = time.monotonic()
        body = await request.json()
        users = [m.get("content") for m in body.get("messages", []) if m.get("role") == "user"]
        found = LABEL.search(str(users[-1])) if users else None
        if self.delay:
            await asyncio.sleep(self.delay)
        response = await super()._handle(request)
        if found:
            self.asked.setdefault(int(found[1]), arrived)
            self.answered.setdefault(int(found[1]), time.monotonic())
        return response


@dataclass
class Run:
    sent: dict[int, float] = field(default_factory=dict)  # mention → when its request left
    acks: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    ts_of: dict[str, int] = field(default_factory=dict)  # message ts → mention
    done_s: float = 0.0  # first send → last answer posted


async def _load(ports: list[int], rate: float, count: int, slack: FakeSlack, offset: int) -> Run:
    run = Run()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as http:

        async def one(i: int) -> None:
            ts = next_ts()
            run.ts_of[ts] = i
            # Event ids unique to this run: a database kept from an earlier run would take them as redeliveries.
            body = dumps(event_body(mention(f"load {i}", channel=f"C{i % 50}", ts=ts), event_id=f"Ev{RUN}.{i}"))
            url = f"http://127.0.0.1:{ports[i % len(ports)]}/slack/events"
            start = time.monotonic()
            run.sent[i] = start
            async with http.post(url, data=body, headers=signed_headers(body)) as resp:
                await resp.read()
                run.statuses[resp.status] = run.statuses.get(resp.status, 0) + 1
            run.acks.append(time.monotonic() - start)

        tasks = []
        t0 = time.monotonic()
        for n in range(count):
            if rate:
                delay = t0 + n / rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(offset + n)))
        await asyncio.gather(*tasks)
        wanted = set(range(offset, offset + count))
        if set(run.statuses) != {200}:
            print(f"  non-200 acks: {run.statuses}", file=sys.stderr)
        async with asyncio.timeout(120):
            while True:
                answered = {int(m[1]) for c in slack.of("chat.postMessage")
                            if (m := LABEL.search(c.params.get("text") or ""))}
                if wanted <= answered:
                    break
                await asyncio.sleep(0.02)
        last = max(c.at for c in slack.of("chat.postMessage")
                   if (m := LABEL.search(c.params.get("text") or "")) and int(m[1]) in wanted)
        run.done_s = last - t0
    return run


@dataclass
class Figures:
    done_s: float
    ack_p50: float
    ack_p99: float
    ack_max: float
    to_model: float
    to_post: float
    sign_p99: float


def _figures(run: Run, slack: FakeSlack, llm: TimedLLM) -> Figures:
    posted: dict[int, float] = {}
    for call in slack.of("chat.postMessage"):
        found = LABEL.search(call.params.get("text") or "")
        if found and int(found[1]) in run.sent:
            posted.setdefault(int(found[1]), call.at)
    signs = dict(posted)  # an answer is a sign too (a quick one shows no reaction)
    for call in slack.calls:
        if call.method in SIGN_METHODS:
            i = run.ts_of.get(str(call.params.get("timestamp") or call.params.get("thread_ts")))
            if i is not None:
                signs[i] = min(call.at, signs.get(i, call.at))
    to_model = [llm.asked[i] - t for i, t in run.sent.items() if i in llm.asked]
    to_post = [posted[i] - llm.answered[i] for i in run.sent if i in posted and i in llm.answered]
    sign = [signs[i] - t for i, t in run.sent.items() if i in signs]
    return Figures(run.done_s, statistics.median(run.acks), pct(run.acks, 99), max(run.acks),
                   statistics.median(to_model), statistics.median(to_post), pct(sign, 99))


async def _start(argv: list[str], env: dict[str, str], cwd: Path, log: Path, *,
                 ready: str) -> asyncio.subprocess.Process:
    with log.open("wb") as out:  # the app's own errors, if the bench fails
        proc = await asyncio.create_subprocess_exec(*argv, env=env, cwd=cwd, stdout=out, stderr=out)
    await wait_ready(int(env["PORT"]), proc, ready)
    return proc


async def _settled(files: list[Path]) -> Counter[str]:
    """The gateways' round trips so far, once their counts stop moving (the last turns' deliveries written), or
    after 3 s (replicas' lease sweeps never stop)."""
    last: Counter[str] | None = None
    for _ in range(12):
        await asyncio.sleep(statement_count.WRITE_EVERY_S + 0.05)
        now = sum((statement_count.read(f) for f in files), Counter())
        if now == last:
            break
        last = now
    return now


def _print_statements(label: str, counts: Counter[str], mentions: int, top: int) -> float:
    """Round trips per mention, and the statements that make them, most first (on stderr)."""
    per = statement_count.round_trips(counts) / mentions
    print(f"  {label}: {per:.1f} database round trips per mention", file=sys.stderr)
    for key, n in [(k, n) for k, n in counts.most_common() if not k.startswith("TX ")][:top]:
        print(f"    {n / mentions:6.2f}  {key}", file=sys.stderr)
    print(f"  {label}: its transactions (PostgreSQL), per mention", file=sys.stderr)
    for key, n in [(k, n) for k, n in counts.most_common() if k.startswith("TX ")][:top]:
        print(f"    {n / mentions:6.2f}  {key[3:]}", file=sys.stderr)
    return per


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if os.environ.get("BENCH_PROFILE"):  # py-spy writes its profile on ^C; its child is stopped first
        for child in _children(proc.pid):
            os.kill(child, signal.SIGTERM)
        await asyncio.sleep(2)
        with contextlib.suppress(ProcessLookupError):  # py-spy may already have ended with its child
            proc.send_signal(signal.SIGINT)
    else:
        proc.terminate()
    try:
        await asyncio.wait_for(proc.wait(), 30)
    except TimeoutError:
        proc.kill()
        await proc.wait()


async def measure(args: argparse.Namespace) -> tuple[dict[str, Figures], dict[str, float]]:
    slack, llm = FakeSlack(), TimedLLM(args.model_delay)
    slack_server = await RunningServer(slack.app()).start()
    llm_server = await RunningServer(llm.app()).start()
    scrub = ("SLACK_", "LLM_", "BOT_", "DATABASE_", "SQLITE_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(scrub)} | {
        "SLACK_BOT_TOKEN": "xoxb-bench", "SLACK_SIGNING_SECRET": SIGNING_SECRET,
        "SLACK_API_URL": f"{slack_server.url}/api/", "LLM_BASE_URL": f"{llm_server.url}/v1",
        "LLM_API_KEY": "sk-bench", "LLM_MODEL": "fake", "LOG_LEVEL": "WARNING", "PYTHONPATH": str(ROOT),
    }
    count = args.burst or int(args.rate * args.seconds)
    results: dict[str, Figures] = {}
    round_trips: dict[str, float] = {}
    offset = 0
    with tempfile.TemporaryDirectory() as tmp:
        apps: list[tuple[str, list[list[str]], dict[str, str]]] = [
            ("bare slack-bolt", [[sys.executable, "-m", "bench.baseline_app"]], {}),
        ]
        gateway_env = {"DATABASE_URL": args.database_url} if args.database_url else {}
        if args.database_url:  # replicas share their keys (README: several replicas)
            gateway_env["BOT_SECRET_KEYS"] = f"k1:{base64.b64encode(os.urandom(32)).decode()}"
        if args.sqlite_synchronous:
            gateway_env["SQLITE_SYNCHRONOUS"] = args.sqlite_synchronous
        if args.progress_delay is not None:
            gateway_env["SLACK_PROGRESS_DELAY_S"] = str(args.progress_delay)
        # `bot run` with its database round trips counted (bench.statement_count). On SQLite the count hooks every
        # statement in the process (SQLAlchemy's events, a writer thread), which costs the latencies measured beside
        # it: there it is taken only when asked (--count-statements); PostgreSQL's hooks sit on asyncpg's calls.
        counting = bool(args.database_url) or args.count_statements
        gateway = [sys.executable, "-m", "bench.statement_count" if counting else "bot", "run"]
        if os.environ.get("BENCH_PROFILE"):  # py-spy's collapsed stacks of the (first) gateway, for profiling
            gateway = ["py-spy", "record", "--gil", "--format", "raw", "-r", "200", "-o", os.environ["BENCH_PROFILE"],
                       "--", *gateway]
        apps.append(("gateway", [gateway] * args.replicas, gateway_env))
        if args.context:  # the same gateway, its prompts carrying a catalog of 50 skills and pinned memories
            skills = _skill_catalog(Path(tmp) / "skills", 50)
            apps.append((CONTEXT, [gateway] * args.replicas, gateway_env | {"SKILLS_DIR": str(skills)}))
        for index, (label, argvs, extra) in enumerate(apps):
            procs, ports, counted = [], [], []
            for n, argv in enumerate(argvs):
                home = Path(tmp) / f"{label.split()[0]}-{index}-{n}"
                home.mkdir()
                if label == CONTEXT and n == 0:
                    await _pin_memories(args.database_url or f"sqlite:///{home / 'bot.db'}", 20)
                port = free_port()
                gateway_app = label.startswith("gateway")
                own = {"PORT": str(port), "BOT_HOME": str(home)}
                if gateway_app and counting:
                    own["BENCH_STATEMENTS"] = str(home / "statements.json")
                    counted.append(home / "statements.json")
                procs.append(await _start(argv, env | extra | own, home if gateway_app else ROOT,
                                          home / "output.log", ready="/readyz" if gateway_app else "/healthz"))
                ports.append(port)
            try:
                await _warm_up(ports, slack, offset + 1_000_000)
                trips_before = await _settled(counted) if counted else Counter[str]()
                calls_before = len(slack.calls)
                cpu_before = sum(_cpu_s(proc.pid) for proc in procs)
                gc.collect()  # the harness's own full collections would stop its clock for either app
                gc.freeze()
                run = await _load(ports, 0 if args.burst else args.rate, count, slack, offset)
                cpu = sum(_cpu_s(proc.pid) for proc in procs) - cpu_before
                print(f"  {label}: {cpu * 1000 / count:.1f} ms of CPU per mention", file=sys.stderr)
                if counted:
                    trips = await _settled(counted)
                    trips.subtract(trips_before)
                    round_trips[label] = _print_statements(label, +trips, count, args.statements)
                if set(run.statuses) != {200}:
                    print(f"  {label}: non-200 answers: {run.statuses}", file=sys.stderr)
                results[label] = _figures(run, _Since(slack, calls_before), llm)  # type: ignore[arg-type]
            except BaseException:
                _print_logs(Path(tmp))
                raise
            finally:
                for proc in procs:
                    await _stop(proc)
            offset += count
    await slack_server.stop()
    await llm_server.stop()
    return results, round_trips


CONTEXT = "gateway, 50 skills + 20 pinned memories"


def _skill_catalog(folder: Path, count: int) -> Path:
    """``count`` skills of the Agent Skills format, each with a description of about 200 characters."""
    for n in range(count):
        (folder / f"runbook-{n:02}").mkdir(parents=True)
        (folder / f"runbook-{n:02}" / "SKILL.md").write_text(
            f"---\nname: runbook-{n:02}\ndescription: How the team handles incident kind {n} - check the dashboards, "
            "drain the affected service, restart it with the blue-green flag and confirm /healthz before saying "
            "it is done.\n---\n# Runbook\n1. Drain.\n2. Restart.\n3. Check.\n")
    return folder


async def _pin_memories(url: str, count: int) -> None:
    """``count`` pinned memories of the default agent, about 150 characters each, in the gateway's database."""
    from datetime import UTC, datetime

    from core.store import Database
    from core.store.memories import MemoryStore, NewMemory

    db = Database(url)
    try:
        await db.migrate()
        store = MemoryStore(db)
        for n in range(count):
            text = (f"Note {n}: staging deploys of service {n} need the blue-green flag, and the on-call for it is "
                    "reached through the ops rota; never restart it during the nightly backup window.")
            await store.add(NewMemory("default", text, pinned=True, written_by="U1"), max_items=1000,
                            now=datetime.now(UTC), actor="U1")
    finally:
        await db.close()


def _print_logs(tmp: Path) -> None:
    """The apps' own output, when a run fails."""
    for log in tmp.glob("*/output.log"):
        print(f"--- {log}:\n{log.read_text()[-3000:]}", file=sys.stderr)


def _children(pid: int) -> list[int]:
    return [int(child) for task in Path(f"/proc/{pid}/task").glob("*/children") for child in task.read_text().split()]


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its children (py-spy's child when profiling)."""
    total = sum(_cpu_s(child) for child in _children(pid))
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return total + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Since:
    """The fake Slack's calls from one index on (each app's own)."""

    def __init__(self, slack: FakeSlack, start: int) -> None:
        self.calls = slack.calls[start:]

    def of(self, method: str) -> list[Any]:
        return [c for c in self.calls if c.method == method]


async def _warm_up(ports: list[int], slack: FakeSlack, offset: int) -> None:
    """A few mentions first, so both apps have their connections and caches warm."""
    await _load(ports, 50, 10 * len(ports), slack, offset)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=100)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--burst", type=int, default=0, help="send this many at once instead of at --rate")
    parser.add_argument("--signs", action="store_true", help="report the first visible sign (p99)")
    parser.add_argument("--model-delay", type=float, default=0.0, help="seconds the model takes per answer")
    parser.add_argument("--database-url", default="", help="run the gateway on this database (e.g. PostgreSQL)")
    parser.add_argument("--replicas", type=int, default=1, help="gateway processes sharing --database-url")
    parser.add_argument("--sqlite-synchronous", default="", help="SQLITE_SYNCHRONOUS for the gateway")
    parser.add_argument("--context", action="store_true",
                        help="also run the gateway with 50 skills and 20 pinned memories in every prompt (issue 36)")
    parser.add_argument("--count-statements", action="store_true",
                        help="count the round trips on SQLite too (always on PostgreSQL; it slows SQLite's figures)")
    parser.add_argument("--statements", type=int, default=25,
                        help="list this many of the gateway's statements, most round trips per mention first")
    parser.add_argument("--progress-delay", type=float, default=None,
                        help="SLACK_PROGRESS_DELAY_S for the gateway (0: every turn shows and clears its reaction)")
    args = parser.parse_args()
    if args.replicas > 1 and not args.database_url.startswith("postgresql"):
        parser.error("--replicas needs a PostgreSQL --database-url")
    results, round_trips = await measure(args)

    load = f"a burst of {args.burst}" if args.burst else f"{int(args.rate * args.seconds)} at {args.rate:g}/s"
    backend = "PostgreSQL" if args.database_url.startswith("postgresql") else "SQLite"
    where = f"{backend}, {args.replicas} replicas" if args.replicas > 1 else backend
    model = f"model answering after {args.model_delay:g} s" if args.model_delay else "instant model"
    print(f"intake load: {load} signed mentions, {model}, turns completing while mentions arrive ({where})")
    print(f"{'app':<16} {'all answered s':>15} {'ack p50':>8} {'ack p99':>8} {'ack max':>8} {'→model':>7} "
          f"{'→post':>7} {'sign p99':>9}  (ms unless s)")
    for label, f in results.items():
        print(f"{label:<16} {f.done_s:15.2f} {f.ack_p50 * 1000:8.1f} {f.ack_p99 * 1000:8.1f} {f.ack_max * 1000:8.1f} "
              f"{f.to_model * 1000:7.1f} {f.to_post * 1000:7.1f} {f.sign_p99 * 1000:9.1f}")
    base, ours = results["bare slack-bolt"], results["gateway"]
    tag = f" ({where})" if where != "SQLite" else ""
    if args.progress_delay == 0:
        tag += " (a reaction on every turn)"
    if args.signs:
        summary(f"first visible sign p99 at {args.rate:g}/s{tag}", ours.sign_p99 * 1000, 300, "ms",
                "<= 300 ms (baseline: the limit)")
        return
    if args.burst:
        target = "<= 1.5x" if args.burst <= 200 else "every ack < 3 s"
        summary(f"ack p99, burst of {args.burst}{tag}", ours.ack_p99 * 1000, base.ack_p99 * 1000, "ms", target)
        print(f"slowest ack: {ours.ack_max * 1000:.0f} ms (Slack's limit: 3000 ms)")
        return
    if args.context:  # the ratios with the larger prompts against those without, measured in this one run
        ctx = results[CONTEXT]
        for name, plain, loaded in (("all answered", ours.done_s / base.done_s, ctx.done_s / base.done_s),
                                    ("ack p99", ours.ack_p99 / base.ack_p99, ctx.ack_p99 / base.ack_p99),
                                    ("event → model request p50", ours.to_model / base.to_model,
                                     ctx.to_model / base.to_model),
                                    ("model answer → Slack post p50", ours.to_post / base.to_post,
                                     ctx.to_post / base.to_post)):
            print(f"SUMMARY\t{name}: ratio to bare bolt, 50 skills + 20 pinned memories vs none{tag}\t{loaded:.2f}x\t"
                  f"{plain:.2f}x\t{loaded / plain:.2f}x\t<= 1.10x (the ratio moves 10% at most)", flush=True)
    summary(f"{load}: all answered{tag}", ours.done_s, base.done_s, "s", "<= 1.15x")
    if "gateway" in round_trips:  # the aim is SPEC §15's for PostgreSQL; on SQLite none is a network round trip
        summary(f"database round trips per mention{tag}", round_trips["gateway"], 12, "trips",
                "<= 12 (baseline: the aim)" if backend == "PostgreSQL" else "(informative: in-process on SQLite)")
    summary(f"ack p99 at {args.rate:g}/s{tag}", ours.ack_p99 * 1000, base.ack_p99 * 1000, "ms", "<= 3x; < 3 s")
    summary(f"event → model request p50{tag}", ours.to_model * 1000, base.to_model * 1000, "ms", "<= 2x")
    summary(f"model answer → Slack post p50{tag}", ours.to_post * 1000, base.to_post * 1000, "ms", "<= 2x")
    print(f"slowest ack: {ours.ack_max * 1000:.0f} ms (Slack's limit: 3000 ms)")


if __name__ == "__main__":
    asyncio.run(main())
