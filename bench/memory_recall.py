"""``recall`` over many memories (issue 36): the word search's latency on SQLite (FTS5) and PostgreSQL (tsvector, GIN).

    python -m bench.memory_recall --memories 10000
    python -m bench.memory_recall --memories 10000 --database-url postgresql://user:pass@host/db  # and PostgreSQL

One agent holds ``--memories`` notes of 8 to 40 words drawn from a 3,000-word vocabulary whose words are used as
unevenly as in prose (a few very common, most rare). Then ``--queries`` recalls of 1 to 3 such words each (limit
10, the tool's default), one after another, through the store the tool uses, with a primary-key read of one memory
as the baseline in the same run. Prints p50 and p99 of each; there is no target ratio (the issue asks for the
figures). On PostgreSQL the agent's rows are written under a fresh agent name and deleted afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import secrets
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import delete, insert
from sqlmodel import Session

from bench.common import pct, summary
from core.store import Database
from core.store.memories import MemoryStore, memories

VOCABULARY = 3_000


def _words(rng: random.Random) -> list[str]:
    """The vocabulary, and a sampler that favours its first words (Zipf-like, as in prose)."""
    syllables = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "de", "pa", "gu", "zo", "ber", "tan", "ix"]
    words: list[str] = []
    while len(words) < VOCABULARY:
        word = "".join(rng.choice(syllables) for _ in range(rng.randint(2, 4)))
        if word not in words:
            words.append(word)
    return words


def _pick(rng: random.Random, words: list[str]) -> str:
    return words[min(int(rng.paretovariate(1.1)) - 1, len(words) - 1)] if rng.random() < 0.5 else rng.choice(words)


async def _fill(db: Database, agent: str, count: int, words: list[str], rng: random.Random) -> None:
    now = datetime.now(UTC)
    rows = [{"agent": agent, "text": " ".join(_pick(rng, words) for _ in range(rng.randint(8, 40))),
             "pinned": False, "proposed": False, "written_by": "U1", "session_id": None, "created_at": now}
            for _ in range(count)]
    def write(batch: list[dict[str, Any]]) -> Callable[[Session], object]:
        return lambda s: s.connection().execute(insert(memories), batch)

    for start in range(0, count, 1_000):  # the search index is written with each row (SQLite: its triggers)
        await db.run_write(write(rows[start:start + 1_000]))


async def _timed(calls: int, call: Callable[[], Awaitable[None]]) -> list[float]:
    took = []
    for _ in range(calls):
        t0 = time.perf_counter()
        await call()
        took.append((time.perf_counter() - t0) * 1000)
    return took


async def run(url: str, label: str, count: int, queries: int) -> None:
    db = Database(url)
    await db.migrate()
    agent = f"bench-{secrets.token_hex(4)}"
    rng = random.Random(36)
    words = _words(rng)
    try:
        t0 = time.perf_counter()
        await _fill(db, agent, count, words, rng)
        print(f"{label}: {count:,} memories written in {time.perf_counter() - t0:.1f} s")
        if not db.is_sqlite:  # the planner's figures for the new rows, as autovacuum would soon make them
            await db.run_write(lambda s: s.connection().exec_driver_sql("ANALYZE memories"))
        store = MemoryStore(db)
        some = (await store.recent(agent, limit=1))[0].id
        terms = [" ".join(_pick(rng, words) for _ in range(rng.randint(1, 3))) for _ in range(queries)]
        found: list[int] = []

        async def recall() -> None:
            found.append(len(await store.search(agent, terms[len(found) % len(terms)], limit=10)))

        async def by_id() -> None:
            await store.get(some)

        await _timed(20, by_id)  # warm both (connections, caches)
        await _timed(20, recall)
        found.clear()
        recalls = await _timed(queries, recall)
        reads = await _timed(queries, by_id)
        print(f"{label}: recall p50 {pct(recalls, 50):.2f} ms, p99 {pct(recalls, 99):.2f} ms, "
              f"max {max(recalls):.2f} ms (mean {statistics.mean(found):.1f} found of 10); "
              f"by id p50 {pct(reads, 50):.2f} ms, "
              f"p99 {pct(reads, 99):.2f} ms")
        summary(f"recall p50, {count:,} memories ({label})", pct(recalls, 50), pct(reads, 50), "ms", "report")
        summary(f"recall p99, {count:,} memories ({label})", pct(recalls, 99), pct(reads, 99), "ms", "report")
    finally:
        if not db.is_sqlite:
            await db.run_write(lambda s: s.connection().execute(delete(memories).where(memories.c.agent == agent)))
        await db.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--memories", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--database-url", default="", help="also on this PostgreSQL database (migrated to head)")
    parser.add_argument("--no-sqlite", action="store_true", help="only PostgreSQL (bench.run_all runs SQLite apart)")
    args = parser.parse_args()
    if not args.no_sqlite:
        with tempfile.TemporaryDirectory() as home:
            await run(f"sqlite:///{Path(home) / 'bot.db'}", "SQLite", args.memories, args.queries)
    if args.database_url:
        await run(args.database_url, "PostgreSQL", args.memories, args.queries)


if __name__ == "__main__":
    asyncio.run(main())
