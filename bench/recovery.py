"""Start-up time with many parked approvals (SPEC §15: ≤ 1.5x an empty start). The database is
filled directly with N sessions whose turn was parked on an approval when the process died; the
figure is the time from starting `bot run` until /readyz answers 200 (recovery done, channels up).

    python -m bench.recovery --parked 1000 10000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench.common import running_bot, summary
from core.store import Database


async def _prepare(home: Path, parked: int) -> None:
    db = Database(f"sqlite:///{home / 'bot.db'}")
    await db.migrate()
    await db.close()
    now = datetime.now(UTC).replace(tzinfo=None).isoformat(sep=" ")
    later = (datetime.now(UTC) + timedelta(hours=1)).replace(tzinfo=None).isoformat(sep=" ")
    con = sqlite3.connect(home / "bot.db")
    with con:
        for i in range(parked):
            sid = f"slack:T1:C1:{i}.0"
            con.execute("INSERT INTO sessions (id, channel, agent, status, reply_ref, created_at, updated_at) "
                        "VALUES (?, 'slack', 'default', 'pending_approval', ?, ?, ?)",
                        (sid, json.dumps({"channel": "C1", "thread_ts": f"{i}.0"}), now, now))
            turn = con.execute("INSERT INTO turns (session_id, agent, status, attempts, created_at, started_at) "
                               "VALUES (?, 'default', 'running', 1, ?, ?)", (sid, now, now)).lastrowid
            con.execute("INSERT INTO messages (session_id, role, content, created_at, turn_id) "
                        "VALUES (?, 'user', 'run it', ?, ?)", (sid, now, turn))
            call = json.dumps([{"id": f"c{i}", "name": "shell_run", "arguments": '{"command": "uptime"}'}])
            con.execute("INSERT INTO messages (session_id, role, content, tool_calls, created_at, turn_id) "
                        "VALUES (?, 'assistant', '', ?, ?, ?)", (sid, call, now, turn))
            con.execute("INSERT INTO approvals (session_id, turn_id, tool_call_id, tool, arguments, agent, requester, "
                        "risk, status, parked_at, expires_at, always) VALUES (?, ?, ?, 'shell_run', "
                        "'{\"command\": \"uptime\"}', 'default', 'U1', 'gated', 'pending', ?, ?, 0)",
                        (sid, turn, f"c{i}", now, later))
    con.close()


async def _start_time(home: Path) -> float:
    t0 = time.perf_counter()
    async with running_bot(home):
        return time.perf_counter() - t0


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--parked", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    results: dict[int, float] = {}
    for parked in [0, *args.parked]:
        times = []
        for _ in range(args.rounds):
            with tempfile.TemporaryDirectory() as tmp:
                home = Path(tmp)
                await _prepare(home, parked)
                times.append(await _start_time(home))
        results[parked] = statistics.median(times)
    print(f"start-up until /readyz (median of {args.rounds}), SQLite")
    for parked, seconds in results.items():
        ratio = seconds / results[0]
        print(f"  {parked:>6} parked approvals: {seconds * 1000:7.0f} ms   ratio vs empty {ratio:.2f}x")
        if parked:
            summary(f"start-up with {parked} parked approvals", seconds * 1000, results[0] * 1000, "ms", "<= 1.5x")


if __name__ == "__main__":
    asyncio.run(main())
