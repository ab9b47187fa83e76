"""The Retry-After header, as both HTTP providers read it."""

from __future__ import annotations

import math
from typing import Any


def retry_after_seconds(value: Any) -> float | None:
    """A Retry-After in seconds, if it is one (finite, not negative; not an HTTP date, "inf" or "nan")."""
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and math.isfinite(seconds) and seconds >= 0 else None
