"""Resident memory of `bot run` with 10,000 idle sessions in the database vs an empty one (SPEC §15:
≤ 1.05x — sessions live in the database, not in memory).

    python -m bench.memory --sessions 10000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import aiohttp

from bench.common import running_bot, summary
from core.store import Database


async def _prepare(home: Path, sessions: int) -> None:
    db = Database(f"sqlite:///{home / 'bot.db'}")
    await db.migrate()
    await db.close()
    now = datetime.now(UTC).replace(tzinfo=None).isoformat(sep=" ")
    con = sqlite3.connect(home / "bot.db")
    with con:
        for i in range(sessions):
            sid = f"slack:T1:C1:{i}.0"
            con.execute("INSERT INTO sessions (id, channel, agent, status, reply_ref, created_at, updated_at) "
                        "VALUES (?, 'slack', 'default', 'idle', ?, ?, ?)",
                        (sid, json.dumps({"channel": "C1", "thread_ts": f"{i}.0"}), now, now))
            for role, text in (("user", f"question {i}"), ("assistant", f"answer {i}")):
                con.execute("INSERT INTO messages (session_id, role, content, created_at) VALUES (?, ?, ?, ?)",
                            (sid, role, text, now))
    con.close()


async def _rss_kib(home: Path) -> int:
    async with running_bot(home) as (proc, port), aiohttp.ClientSession() as http:
        for _ in range(3):  # touch the pages a person would open: the conversation list
            await (await http.get(f"http://127.0.0.1:{port}/api/conversations")).read()
        await asyncio.sleep(1)
        status = Path(f"/proc/{proc.pid}/status").read_text()  # noqa: ASYNC240 - /proc, instant
        return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=10000)
    args = parser.parse_args()
    figures = {}
    for count in (0, args.sessions):
        with tempfile.TemporaryDirectory() as tmp:
            await _prepare(Path(tmp), count)
            figures[count] = await _rss_kib(Path(tmp))
    print(f"resident memory after start (VmRSS): empty {figures[0] / 1024:.1f} MiB, "
          f"{args.sessions} idle sessions {figures[args.sessions] / 1024:.1f} MiB")
    summary(f"resident memory with {args.sessions} idle sessions", figures[args.sessions] / 1024, figures[0] / 1024,
            "MiB", "<= 1.05x")


if __name__ == "__main__":
    asyncio.run(main())
