"""Schedule triggers (SPEC §9): the model a schedule stores (``TriggerSpec``) and the grammar the
``/schedule`` command reads it from (``parse_when``)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.combining import OrTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger

from core.errors import InvalidInput

MAX_EVERY_S = 366 * 86400  # the longest interval a schedule may have
MAX_AHEAD = timedelta(days=3653)  # how far ahead a one-off ("at") may be


@dataclass(frozen=True)
class TriggerSpec:
    cron: str | None = None
    every_seconds: int | None = None
    at: str | None = None
    timezone: str = "UTC"

    def build(self, now: datetime, floor_s: int) -> BaseTrigger:
        """The APScheduler trigger, or InvalidInput saying exactly what is wrong."""
        given = [x for x in (self.cron, self.every_seconds, self.at) if x is not None]
        if len(given) != 1:
            raise InvalidInput("give exactly one of cron (5 fields), every_seconds or at (ISO 8601)")
        try:
            zone = ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise InvalidInput(f"unknown timezone {self.timezone!r} (use an IANA name such as Europe/Paris)") from None
        if self.cron is not None:
            if len(self.cron.split()) != 5:
                raise InvalidInput(f"cron must have 5 fields (minute hour day month weekday), got {self.cron!r}")
            try:
                return crontab_trigger(self.cron, zone)
            except ValueError as exc:
                raise InvalidInput(f"invalid cron {self.cron!r}: {exc}") from None
        if self.every_seconds is not None:
            every: Any = self.every_seconds  # from a model's JSON: maybe 300.0, or a bool
            whole = (isinstance(every, int) and not isinstance(every, bool)) or (
                isinstance(every, float) and every.is_integer())
            if not whole:
                raise InvalidInput("every_seconds must be a whole number of seconds")
            if every < floor_s:
                raise InvalidInput(f"every_seconds must be at least {floor_s}")
            if every > MAX_EVERY_S:  # also what the scheduler and the database can hold
                raise InvalidInput(f"an interval can be at most {MAX_EVERY_S // 86400} days")
            return IntervalTrigger(seconds=int(every), timezone=zone)
        assert self.at is not None
        try:
            when = datetime.fromisoformat(self.at)
        except (TypeError, ValueError):
            raise InvalidInput(f"at must be an ISO 8601 date and time, got {self.at!r}") from None
        when = when.replace(tzinfo=zone) if when.tzinfo is None else when
        if when <= now:
            raise InvalidInput(f"{when.isoformat()} is in the past")
        return DateTrigger(run_date=when, timezone=zone)

    def check(self, now: datetime, floor_s: int) -> None:
        """A new schedule's trigger: it builds, and a one-off is not too far ahead (near year 9999
        the scheduler cannot even convert it to UTC). InvalidInput says what is wrong."""
        self.build(now, floor_s)
        if self.at is not None:
            when = datetime.fromisoformat(self.at)
            when = when.replace(tzinfo=ZoneInfo(self.timezone)) if when.tzinfo is None else when
            if when - now > MAX_AHEAD:
                raise InvalidInput(f"at can be at most {MAX_AHEAD.days // 365} years ahead")

    def min_gap_s(self) -> float:
        """Two firings closer than this are one firing seen twice (a re-fire after a crash)."""
        if self.every_seconds is not None:
            return self.every_seconds / 2
        return 30.0 if self.cron is not None else float("inf")

    def describe(self) -> str:
        if self.cron is not None:
            return f"cron '{self.cron}' ({self.timezone})"
        if self.every_seconds is not None:
            return f"every {self.every_seconds} s"
        return f"once at {self.at} ({self.timezone})"

    def to_json(self) -> str:
        return json.dumps({k: v for k, v in self.__dict__.items() if v is not None})

    @staticmethod
    def from_json(text: str) -> TriggerSpec:
        return TriggerSpec(**json.loads(text))


_UNITS = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60, "h": 3600, "hour": 3600,
          "d": 86400, "day": 86400}


def parse_when(text: str) -> tuple[TriggerSpec, str]:
    """``every 5m …``, ``every 30 seconds …``, ``cron "0 9 * * 1-5" …``, ``at 2026-12-01T09:00 …``,
    optionally followed by ``tz Europe/Paris``. Returns the trigger and the rest of the text."""
    import shlex

    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise InvalidInput(f"cannot read {text!r}: {exc}") from None
    if not words:
        raise InvalidInput("say when: every 5m, cron \"0 9 * * 1-5\" or at 2026-12-01T09:00")
    head, rest = words[0].lower(), words[1:]
    spec: dict[str, Any] = {}
    if head == "every" and rest:
        amount = rest.pop(0)
        # ASCII digits only ("²".isdigit() is True, and int("²") fails); a long number is refused
        # by the bound in TriggerSpec.build, with its own message.
        parsed = re.fullmatch(r"([0-9]{1,30})([A-Za-z]*)", amount)
        number, unit = (parsed.group(1), parsed.group(2)) if parsed else ("", "")
        unit = unit or (rest.pop(0) if parsed and rest else "")
        factor = _UNITS.get(unit.lower().rstrip("s") or "s") or _UNITS.get(unit.lower())
        if not number or factor is None:
            raise InvalidInput(f"cannot read the interval {amount!r} (e.g. every 5m, every 30 seconds)")
        spec["every_seconds"] = int(number) * factor
    elif head == "cron" and rest:
        spec["cron"] = rest.pop(0)
    elif head == "at" and rest:
        spec["at"] = rest.pop(0)
    else:
        raise InvalidInput("say when: every 5m, cron \"0 9 * * 1-5\" or at 2026-12-01T09:00")
    if len(rest) >= 2 and rest[0].lower() == "tz":
        spec["timezone"] = rest[1]
        rest = rest[2:]
    return TriggerSpec(**spec), " ".join(rest)


_DAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


def cron_triggers(cron: str, zone: tzinfo) -> tuple[CronTrigger, ...]:
    """A 5-field cron expression in ``zone``, read as cron reads it. Its weekdays: 0 and 7 are Sunday, 5 Friday
    (APScheduler 3's ``from_crontab`` counts from Monday: its 5 is Saturday), so the field is written out as day
    names first. Its days: when both the day of the month and the weekday are restricted (neither starts with
    ``*``), cron fires on either (``0 0 1 * 5``: the 1st, and every Friday) where APScheduler would need both, so
    that is two triggers, one per field: a freeze must not cover less, nor a schedule fire less, than it says. Raises
    ValueError, also for an expression that never fires (31 February): each check would search years for it."""
    fields = cron.split()
    if len(fields) != 5:
        raise ValueError(f"a cron expression has 5 fields (minute hour day month weekday), got {cron!r}")
    minute, hour, day, month, weekday = fields

    def trigger(days: str, weekdays: str) -> CronTrigger:
        return CronTrigger(minute=minute, hour=hour, day=days, month=month, day_of_week=_weekday_names(weekdays),
                           timezone=zone)

    either = not day.startswith("*") and not weekday.startswith("*")
    triggers = (trigger(day, "*"), trigger("*", weekday)) if either else (trigger(day, weekday),)
    if all(t.get_next_fire_time(None, _EVER) is None for t in triggers):
        raise ValueError(f"{cron!r} never fires")
    return triggers


_EVER = datetime(2000, 1, 1, tzinfo=UTC)  # any expression that fires at all does within 28 years of any date


def _weekday_names(field: str) -> str:
    """``1-5`` → ``mon,tue,wed,thu,fri``; ``*`` stays; names pass through. Raises ValueError."""
    if field == "*":
        return field
    days: list[str] = []
    for part in field.lower().split(","):
        span, _, step_text = part.partition("/")
        step = int(step_text) if step_text else 1
        if step < 1:
            raise ValueError(f"weekday step {step_text!r} must be at least 1")
        first, _, last = span.partition("-")
        low = 0 if first == "*" else _day(first)
        if last and first.strip() == "7":  # 7 is Sunday at the start of a range too (7-7: Sundays; 7-1 backwards)
            low = 7
        # A step from one day runs to the week's end (cronie: 1/2 is 1-7/2), as a step does in the other fields.
        high = 6 if first == "*" else (_day(last) if last else 7 if step_text else low)
        if last.strip() == "7":  # 7 is Sunday too, at the end of a range (5-7: Friday to Sunday)
            high = 7
        if high < low:
            raise ValueError(f"weekday range {span!r} runs backwards")
        days += [_DAY_NAMES[d % 7] for d in range(low, high + 1, step)]
    return ",".join(dict.fromkeys(days))


def _day(text: str) -> int:
    text = text.strip()
    if text in _DAY_NAMES:
        return _DAY_NAMES.index(text)
    if text.isdigit() and 0 <= int(text) <= 7:
        return int(text) % 7
    raise ValueError(f"{text!r} is not a weekday (0-7 or sun-sat)")


def crontab_trigger(cron: str, zone: tzinfo) -> BaseTrigger:
    """A schedule's 5-field cron expression in ``zone``, as cron reads it (``cron_triggers``): one trigger, or the
    earlier of two when it names both days of the month and weekdays. Raises ValueError."""
    triggers = cron_triggers(cron, zone)
    return triggers[0] if len(triggers) == 1 else OrTrigger(list(triggers))
