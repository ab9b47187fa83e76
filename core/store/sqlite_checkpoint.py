"""SQLite's WAL checkpoints, off the write path.

By default SQLite checkpoints inside the commit that pushes the WAL past 1000 pages: that commit copies
the WAL into the database file and syncs it, while every other writer (and the acks waiting on them)
waits. Here a PASSIVE checkpoint runs on a connection and thread of its own a moment after writes: it
copies what no reader still needs without taking the write lock, so commits go on meanwhile. Our
connections keep SQLite's own checkpoint only as a safety net, far later (``AUTOCHECKPOINT_PAGES``): under
a write rate at which the background copy never quite catches up, the WAL would otherwise never restart
from its beginning; by then nearly everything is copied, so that commit has little left to do. A
checkpoint only moves committed pages from one file to the other, and a crash in the middle is repaired
from the WAL when the database is next opened.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import Engine

log = logging.getLogger(__name__)

CHECKPOINT_DELAY_S = 0.5  # after a write, how long to gather more before the next checkpoint
AUTOCHECKPOINT_PAGES = 4000  # SQLite's own checkpoint in a commit: only past this (16 MB at 4 KB pages)
WAL_SIZE_LIMIT_BYTES = 16 * 1024 * 1024  # a WAL that grew past this is cut back when it restarts


class SQLiteCheckpointer:
    def __init__(self, engine: Engine, *, delay_s: float = CHECKPOINT_DELAY_S) -> None:
        self._engine = engine
        self._delay_s = delay_s
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-checkpoint")
        self._task: asyncio.Task[None] | None = None
        self._dirty = False  # written since the last checkpoint began (or it left something behind)
        self._closed = False

    def wrote(self) -> None:
        """A write committed: a checkpoint follows within the delay (one for everything written by then)."""
        if self._closed:
            return
        self._dirty = True
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="sqlite-checkpoint")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self._dirty and not self._closed:
            await asyncio.sleep(self._delay_s)
            self._dirty = False  # what is written from now on needs the next round
            try:
                complete = await loop.run_in_executor(self._thread, self._checkpoint)
            except Exception:  # the files stay consistent; the next round tries again
                log.warning("SQLite checkpoint failed; trying again", exc_info=True)
                complete = False
            if not complete:  # busy, or a reader still needed part of the WAL: another round
                self._dirty = True

    def _checkpoint(self) -> bool:
        with self._engine.connect() as conn:
            busy, frames, copied = conn.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)").one()
        return not busy and copied >= frames

    async def close(self) -> None:
        """Drop a pending round and wait for a checkpoint under way (the last connection to close
        checkpoints what is left)."""
        if self._closed:
            return
        self._closed = True
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.wait([self._task])
        # The single worker runs this after a checkpoint it is in the middle of: the loop never blocks.
        await asyncio.get_running_loop().run_in_executor(self._thread, lambda: None)
        self._thread.shutdown(wait=True)
