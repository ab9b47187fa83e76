"""Approval requests, grants and the audit log (SPEC §7)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sqlalchemy import or_, update
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from core.grants import GrantScope, GrantTerms
from core.model import ApprovalInfo, ApprovalStatus, InputStatus, SessionStatus
from core.store.database import Database
from core.store.requests import RequestRows
from core.store.row_views import session_info
from core.store.tables import ApprovalRow, ApprovalVoteRow, AuditRow, GrantRow, InputRow, SessionRow


class ApprovalStore:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.requests = RequestRows(db, ApprovalRow, waiting=SessionStatus.PENDING_APPROVAL, info=_info)

    async def park(self, row: ApprovalRow) -> ApprovalInfo:
        """Persist a new pending request and mark its session as waiting for a decision. It records
        who else's messages the turn had taken by now: approvers are shown everyone the call may
        come from, not only the turn's first sender."""
        async with self.db.write() as s:
            await _add_senders(s, row)
            # A turn waits on it (not, e.g., a schedule's destination): its session says so.
            return await self.requests.park_in(s, row, session_waits=row.turn_id is not None)

    async def park_batch(self, rows: list[ApprovalRow]) -> list[ApprovalInfo]:
        """Park one model step's gated calls together, in one commit (they share ``batch``): one card asks them all.
        Each records its senders as ``park`` does (a batch is no way round separation of duties)."""
        async with self.db.write() as s:
            parked = []
            for row in rows:
                await _add_senders(s, row)
                parked.append(await self.requests.park_in(s, row, session_waits=row.turn_id is not None))
            return parked

    async def batch(self, session_id: str, batch: str) -> list[ApprovalInfo]:
        """Every request of one batch (of that conversation), in call order."""
        async with self.db.read() as s:
            rows = (await s.exec(select(ApprovalRow).where(ApprovalRow.session_id == session_id,
                                                           ApprovalRow.batch == batch)
                                 .order_by(col(ApprovalRow.id)))).all()
            return [await _info(s, row) for row in rows]

    async def approve_edited(self, request_id: int, arguments: dict[str, Any], *, by: str, now: datetime,
                             detail: dict[str, Any]) -> tuple[bool, ApprovalInfo | None]:
        """Approve the edited call: the edit is stored first (in the same commit as the approval, only while the
        request is pending and not expired), and audited with both versions of the arguments."""
        async with self.db.write() as s:
            won, row = await self.requests.settle_in(
                s, request_id, {"status": ApprovalStatus.APPROVED, "decided_by": by, "decided_at": now,
                                "edited_arguments": json.dumps(arguments), "edited_by": by}, before=now)
            if won and row is not None:
                s.add(audit_row(now, by, "approval.edited", f"approval:{row.id}",
                                {"tool": row.tool, "session": row.session_id, "place": row.place,
                                 "policy": row.policy, **detail}))
                s.add(audit_row(now, by, f"approval.{ApprovalStatus.APPROVED}", f"approval:{row.id}",
                                {"tool": row.tool, "session": row.session_id, "place": row.place, "reason": None,
                                 "always": False, "policy": row.policy, "edited": True}))
            return won, (await _info(s, row) if row is not None else None)

    async def settle(
        self, request_id: int, status: str, *, by: str | None, reason: str | None, now: datetime,
        grant_call: str | None = None, grant: GrantTerms | None = None, detail: dict[str, Any] | None = None,
    ) -> tuple[bool, ApprovalInfo | None]:
        """Settle once: only a pending request changes, and a decision (approve, deny) only before it
        expires. Returns (won, the request as it now stands). An approval with ``grant`` (the exact call,
        where and until when: "Always allow", "Allow in this thread"; ``grant_call`` alone: the call at its
        place, for good) records its grant, and every outcome its audit line, in the same commit."""
        if grant is None and grant_call is not None:
            grant = GrantTerms(call=grant_call, scope=GrantScope.PLACE, thread=None, expires_at=None)
        async with self.db.write() as s:
            won, row = await self._settle_in(s, request_id, status, by=by, reason=reason, now=now, grant=grant,
                                             detail=detail)
            return won, (await _info(s, row) if row is not None else None)

    async def vote(self, request_id: int, voter: str, verdict: str, *, reason: str | None,
                   now: datetime) -> tuple[bool, bool, ApprovalInfo | None]:
        """One approver's vote on a request that needs several (its ``quorum``): (counted, won, the request
        as it now stands). A person's second vote changes nothing; one deny settles it denied; the vote that
        reaches the quorum settles it approved. The request's row is locked first, so concurrent votes (on
        any replica) are counted one after another and it is settled exactly once."""
        async with self.db.write() as s:
            locked = await s.exec(update(ApprovalRow).where(
                col(ApprovalRow.id) == request_id, col(ApprovalRow.status) == ApprovalStatus.PENDING,
                col(ApprovalRow.expires_at) > now).values(quorum=col(ApprovalRow.quorum)))
            if not locked.rowcount:  # settled already, or out of time (the caller settles it as expired)
                row = await s.get(ApprovalRow, request_id)
                return False, False, (await _info(s, row) if row is not None else None)
            seen = (await s.exec(select(ApprovalVoteRow.id).where(ApprovalVoteRow.approval_id == request_id,
                                                                   ApprovalVoteRow.voter == voter))).first()
            row = await s.get(ApprovalRow, request_id)
            assert row is not None
            if seen is not None:
                return False, False, await _info(s, row)
            s.add(ApprovalVoteRow(approval_id=request_id, voter=voter, verdict=verdict, voted_at=now))
            s.add(audit_row(now, voter, f"approval.vote.{verdict}", f"approval:{request_id}",
                            {"tool": row.tool, "session": row.session_id, "place": row.place, "reason": reason}))
            await s.flush()
            won = False
            if verdict == "deny":
                won, _ = await self._settle_in(s, request_id, ApprovalStatus.DENIED, by=voter, reason=reason,
                                               now=now)
            elif len(await _approvals_of(s, request_id)) >= row.quorum:
                won, _ = await self._settle_in(s, request_id, ApprovalStatus.APPROVED, by=voter, reason=None,
                                               now=now)
            await s.refresh(row)
            return True, won, await _info(s, row)

    async def get(self, request_id: int) -> ApprovalInfo | None:
        return await self.requests.get(request_id)

    async def for_call(self, session_id: str, tool_call_id: str) -> ApprovalInfo | None:
        return await self.requests.for_call(session_id, tool_call_id)

    async def remind(self, request_id: int, now: datetime) -> tuple[bool, ApprovalInfo | None]:
        """Mark the request reminded, once (whichever process gets there first), and let its ``escalate_to``
        join its approvers from now on; audited. (won, the request as it now stands)."""
        async with self.db.write() as s:
            result = await s.exec(update(ApprovalRow).where(
                col(ApprovalRow.id) == request_id, col(ApprovalRow.status) == ApprovalStatus.PENDING,
                col(ApprovalRow.expires_at) > now, col(ApprovalRow.reminded_at).is_(None)).values(reminded_at=now))
            row = await s.get(ApprovalRow, request_id)
            if row is None:
                return False, None
            won = bool(result.rowcount)
            if won:
                await s.refresh(row)
                joined = json.loads(row.escalate_to) if row.escalate_to else []
                if joined:
                    approvers = json.loads(row.approvers) if row.approvers else []
                    row.approvers = json.dumps(list(dict.fromkeys([*approvers, *joined])))
                    s.add(row)
                s.add(audit_row(now, "system", "approval.reminded", f"approval:{row.id}",
                                {"tool": row.tool, "session": row.session_id, "place": row.place,
                                 "escalated_to": joined or None}))
                await s.flush()
            return won, await _info(s, row)

    async def mark_started(self, request_id: int, now: datetime) -> None:
        async with self.db.write() as s:
            await s.exec(update(ApprovalRow).where(col(ApprovalRow.id) == request_id).values(started_at=now))

    async def record_announcement(self, request_id: int, where: dict[str, Any]) -> None:
        await self.requests.record_announcement(request_id, where)

    async def pending(self, *, due_before: datetime | None = None, session_id: str | None = None,
                      place: str | None = None, limit: int = 1000) -> list[ApprovalInfo]:
        """``place``: those asked at that place (filed there, or asked in a conversation there)."""
        asked_there = select(SessionRow.id).where(SessionRow.place == place)
        where = [or_(col(ApprovalRow.place) == place, col(ApprovalRow.session_id).in_(asked_there))] if place else []
        return await self.requests.pending(*where, due_before=due_before, session_id=session_id, limit=limit)

    async def recent(self, session_id: str, limit: int = 50) -> list[ApprovalInfo]:
        return await self.requests.recent(session_id, limit)

    async def _settle_in(self, s: AsyncSession, request_id: int, status: str, *, by: str | None,
                         reason: str | None, now: datetime, grant: GrantTerms | None = None,
                         detail: dict[str, Any] | None = None) -> tuple[bool, ApprovalRow | None]:
        always = grant is not None and status == ApprovalStatus.APPROVED
        decision = status in (ApprovalStatus.APPROVED, ApprovalStatus.DENIED)  # expiry and cancel settle regardless
        won, row = await self.requests.settle_in(
            s, request_id, {"status": status, "decided_by": by, "decided_at": now, "reason": reason, "always": always,
                            "grant_scope": grant.scope.value if always and grant is not None else None},
            before=now if decision else None)
        if won and row is not None:
            # Expired and denied stay apart here (and in the metrics): an expiry is nobody's decision.
            s.add(audit_row(now, by or "system", f"approval.{status}", f"approval:{row.id}",
                            {"tool": row.tool, "session": row.session_id, "place": row.place, "reason": reason,
                             "always": always, "policy": row.policy, **(detail or {})}))
            if always and grant is not None:
                await _record_grant(s, row, grant, by=by, now=now)
        return won, row

    # -- grants ---------------------------------------------------------------------------------

    async def grant_for(self, agent: str, tool: str, place: str | None, call: str, *, thread: str | None = None,
                        rule_key: str | None = None, now: datetime | None = None,
                        not_by: tuple[str, ...] = ()) -> GrantRow | None:
        """The active grant for exactly this call (its canonical arguments) here: one for the whole place, or
        for ``thread`` (the conversation asking, core.model.thread_of), made under the rule ``rule_key`` (None:
        under no rule), not expired at ``now`` (None: only grants that never expire) and made by nobody in
        ``not_by``. Equality only: a ``*`` in an approved command is a character, and a legacy pattern grant
        matches nothing."""
        scope = col(GrantRow.thread).is_(None) if thread is None else or_(col(GrantRow.thread).is_(None),
                                                                          col(GrantRow.thread) == thread)
        rule = col(GrantRow.rule_key).is_(None) if rule_key is None else col(GrantRow.rule_key) == rule_key
        live = col(GrantRow.expires_at).is_(None) if now is None else or_(col(GrantRow.expires_at).is_(None),
                                                                          col(GrantRow.expires_at) > now)
        makers = [col(GrantRow.created_by).not_in(not_by)] if not_by else []
        async with self.db.read() as s:
            return (await s.exec(select(GrantRow).where(
                GrantRow.agent == agent, GrantRow.tool == tool, GrantRow.place == place,
                GrantRow.call_text == call, col(GrantRow.call_text).is_not(None),
                col(GrantRow.revoked_at).is_(None), scope, rule, live, *makers).order_by(col(GrantRow.id)))).first()

    async def grants(self, *, include_revoked: bool = False, place: str | None = None,
                     now: datetime | None = None) -> list[GrantRow]:
        """Grants by id; without ``include_revoked`` only those not revoked, and with ``now`` only those not
        expired then."""
        async with self.db.read() as s:
            query = select(GrantRow)
            if not include_revoked:
                query = query.where(col(GrantRow.revoked_at).is_(None))
            if now is not None:
                query = query.where(or_(col(GrantRow.expires_at).is_(None), col(GrantRow.expires_at) > now))
            if place is not None:
                query = query.where(GrantRow.place == place)
            return list((await s.exec(query.order_by(col(GrantRow.id)))).all())

    async def revoke(self, grant_id: int, by: str, now: datetime) -> bool:
        async with self.db.write() as s:
            result = await s.exec(update(GrantRow)
                                  .where(col(GrantRow.id) == grant_id, col(GrantRow.revoked_at).is_(None))
                                  .values(revoked_at=now, revoked_by=by))
            if result.rowcount:
                s.add(audit_row(now, by, "grant.revoked", f"grant:{grant_id}", None))
            return bool(result.rowcount)

    async def audit(self, at: datetime, actor: str, action: str, subject: str, detail: dict[str, Any]) -> None:
        async with self.db.write() as s:
            s.add(audit_row(at, actor, action, subject, detail))

    async def audit_between(self, since: datetime, until: datetime | None = None) -> list[AuditRow]:
        """Every audit line from ``since`` (up to ``until``), oldest first: what ``bot audit export`` writes."""
        async with self.db.read() as s:
            query = select(AuditRow).where(col(AuditRow.at) >= since)
            if until is not None:
                query = query.where(col(AuditRow.at) < until)
            return list((await s.exec(query.order_by(col(AuditRow.at), col(AuditRow.id)))).all())


