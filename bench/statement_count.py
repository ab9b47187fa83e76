"""`bot` with every database round trip counted (issue 39), for the benchmarks: ``python -m bench.statement_count run``.

Counts what reaches the database, by statement: on PostgreSQL at asyncpg's level, where each count is a network
round trip (BEGIN, a statement's PREPARE when its connection has not prepared it yet, its execution, COMMIT,
ROLLBACK); on SQLite and through psycopg (APScheduler's job store) at SQLAlchemy's. The counts are written as
JSON to the file named by ``BENCH_STATEMENTS`` (about every 0.2 s while they change), so a benchmark reads them
before and after its load. Nothing here is imported by the bot itself.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import re
import runpy
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

WRITE_EVERY_S = 0.2
_SPACE = re.compile(r"\s+")
_counts: Counter[str] = Counter()
_tx: Counter[str] = Counter()  # not round trips: which statements each transaction held
_lock = threading.Lock()


def _count(key: str) -> None:
    with _lock:
        _counts[key] += 1


def _name(kind: str, sql: str) -> str:
    return f"{kind} {_SPACE.sub(' ', sql).strip()[:120]}"


_WRITE = re.compile(r"^\s*(INSERT INTO|UPDATE|DELETE FROM|WITH)\s+(\w+)", re.I)
_READ = re.compile(r"^\s*SELECT\b.*?\bFROM\s+(\w+)", re.I | re.S)
_open: dict[int, list[str]] = {}  # a connection's open transaction: its statements so far, in short


def _short(sql: str) -> str:
    if found := _WRITE.match(sql):
        return f"{found[1].split()[0].upper()} {found[2]}"
    if found := _READ.match(sql):
        return f"SELECT {found[1]}"
    return sql.split(";")[0][:20]


def _install_asyncpg() -> None:
    from asyncpg import connection, prepared_stmt

    def wrap(owner: Any, method: str, key: Any, conn_of: Any) -> None:
        original = getattr(owner, method)

        @functools.wraps(original)
        async def counted(self: Any, sql: Any = None, *args: Any, **kwargs: Any) -> Any:
            name = key(self, sql)
            _count(name)
            _transactions(id(conn_of(self)), name)
            if sql is None:
                return await original(self, *args, **kwargs)
            return await original(self, sql, *args, **kwargs)

        setattr(owner, method, counted)

    # Each of these is one round trip; BEGIN, COMMIT and ROLLBACK reach the server as ``execute``.
    wrap(connection.Connection, "prepare", lambda _c, sql: _name("PREPARE", sql), lambda c: c)
    wrap(connection.Connection, "executemany", lambda _c, sql: _name("EXECUTEMANY", sql), lambda c: c)
    wrap(connection.Connection, "fetchrow", lambda _c, sql: _name("QUERY", sql), lambda c: c)  # SQLAlchemy's ping
    wrap(connection.Connection, "execute", lambda _c, sql: _name("QUERY", sql), lambda c: c)
    # fetch(*args): its first argument, if any, is the statement's first parameter
    original = prepared_stmt.PreparedStatement.fetch

    @functools.wraps(original)
    async def fetch(self: Any, *args: Any, **kwargs: Any) -> Any:
        name = _name("EXECUTE", self.get_query())
        _count(name)
        _transactions(id(self._connection), name)
        return await original(self, *args, **kwargs)

    prepared_stmt.PreparedStatement.fetch = fetch


def _transactions(conn: int, name: str) -> None:
    """Each transaction, counted as the sequence of its statements (``TX BEGIN; SELECT sessions; …``)."""
    kind, _, sql = name.partition(" ")
    with _lock:
        if sql.startswith("BEGIN"):
            _open[conn] = []
        elif sql.startswith(("COMMIT", "ROLLBACK")):
            steps = _open.pop(conn, None)
            if steps is not None:
                _tx[f"TX {' + '.join(steps)} → {sql.rstrip(';')}"] += 1
        elif conn in _open and kind != "PREPARE":
            _open[conn].append(_short(sql))


def _install_sqlalchemy() -> None:
    from sqlalchemy import Engine, event

    def counted(conn: Any) -> bool:
        return bool(conn.dialect.driver != "asyncpg")  # asyncpg's are counted at its own level

    @event.listens_for(Engine, "before_cursor_execute")
    def _statement(conn: Any, _cursor: Any, statement: str, _params: Any, _context: Any, many: bool) -> None:
        if counted(conn):
            _count(_name("EXECUTEMANY" if many else "EXECUTE", statement))

    @event.listens_for(Engine, "commit")
    def _commit(conn: Any) -> None:
        if counted(conn):
            _count("COMMIT")

    @event.listens_for(Engine, "rollback")
    def _rollback(conn: Any) -> None:
        if counted(conn):
            _count("ROLLBACK")


def _write(path: Path) -> None:
    with _lock:
        snapshot = dict(_counts) | dict(_tx)
    partial = path.with_suffix(".part")
    partial.write_text(json.dumps(snapshot))
    partial.replace(path)


def _writer(path: Path) -> None:
    written: dict[str, int] | None = None
    while True:
        time.sleep(WRITE_EVERY_S)
        with _lock:
            now = dict(_counts)
        if now != written:
            _write(path)
            written = now


def read(path: Path) -> Counter[str]:
    """The counts a process wrote so far (none yet: empty)."""
    try:
        return Counter(json.loads(path.read_text()))
    except FileNotFoundError:
        return Counter()


def round_trips(counts: Counter[str]) -> int:
    return sum(n for key, n in counts.items() if not key.startswith("TX "))


def main() -> None:
    path = Path(os.environ["BENCH_STATEMENTS"])
    _install_asyncpg()
    _install_sqlalchemy()
    atexit.register(_write, path)
    threading.Thread(target=_writer, args=(path,), name="statement-count", daemon=True).start()
    sys.argv = ["bot", *sys.argv[1:]]
    runpy.run_module("bot", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
