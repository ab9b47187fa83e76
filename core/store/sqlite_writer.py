"""SQLite's write path for the hot operations: one thread runs queued transactions back to back.

SQLite takes one writer at a time. Through aiosqlite every statement is a round trip to a thread and back
through the event loop, and a busy loop stretches each of them, all while the write lock is held. Here a
whole transaction is one synchronous call, and the thread keeps taking what is queued meanwhile: the
process's write turn (``Database``'s lock) is held for one round trip per run of jobs, not per statement.
Each job still commits on its own (one job's failure rolls back only that job), and its caller goes on
as soon as it has committed. Urgent jobs (group commits that acks wait for) go first.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from sqlalchemy import Connection, Engine
from sqlmodel import Session

from core.errors import StoreError

T = TypeVar("T")


@dataclass
class _Job(Generic[T]):
    work: Callable[[Session], T]
    future: asyncio.Future[T]
    skip: bool = False  # its caller was cancelled before it started: it never runs
    started: bool = False
    outcome: tuple[bool, Any] = field(default=(False, None))


_TURN_JOBS = 256  # jobs per hold of the write turn: the async writers waiting for it get their go


class SQLiteWriter:
    def __init__(self, engine: Engine, write_turn: asyncio.Lock, *,
                 on_commit: Callable[[], None] | None = None) -> None:
        self._engine = engine
        self._on_commit = on_commit  # after each run of jobs (the WAL's checkpointer)
        self._write_turn = write_turn  # shared with the async writers of the same process
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-writer")
        # Taken by the thread while it runs, so a job queued meanwhile runs in the same hold of the
        # write turn; urgent ones (an ack is waiting) go before the rest.
        self._urgent: deque[_Job[Any]] = deque()
        self._queue: deque[_Job[Any]] = deque()
        self._drainer: asyncio.Task[None] | None = None
        self._closed = False
        self._flags = threading.Lock()  # the queues, and a job's skip/started, from either side
        # The thread's own connection, kept between jobs (no pool checkout and reset per transaction);
        # only the writer thread touches it.
        self._conn: Connection | None = None

    async def run(self, work: Callable[[Session], T], *, urgent: bool = False) -> T:
        if self._closed:
            raise StoreError("the database is closed")
        loop = asyncio.get_running_loop()
        job: _Job[T] = _Job(work, loop.create_future())
        with self._flags:
            (self._urgent if urgent else self._queue).append(job)
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain(), name="sqlite-writer")
        try:
            return await asyncio.shield(job.future)
        except asyncio.CancelledError:
            # Not yet started: it never will. Started: it runs to its end (and commits) before we return.
            with self._flags:
                job.skip = not job.started
            if not job.skip:
                await asyncio.wait([job.future])
            raise

    def _pending(self) -> bool:
        with self._flags:
            return bool(self._urgent or self._queue)

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending():
            try:
                async with self._write_turn:
                    await loop.run_in_executor(self._thread, self._run_queued, loop)
            except BaseException as exc:  # the thread is gone (shut down) or the loop is closing
                with self._flags:
                    left = [*self._urgent, *self._queue]
                    self._urgent.clear()
                    self._queue.clear()
                for job in left:
                    if isinstance(exc, Exception):
                        _settle(job, (False, exc))
                    elif not job.future.done():
                        job.future.cancel()
                if not isinstance(exc, Exception):
                    raise
            if self._on_commit is not None:
                self._on_commit()

    def _run_queued(self, loop: asyncio.AbstractEventLoop) -> None:
        for _ in range(_TURN_JOBS):
            with self._flags:
                if not (self._urgent or self._queue):
                    return
                job = self._urgent.popleft() if self._urgent else self._queue.popleft()
                if job.skip:
                    loop.call_soon_threadsafe(_settle, job, (False, None))
                    continue
                job.started = True
            outcome = self._run_one(job)
            loop.call_soon_threadsafe(_settle, job, outcome)  # committed: its caller goes on at once

    def _run_one(self, job: _Job[Any]) -> tuple[bool, Any]:
        try:
            if self._conn is None:
                self._conn = self._engine.connect()
            # The transaction is the connection's (BEGIN IMMEDIATE, committed when the block ends, rolled
            # back if the work raises); the session only lends the work its ORM on that connection.
            with self._conn.begin(), Session(bind=self._conn, expire_on_commit=False) as session:
                result = job.work(session)
                session.flush()  # what the work added through the ORM is written before the commit
                return True, result
        except Exception as exc:
            # A failed COMMIT (e.g. SQLITE_BUSY) leaves SQLite's transaction open, and SQLAlchemy sends no
            # ROLLBACK then: closing the connection ends it (and its lock); the next job opens a fresh one.
            conn, self._conn = self._conn, None
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()
            return False, exc

    def _close_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._engine.dispose()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._drainer is not None:
            with contextlib.suppress(Exception):
                await self._drainer
        await asyncio.get_running_loop().run_in_executor(self._thread, self._close_connection)
        self._thread.shutdown(wait=True)


def _settle(job: _Job[Any], outcome: tuple[bool, Any]) -> None:
    if job.future.done():
        return
    ok, value = outcome
    if ok:
        job.future.set_result(value)
    elif value is None:  # skipped
        job.future.cancel()
    else:
        job.future.set_exception(value)
