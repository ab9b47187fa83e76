"""Schedules and their firings (SPEC §9). Every change here needs a migration."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Column, Text, UniqueConstraint
from sqlmodel import Field, SQLModel

from core.store.tables import _ts


class ScheduleRow(SQLModel, table=True):
    """A prompt that runs on a trigger and posts its answer to an approved destination (SPEC §9)."""

    __tablename__ = "schedules"

    id: int | None = Field(default=None, primary_key=True)
    prompt: str = Field(sa_column=Column(Text, nullable=False))
    trigger: str = Field(sa_column=Column(Text, nullable=False))  # JSON: {"cron"|"every_seconds"|"at", "timezone"}
    destination: str = Field(max_length=255)  # as the person wrote it ("#ops")
    destination_id: str = Field(max_length=255)  # as the channel knows it ("C123")
    channel: str = Field(max_length=32)  # the adapter that delivers ("slack")
    agent: str = Field(max_length=64)
    creator: str = Field(max_length=64)
    # The creator's trust level at creation (core.trust); None: created before levels existed (a member's).
    creator_trust: str | None = Field(default=None, max_length=16)
    origin_session: str | None = Field(default=None, max_length=255)  # where it was asked for
    # Everyone who had written in that conversation when it was created (JSON list, the creator included): a
    # firing acts through the creator's personal connections only if nobody else had. None: not recorded (a
    # schedule from before this was), so never taken as alone.
    origin_senders: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    status: str = Field(max_length=32)  # pending_destination, active, paused, cancelled, done
    approval_id: int | None = Field(default=None)
    created_at: datetime = _ts()
    firings: int = Field(default=0)
    failures: int = Field(default=0)  # consecutive failed deliveries
    last_fired_at: datetime | None = _ts(nullable=True)
    last_outcome: str | None = Field(default=None, sa_column=Column(Text, nullable=True))


class FiringRow(SQLModel, table=True):
    __tablename__ = "firings"
    __table_args__ = (UniqueConstraint("schedule_id", "n", name="uq_firings_schedule_n"),)

    id: int | None = Field(default=None, primary_key=True)
    schedule_id: int = Field(foreign_key="schedules.id")
    n: int
    session_id: str = Field(max_length=255)
    status: str = Field(max_length=16)  # running, posted, failed, skipped
    started_at: datetime = _ts()
    finished_at: datetime | None = _ts(nullable=True)
    ts: str | None = Field(default=None, max_length=64)
    error: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