async def _record_grant(s: AsyncSession, row: ApprovalRow, grant: GrantTerms, *, by: str | None,
                        now: datetime) -> None:
    """The grant an approval made, and its audit line (where it holds, until when, under which rule). Never a
    pattern: the one call that was approved, at its place or in its thread."""
    record = GrantRow(agent=row.agent, tool=row.tool, place=row.place, call_text=grant.call,
                      created_by=by or "operator", created_at=now, thread=grant.thread,
                      expires_at=grant.expires_at, rule=grant.rule, rule_key=grant.rule_key)
    s.add(record)
    await s.flush()
    s.add(audit_row(now, by or "operator", "grant.created", f"grant:{record.id}",
                    {"approval": row.id, "agent": row.agent, "tool": row.tool, "place": row.place,
                     "scope": grant.scope.value, "thread": grant.thread,
                     "expires_at": grant.expires_at.isoformat() if grant.expires_at else None, "rule": grant.rule}))


async def _approvals_of(s: AsyncSession, request_id: int) -> list[str]:
    rows = await s.exec(select(ApprovalVoteRow.voter).where(ApprovalVoteRow.approval_id == request_id,
                                                            ApprovalVoteRow.verdict == "approve")
                        .order_by(col(ApprovalVoteRow.id)))
    return list(rows.all())


