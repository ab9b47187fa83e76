"""SQLite's write path for the hot operations: one thread runs queued transactions back to back.

SQLite takes one writer at a time. Through aiosqlite every statement is a round trip to a thread and back
through the event loop, and a busy loop stretches each of them, all while the write lock is held. Here a
whole transaction is one synchronous call, and everything queued meanwhile goes to the thread as one
batch: the process's write turn (``Database``'s lock) is held for one round trip per batch, not per
statement. Each job still commits on its own, so one job's failure rolls back only that job.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from sqlalchemy import Engine
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


class SQLiteWriter:
    def __init__(self, engine: Engine, write_turn: asyncio.Lock) -> None:
        self._engine = engine
        self._write_turn = write_turn  # shared with the async writers of the same process
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-writer")
        self._queue: list[_Job[Any]] = []
        self._drainer: asyncio.Task[None] | None = None
        self._closed = False
        self._flags = threading.Lock()  # a job's skip/started, set from either side

    async def run(self, work: Callable[[Session], T]) -> T:
        if self._closed:
            raise StoreError("the database is closed")
        job: _Job[T] = _Job(work, asyncio.get_running_loop().create_future())
        self._queue.append(job)
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

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while self._queue:
            jobs, self._queue = self._queue, []
            try:
                async with self._write_turn:
                    await loop.run_in_executor(self._thread, self._run_all, jobs)
            except Exception as exc:  # the thread could not be reached (shut down): none of them ran
                for job in jobs:
                    job.outcome = (False, exc)
            except BaseException:  # cancelled (the loop is closing): every caller learns it
                for job in [*jobs, *self._queue]:
                    job.future.cancel()
                raise
            for job in jobs:
                ok, value = job.outcome
                if job.future.done():
                    continue
                if ok:
                    job.future.set_result(value)
                elif value is None:  # skipped
                    job.future.cancel()
                else:
                    job.future.set_exception(value)

    def _run_all(self, jobs: list[_Job[Any]]) -> None:
        for job in jobs:
            with self._flags:
                if job.skip:
                    continue
                job.started = True
            try:
                with Session(self._engine, expire_on_commit=False) as session, session.begin():
                    job.outcome = (True, job.work(session))
            except Exception as exc:
                job.outcome = (False, exc)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._drainer is not None:
            with contextlib.suppress(Exception):
                await self._drainer
        await asyncio.get_running_loop().run_in_executor(self._thread, self._engine.dispose)
        self._thread.shutdown(wait=True)
