"""Counts for operators (metrics, doctor): read from the database, so every replica agrees."""

from __future__ import annotations

from sqlalchemy import func
from sqlmodel import select

from core.model import (
    ApprovalStatus,
    CredentialStatus,
    DeliveryStatus,
    FiringStatus,
    InputKind,
    InputStatus,
    ScheduleStatus,
    TurnStatus,
)
from core.store.connection_tables import ConnectionRequestRow
from core.store.database import Database
from core.store.tables import (
    ApprovalRow,
    CredentialRequestRow,
    DeliveryRow,
    FeedbackRow,
    FiringRow,
    InputRow,
    ScheduleRow,
    TurnRow,
)


async def snapshot(db: Database) -> dict[str, float]:
    async with db.read() as s:
        async def count(query: object) -> float:
            return float((await s.exec(query)).one())  # type: ignore[call-overload]

        figures = {
            "queue_depth": await count(select(func.count()).select_from(InputRow).where(
                InputRow.status == InputStatus.WAITING, InputRow.kind == InputKind.MESSAGE)),
            "turns_running": await count(select(func.count()).select_from(TurnRow).where(
                TurnRow.status == TurnStatus.RUNNING)),
            "approvals_pending": await count(select(func.count()).select_from(ApprovalRow).where(
                ApprovalRow.status == ApprovalStatus.PENDING)),
            "credential_requests_pending": await count(select(func.count()).select_from(CredentialRequestRow).where(
                CredentialRequestRow.status == CredentialStatus.PENDING)),
            "connection_requests_pending": await count(select(func.count()).select_from(ConnectionRequestRow).where(
                ConnectionRequestRow.status == "pending")),
            "schedules_active": await count(select(func.count()).select_from(ScheduleRow).where(
                ScheduleRow.status == ScheduleStatus.ACTIVE)),
        }
        for delivery in (DeliveryStatus.PENDING, DeliveryStatus.GIVEN_UP):
            figures[f"deliveries_{delivery}"] = await count(select(func.count()).select_from(DeliveryRow).where(
                DeliveryRow.status == delivery))
        for status in (FiringStatus.POSTED, FiringStatus.FAILED):
            figures[f"firings_{status}"] = await count(select(func.count()).select_from(FiringRow).where(
                FiringRow.status == status))
        for name, positive in (("feedback_positive", True), ("feedback_negative", False)):
            figures[name] = await count(select(func.count()).select_from(FeedbackRow).where(
                FeedbackRow.positive == positive))
        return figures
