"""``[[freezes]]`` (SPEC §17): change-freeze windows, a cron expression in UTC and how long each lasts."""

from __future__ import annotations

from datetime import UTC
from typing import Annotated

from pydantic import Field, field_validator

from bot.config.table import Problem, Table, Text
from core.freezes import MAX_FREEZE, MAX_REASON_CHARS, FreezeWindow, clean_reason
from core.triggers import cron_triggers


class FreezeTable(Table):
    """A change-freeze window: from each fire time of `cron` (UTC) for `duration_s`, gated calls are refused."""

    cron: Text = Field(description="a cron expression of 5 fields (minute hour day month weekday), in UTC, e.g. "
                                   "'0 16 * * 5' (Fridays at 16:00 UTC)")
    duration_s: Annotated[float, Field(gt=0, le=MAX_FREEZE.total_seconds())] = Field(
        description=f"a number of seconds above 0 and at most {int(MAX_FREEZE.total_seconds())}: how long each "
                    "window lasts")
    reason: Annotated[str, Field(min_length=1, max_length=MAX_REASON_CHARS)] = Field(
        description=f"a non-empty text of at most {MAX_REASON_CHARS} characters: what refused calls are told")

    @field_validator("cron")
    @classmethod
    def _cron(cls, value: str) -> str:
        if len(value.split()) != 5:
            raise Problem(f"must have 5 fields (minute hour day month weekday), got {value!r}")
        try:
            cron_triggers(value, UTC)
        except ValueError as exc:
            raise Problem(f"is not a valid cron expression ({exc})") from None
        return value

    @field_validator("reason")
    @classmethod
    def _reason(cls, value: str) -> str:
        if not value.strip():
            raise Problem("is blank: say why the freeze holds (every refused call is told)")
        return value

    def window(self) -> FreezeWindow:
        return FreezeWindow(self.cron, self.duration_s, clean_reason(self.reason))
