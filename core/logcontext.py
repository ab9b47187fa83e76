"""Which session and turn a log line belongs to, carried by context variables through each turn's task."""

from __future__ import annotations

import logging
from contextvars import ContextVar

session_id: ContextVar[str | None] = ContextVar("session_id", default=None)
turn_id: ContextVar[int | None] = ContextVar("turn_id", default=None)


class ContextFilter(logging.Filter):
    """Adds ``session_id`` and ``turn_id`` to every record (None outside a turn)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.session_id = session_id.get()
        record.turn_id = turn_id.get()
        return True
