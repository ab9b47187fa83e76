"""Approval requests, grants and the audit log (SPEC §7)."""

from __future__ import annotations

import fnmatch
import json
from datetime import datetime
from typing import Any

from sqlalchemy import update
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from core.model import ApprovalInfo, ApprovalStatus, SessionStatus
from core.store.conversations import session_info
from core.store.database import Database
from core.store.tables import ApprovalRow, AuditRow, GrantRow, SessionRow


class ApprovalStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def park(self, row: ApprovalRow) -> ApprovalInfo:
        """Persist a new pending request and mark its session as waiting for a decision."""
        async with self.db.write() as s:
            s.add(row)
            if row.turn_id is not None:  # a turn waits on it (not, e.g., a schedule's destination)
                await s.exec(update(SessionRow).where(col(SessionRow.id) == row.session_id)
                             .values(status=SessionStatus.PENDING_APPROVAL))
            await s.flush()
            return await _info(s, row)

    async def settle(
        self, request_id: int, status: str, *, by: str | None, reason: str | None, always: bool, now: datetime,
        grant_pattern: str | None = None,
    ) -> tuple[bool, ApprovalInfo | None]:
        """Settle once: only a pending request changes. Returns (won, the request as it now stands).
        An "always" approval records its grant, and every decision its audit line, in the same commit."""
        async with self.db.write() as s:
            result = await s.exec(
                update(ApprovalRow)
                .where(col(ApprovalRow.id) == request_id, col(ApprovalRow.status) == ApprovalStatus.PENDING)
                .values(status=status, decided_by=by, decided_at=now, reason=reason, always=always)
            )
            won = bool(result.rowcount)
            row = await s.get(ApprovalRow, request_id)
            if row is None:
                return False, None
            await s.refresh(row)
            if won:
                await s.exec(update(SessionRow)
                             .where(col(SessionRow.id) == row.session_id,
                                    col(SessionRow.status) == SessionStatus.PENDING_APPROVAL)
                             .values(status=SessionStatus.RUNNING))
                if always and status == ApprovalStatus.APPROVED:
                    s.add(GrantRow(agent=row.agent, tool=row.tool, place=row.place, arg_pattern=grant_pattern,
                                   created_by=by or "operator", created_at=now))
                s.add(audit_row(now, by or "system", f"approval.{status}", f"approval:{row.id}",
                             {"tool": row.tool, "session": row.session_id, "reason": reason, "always": always}))
            return won, await _info(s, row)

    async def get(self, request_id: int) -> ApprovalInfo | None:
        async with self.db.read() as s:
            row = await s.get(ApprovalRow, request_id)
            return await _info(s, row) if row is not None else None

    async def for_call(self, session_id: str, tool_call_id: str) -> ApprovalInfo | None:
        async with self.db.read() as s:
            row = (await s.exec(select(ApprovalRow).where(ApprovalRow.session_id == session_id,
                                                          ApprovalRow.tool_call_id == tool_call_id)
                                .order_by(col(ApprovalRow.id).desc()))).first()
            return await _info(s, row) if row is not None else None

    async def mark_started(self, request_id: int, now: datetime) -> None:
        async with self.db.write() as s:
            await s.exec(update(ApprovalRow).where(col(ApprovalRow.id) == request_id).values(started_at=now))

    async def record_announcement(self, request_id: int, where: dict[str, Any]) -> None:
        async with self.db.write() as s:
            await s.exec(update(ApprovalRow).where(col(ApprovalRow.id) == request_id)
                         .values(announcement=json.dumps(where)))

    async def pending(self, *, due_before: datetime | None = None, session_id: str | None = None,
                      limit: int = 1000) -> list[ApprovalInfo]:
        async with self.db.read() as s:
            query = select(ApprovalRow).where(ApprovalRow.status == ApprovalStatus.PENDING)
            if due_before is not None:
                query = query.where(col(ApprovalRow.expires_at) <= due_before)
            if session_id is not None:
                query = query.where(ApprovalRow.session_id == session_id)
            rows = (await s.exec(query.order_by(col(ApprovalRow.id)).limit(limit))).all()
            return [await _info(s, r) for r in rows]

    async def recent(self, session_id: str, limit: int = 50) -> list[ApprovalInfo]:
        async with self.db.read() as s:
            rows = (await s.exec(select(ApprovalRow).where(ApprovalRow.session_id == session_id)
                                 .order_by(col(ApprovalRow.id).desc()).limit(limit))).all()
            return [await _info(s, r) for r in reversed(rows)]

    # -- grants ---------------------------------------------------------------------------------

    async def grant_for(self, agent: str, tool: str, place: str | None, subject: str | None) -> GrantRow | None:
        """An active grant covering this call; ``subject`` is the argument grant patterns match."""
        async with self.db.read() as s:
            rows = (await s.exec(select(GrantRow).where(
                GrantRow.agent == agent, GrantRow.tool == tool, GrantRow.place == place,
                col(GrantRow.revoked_at).is_(None)))).all()
            for grant in rows:
                if grant.arg_pattern is None or (subject is not None
                                                 and fnmatch.fnmatchcase(subject, grant.arg_pattern)):
                    return grant
            return None

    async def add_grant(self, grant: GrantRow) -> GrantRow:
        async with self.db.write() as s:
            s.add(grant)
            s.add(audit_row(grant.created_at, grant.created_by, "grant.added", f"{grant.agent}:{grant.tool}",
                         {"place": grant.place, "pattern": grant.arg_pattern}))
            await s.flush()
            return grant

    async def grants(self, *, include_revoked: bool = False) -> list[GrantRow]:
        async with self.db.read() as s:
            query = select(GrantRow)
            if not include_revoked:
                query = query.where(col(GrantRow.revoked_at).is_(None))
            return list((await s.exec(query.order_by(col(GrantRow.id)))).all())

    async def revoke(self, grant_id: int, by: str, now: datetime) -> bool:
        async with self.db.write() as s:
            result = await s.exec(update(GrantRow)
                                  .where(col(GrantRow.id) == grant_id, col(GrantRow.revoked_at).is_(None))
                                  .values(revoked_at=now, revoked_by=by))
            if result.rowcount:
                s.add(audit_row(now, by, "grant.revoked", f"grant:{grant_id}", None))
            return bool(result.rowcount)

    async def audit_log(self, limit: int = 100) -> list[AuditRow]:
        async with self.db.read() as s:
            rows = (await s.exec(select(AuditRow).order_by(col(AuditRow.id).desc()).limit(limit))).all()
            return list(reversed(rows))


def audit_row(at: datetime, actor: str, action: str, subject: str, detail: dict[str, Any] | None) -> AuditRow:
    return AuditRow(at=at, actor=actor, action=action, subject=subject,
                    detail=json.dumps(detail) if detail is not None else None)


async def _info(s: AsyncSession, row: ApprovalRow) -> ApprovalInfo:
    session = await s.get(SessionRow, row.session_id)
    assert session is not None and row.id is not None
    return ApprovalInfo(
        id=row.id, session=session_info(session), tool=row.tool, arguments=json.loads(row.arguments),
        agent=row.agent, requester=row.requester, status=row.status, parked_at=row.parked_at,
        expires_at=row.expires_at, decided_by=row.decided_by, reason=row.reason, always=row.always,
        announcement=json.loads(row.announcement) if row.announcement else None,
        started=row.started_at is not None,
    )
