"""Cron weekdays as cron reads them (0 and 7 Sunday, 1-5 Monday to Friday), for schedules and freezes alike.

APScheduler 3's ``CronTrigger.from_crontab`` counts weekdays from Monday, so ``0 9 * * 1-5`` fired Tuesday to
Saturday; ``core.triggers.crontab_trigger`` writes the weekday field out as names first.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from apscheduler.triggers.cron import CronTrigger

from core.errors import InvalidInput
from core.schedules.jobs import _stale_cron
from core.triggers import TriggerSpec, crontab_trigger


def _fire_days(cron: str, zone: str = "UTC", days: int = 14) -> list[str]:
    trigger = crontab_trigger(cron, ZoneInfo(zone))
    start = datetime(2026, 12, 6, 0, 0, tzinfo=ZoneInfo(zone))  # a Sunday
    fired: list[str] = []
    previous = None
    now = start
    while now < start + timedelta(days=days):
        upcoming = trigger.get_next_fire_time(previous, now)
        if upcoming is None or upcoming >= start + timedelta(days=days):
            break
        fired.append(upcoming.strftime("%a"))
        previous, now = upcoming, upcoming + timedelta(seconds=1)
    return fired


@pytest.mark.parametrize(("weekday", "expected"), [
    ("1-5", ["Mon", "Tue", "Wed", "Thu", "Fri"]),
    ("5", ["Fri"]),
    ("0", ["Sun"]),
    ("7", ["Sun"]),
    ("5-7", ["Fri", "Sat", "Sun"]),
    ("*/2", ["Sun", "Tue", "Thu", "Sat"]),
    ("mon,wed", ["Mon", "Wed"]),
    ("sat-sun", None),  # a range that runs backwards is refused, as cron refuses it
])
def test_weekdays_are_read_as_cron_reads_them(weekday: str, expected: list[str] | None) -> None:
    cron = f"0 9 * * {weekday}"
    if expected is None:
        with pytest.raises(ValueError):
            crontab_trigger(cron, UTC)
        return
    assert set(_fire_days(cron, days=7)) == set(expected)


def test_a_schedules_weekday_cron_fires_monday_to_friday_in_its_own_timezone() -> None:
    trigger = TriggerSpec(cron="0 9 * * 1-5", timezone="Europe/Paris").build(datetime(2026, 12, 5, tzinfo=UTC), 0)
    first = trigger.get_next_fire_time(None, datetime(2026, 12, 5, 12, 0, tzinfo=UTC))  # a Saturday
    assert first is not None and first.strftime("%a %H:%M") == "Mon 09:00"
    assert first.utcoffset() == timedelta(hours=1)
    with pytest.raises(InvalidInput):
        TriggerSpec(cron="0 9 * * 8").build(datetime(2026, 12, 5, tzinfo=UTC), 0)


def test_a_cron_job_stored_with_the_old_weekdays_is_replaced_at_sync() -> None:
    now = datetime(2026, 12, 5, tzinfo=UTC)
    spec = TriggerSpec(cron="0 9 * * 1-5")
    old = CronTrigger.from_crontab("0 9 * * 1-5", timezone=ZoneInfo("UTC"))  # what jobs stored before the fix
    assert _stale_cron(old, spec, now)
    assert not _stale_cron(spec.build(now, 0), spec, now)
    assert not _stale_cron(old, TriggerSpec(every_seconds=3600), now)  # only cron jobs are compared


def test_a_cron_naming_days_and_weekdays_fires_on_either_as_cron_does() -> None:
    """``0 9 13 * 5``: the 13th of each month, and every Friday (APScheduler alone would need both at once)."""
    trigger = crontab_trigger("0 9 13 * 5", UTC)
    fired, previous, now = [], None, datetime(2026, 12, 1, tzinfo=UTC)
    while len(fired) < 4:
        upcoming = trigger.get_next_fire_time(previous, now)
        assert upcoming is not None
        fired.append(upcoming.strftime("%a %d"))
        previous, now = upcoming, upcoming + timedelta(seconds=1)
    assert fired == ["Fri 04", "Fri 11", "Sun 13", "Fri 18"]
    with pytest.raises(ValueError, match="never fires"):
        crontab_trigger("0 0 31 2 *", UTC)
