"""Column types every table shares, core's and a channel's own (``channels/slack/tables.py``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Column, DateTime, TypeDecorator
from sqlmodel import Field


class UTCDateTime(TypeDecorator[datetime]):
    """Stores aware UTC datetimes; SQLite hands back naive ones, which are UTC by construction."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the store; use an aware UTC datetime")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def timestamp(nullable: bool = False) -> Any:
    """A UTC datetime column (UTCDateTime)."""
    return Field(sa_column=Column(UTCDateTime(), nullable=nullable))
