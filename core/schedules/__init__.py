"""Scheduled sessions (SPEC §9): managing them (``service``), firing them (``jobs``); triggers in ``core.triggers``.

APScheduler's job store names the job function by the text ``core.schedules:run_schedule`` (every
version wrote that), so this package keeps that name resolvable without importing the firing side
until a job actually runs.
"""

from __future__ import annotations

from typing import Any

from core.schedules.service import ScheduleService

__all__ = ["ScheduleService"]


def __getattr__(name: str) -> Any:
    if name == "run_schedule":
        from core.schedules.jobs import run_schedule

        return run_schedule
    raise AttributeError(f"module 'core.schedules' has no attribute {name!r}")