def audit_row(at: datetime, actor: str, action: str, subject: str, detail: dict[str, Any] | None) -> AuditRow:
    return AuditRow(at=at, actor=actor, action=action, subject=subject,
                    detail=json.dumps(detail) if detail is not None else None)


async def _info(s: AsyncSession, row: ApprovalRow) -> ApprovalInfo:
    session = await s.get(SessionRow, row.session_id)
    assert session is not None and row.id is not None
    return ApprovalInfo(
        id=row.id, session=session_info(session), tool=row.tool, arguments=json.loads(row.arguments),
        agent=row.agent, requester=row.requester, status=ApprovalStatus(row.status), parked_at=row.parked_at,
        expires_at=row.expires_at, decided_by=row.decided_by, reason=row.reason, always=row.always,
        announcement=json.loads(row.announcement) if row.announcement else None,
        started=row.started_at is not None, turn_id=row.turn_id,
        other_senders=tuple(json.loads(row.other_senders)) if row.other_senders else (),
        approvers=tuple(json.loads(row.approvers)) if row.approvers else (), quorum=row.quorum, policy=row.policy,
        approved_by=tuple(await _approvals_of(s, row.id)) if row.quorum > 1 else (), risk=row.risk,
        notify=tuple(json.loads(row.notify)) if row.notify else ("thread",), remind_at=row.remind_at,
        reminded=row.reminded_at is not None, grant_ttl_s=row.grant_ttl_s, grant_scope=row.grant_scope,
        grant_rule_key=row.grant_rule_key,
        senders=tuple(json.loads(row.senders)) if row.senders else (), self_approval=row.self_approval,
        step_up=row.step_up,
        batch=row.batch,
        edited_arguments=json.loads(row.edited_arguments) if row.edited_arguments else None, edited_by=row.edited_by,
    )


async def _add_senders(s: AsyncSession, row: ApprovalRow) -> None:
    """Who else's messages the turn had taken by now (``other_senders``, shown to approvers), and everyone the call
    may come from (``senders``, core.self_approval): the requester first, the turn's senders as the runner knew them,
    and every message the turn had taken."""
    others: list[str] = []
    if row.turn_id is not None:
        senders = (await s.exec(select(InputRow.sender).where(
            InputRow.turn_id == row.turn_id, InputRow.status == InputStatus.TAKEN).order_by(col(InputRow.id)))).all()
        others = list(dict.fromkeys(x for x in senders if x and x != row.requester))
        row.other_senders = json.dumps(others) if others else None
    given = json.loads(row.senders) if row.senders else []
    everyone = list(dict.fromkeys(x for x in (row.requester, *given, *others) if x))
    row.senders = json.dumps(everyone) if everyone else None
