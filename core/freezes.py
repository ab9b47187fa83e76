"""Change freezes (SPEC §17): while one is in force, gated-tool calls are refused with its reason and end.

A freeze is either stored (``bot freeze``, ``/bot freeze``: the database is the truth, so a freeze written by
one replica or the CLI is honoured by every other at once; nothing is cached) or a ``[[freezes]]`` window of
``bot.toml`` (a cron expression in UTC and a duration: in force while its latest fire time is less than
``duration_s`` ago). Windows are configuration: ``bot unfreeze`` lifts stored freezes only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from apscheduler.triggers.cron import CronTrigger

from core.clock import Clock
from core.errors import InvalidInput
from core.store.freezes import FreezeStore
from core.store.tables import FreezeRow
from core.triggers import cron_triggers

MAX_REASON_CHARS = 500  # said on every refusal, in the thread and to the model: a sentence, not a document
MAX_FREEZE = timedelta(days=366)  # longer is surely a slip
CLOCK_SKEW = timedelta(minutes=5)  # how far one machine's clock may run ahead of another's (a stored freeze's start)
_RELATIVE = re.compile(r"(\d{1,6})\s*([smhd])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


@dataclass(frozen=True)
class Freeze:
    """A freeze in force: why, and until when. ``id``: a stored freeze's; None for a ``[[freezes]]`` window."""

    reason: str
    until: datetime
    id: int | None = None

    def describe(self) -> str:
        """ "change freeze until 2026-12-05 14:00 UTC: <reason>" (what refusals and status say)."""
        return f"change freeze until {self.until.astimezone(UTC):%Y-%m-%d %H:%M} UTC: {self.reason}"

    def refusal(self, tool: str) -> str:
        """What the model is told instead of the call's result."""
        return (f"refused: {self.describe()}; `{tool}` did not run and nobody was asked; do not retry it "
                "during the freeze; continue without it")


@dataclass(frozen=True)
class FreezeWindow:
    """A ``[[freezes]]`` entry: in force for ``duration_s`` from each fire time of ``cron`` (in UTC)."""

    cron: str
    duration_s: float
    reason: str

    _triggers: tuple[CronTrigger, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_triggers", cron_triggers(self.cron, UTC))  # a bad expression fails where it is read

    def covering(self, now: datetime) -> Freeze | None:
        """The freeze this window holds at ``now``, or None: from its latest fire time at or before ``now``."""
        duration = timedelta(seconds=self.duration_s)
        fired = [fire for trigger in self._triggers if (fire := _latest_fire(trigger, now, duration))]
        if not fired:
            return None
        until = max(fired) + duration
        return Freeze(self.reason, until) if until > now else None


def _latest_fire(trigger: CronTrigger, now: datetime, duration: timedelta) -> datetime | None:
    """The trigger's latest fire time in the ``duration`` up to ``now``, found by bisecting (to the second): a
    minutely cron with a week's duration stays cheap."""
    low, high = now - duration, now
    first = trigger.get_next_fire_time(None, low)
    if first is None or first > now:
        return None
    while (high - low) > timedelta(seconds=1):  # invariant: a fire at or after ``low`` is at or before now
        middle = low + (high - low) / 2
        fire = trigger.get_next_fire_time(None, middle)
        if fire is not None and fire <= now:
            low = middle
        else:
            high = middle
    latest = trigger.get_next_fire_time(None, low)
    assert latest is not None and latest <= now
    return latest


class Freezes:
    """Which freeze is in force (stored or a window), and setting and lifting stored ones (audited)."""

    def __init__(self, store: FreezeStore, clock: Clock, windows: tuple[FreezeWindow, ...] = ()) -> None:
        self.store = store
        self.clock = clock
        self.windows = windows

    async def active(self, now: datetime | None = None) -> Freeze | None:
        """The freeze in force at ``now`` (default: the clock's), the one lasting longest; None when there is none.
        Read from the database every time: a freeze set elsewhere counts at once."""
        now = now or self.clock.now()
        found = [Freeze(row.reason, row.until, row.id) for row in await self.store.active(now)]
        found += [freeze for window in self.windows if (freeze := window.covering(now)) is not None]
        return max(found, key=lambda f: f.until) if found else None

    async def freeze(self, until: datetime, reason: str, by: str) -> Freeze:
        """Set a freeze from now until ``until``; raises InvalidInput for a time not ahead, too far ahead, or no
        reason."""
        now = self.clock.now()
        reason = clean_reason(reason)
        if until.tzinfo is None:
            raise InvalidInput("the end time needs a timezone (e.g. 2026-12-24T18:00Z or +01:00)")
        if until <= now:
            raise InvalidInput(f"the end time {until.astimezone(UTC):%Y-%m-%d %H:%M} UTC is not in the future")
        if until - now > MAX_FREEZE:
            raise InvalidInput(f"a freeze lasts at most {MAX_FREEZE.days} days")
        # In force from a little before now: the CLI's machine (or another replica) may run ahead of this one's
        # clock, and a freeze said to be set must hold everywhere at once. Nothing happened in the past because of it.
        row = await self.store.add(FreezeRow(starts_at=now - CLOCK_SKEW, until=until.astimezone(UTC), reason=reason,
                                             created_by=by, created_at=now))
        return Freeze(row.reason, row.until, row.id)

    async def lift(self, by: str) -> list[int]:
        """Lift every stored freeze (in force or set ahead); the ids lifted. ``[[freezes]]`` windows stay."""
        return await self.store.lift(by, self.clock.now())

    def window_in_force(self, now: datetime | None = None) -> Freeze | None:
        """A ``[[freezes]]`` window in force at ``now``: what ``unfreeze`` cannot lift."""
        now = now or self.clock.now()
        held = [freeze for window in self.windows if (freeze := window.covering(now)) is not None]
        return max(held, key=lambda f: f.until) if held else None


def clean_reason(reason: str) -> str:
    """The reason on one line (no control characters), required, at most MAX_REASON_CHARS. Angle brackets become
    single guillemets: the reason is posted in threads, and no mention (``<!channel>``) or link may ride on it."""
    text = _CONTROL.sub(" ", reason).replace("<", "\u2039").replace(">", "\u203a").strip()
    if not text:
        raise InvalidInput("a freeze needs a reason (--reason TEXT): it is what every refused call is told")
    if len(text) > MAX_REASON_CHARS:
        raise InvalidInput(f"the reason is {len(text)} characters; at most {MAX_REASON_CHARS}")
    return text


def parse_until(text: str, now: datetime) -> datetime:
    """An end time: ISO 8601 with a timezone (``2026-12-24T18:00Z``, ``…+01:00``) or a span from ``now`` (``2h``,
    ``30m``, ``1d``, ``45s``). Raises InvalidInput otherwise."""
    text = text.strip()
    if (span := _RELATIVE.fullmatch(text.lower())) is not None:
        return now + timedelta(**{_UNITS[span.group(2)]: int(span.group(1))})
    try:
        until = datetime.fromisoformat(text)
        if until.tzinfo is None:
            raise InvalidInput(f"{text[:40]!r} has no timezone: add Z (UTC) or an offset such as +01:00")
        return until.astimezone(UTC)  # OverflowError: its UTC is outside the calendar (year 1 +14:00)
    except (ValueError, OverflowError):
        raise InvalidInput(f"{text[:40]!r} is not a time: use ISO 8601 with a timezone "
                           "(2026-12-24T18:00Z) or a span such as 2h, 30m, 1d") from None
