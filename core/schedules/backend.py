"""APScheduler on the bot's own database and event loop.

The job store lives in the same database, and the scheduler never waits for SQLite's writer lock on
the loop that holds it.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any

from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from core.store import Database


class DbFriendlyScheduler(AsyncIOScheduler):
    """Runs its (synchronous) job store work only while no write transaction of ours is open, so
    SQLite's single writer lock is never waited for on the event loop that holds it."""

    def __init__(self, busy: Callable[[], bool], **options: Any) -> None:
        super().__init__(**options)
        self._busy = busy

    def wakeup(self) -> None:
        # In a fresh context: the firings it starts must not inherit the context of whoever added or resumed a
        # job (a request's context variables, e.g. which Slack workspace it came from).
        self._eventloop.call_soon_threadsafe(self._wake, context=contextvars.Context())

    def _wake(self) -> None:
        self._stop_timer()
        if self._busy():
            self._start_timer(0.005)
            return
        self._start_timer(self._process_jobs())


def build_scheduler(db: Database, *, misfire_grace_s: float) -> DbFriendlyScheduler:
    """A scheduler whose jobs live in ``db`` (explicit ids, coalesced, one instance at a time)."""
    options: dict[str, Any] = {"connect_args": {"timeout": 10}} if db.is_sqlite else {"pool_pre_ping": True}
    store = SQLAlchemyJobStore(engine=db.sync_engine(**options))
    return DbFriendlyScheduler(
        lambda: db.write_in_progress, jobstores={"default": store},
        job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": misfire_grace_s},
    )
