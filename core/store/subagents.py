"""Sub-agent runs (core.subagents): each is a session ``sub:<parent session>:<n>`` with one turn and its own
transcript, in the ordinary session, turn and message tables, so it is durable and can be read like any
conversation. Its ``reply_ref`` records where it came from (the parent's turn and tool call), never where to
post: nothing is ever posted from a sub-agent's session."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import update
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from core.model import SUBAGENT_PREFIX, SessionInfo, SessionStatus, TurnInfo, TurnStatus, thread_of
from core.store.database import Database
from core.store.tables import MessageRow, SessionRow, TurnRow

INTERRUPTED = "interrupted by a restart; not re-run"


@dataclass(frozen=True)
class SubAgentRun:
    session_id: str
    agent: str
    turn_id: int
    status: str
    answer: str | None
    error: str | None
    call_id: str
    parent_turn: int | None


class SubAgentStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def open(self, parent: str, *, parent_turn: int, call_id: str, agent: str, task: str,
                   sender: str | None, place: str | None, channel: str, now: datetime) -> TurnInfo:
        """The next sub-agent session of ``parent``, its running turn and the task as its first message:
        one commit. Numbered per parent session: one turn's sub-agents may start at once, so the parent's row is
        locked first (PostgreSQL; SQLite's writes are one at a time anyway) and each reads the numbers taken after
        the one before it committed."""
        prefix = f"{SUBAGENT_PREFIX}{parent}:"
        origin = {"parent": parent, "parent_turn": parent_turn, "call_id": call_id}
        async with self.db.write() as s:
            # FOR NO KEY UPDATE: orders two opens, yet lets rows that refer to the parent (its messages) be written
            await s.exec(select(SessionRow.id).where(col(SessionRow.id) == parent).with_for_update(key_share=True))
            taken = (await s.exec(select(SessionRow.id).where(
                col(SessionRow.id).startswith(prefix, autoescape=True)))).all()
            n = 1 + max((_number(i, prefix) for i in taken), default=0)
            session = SessionInfo(id=f"{prefix}{n}", channel=channel, agent=agent, status=SessionStatus.RUNNING,
                                  reply_ref=origin, place=place)
            s.add(SessionRow(id=session.id, channel=channel, agent=agent, status=SessionStatus.RUNNING,
                             reply_ref=json.dumps(origin), place=place, created_at=now, updated_at=now))
            await s.flush()
            turn = TurnRow(session_id=session.id, agent=agent, status=TurnStatus.RUNNING, attempts=1,
                           created_at=now, started_at=now)
            s.add(turn)
            await s.flush()
            assert turn.id is not None
            s.add(MessageRow(session_id=session.id, role="user", content=task, sender=sender, turn_id=turn.id,
                             created_at=now))
        senders = (sender,) if sender else ()
        return TurnInfo(id=turn.id, session=session, inputs=(), sender=sender, senders=senders)

    async def for_call(self, parent: str, call_id: str, parent_turn: int) -> SubAgentRun | None:
        """The run a parent's tool call started, if it got that far."""
        return next((r for r in await self.runs(parent) if r.call_id == call_id and r.parent_turn == parent_turn),
                    None)

    async def runs(self, parent: str) -> list[SubAgentRun]:
        """Every sub-agent run of the conversation ``parent``, oldest first."""
        prefix = f"{SUBAGENT_PREFIX}{parent}:"
        async with self.db.read() as s:
            rows = (await s.exec(
                select(SessionRow, TurnRow)
                .join(TurnRow, col(TurnRow.session_id) == col(SessionRow.id))
                .where(col(SessionRow.id).startswith(prefix, autoescape=True))
            )).all()
        runs = []
        for session, turn in rows:
            if not _number(session.id, prefix):
                continue  # a sub-agent of another conversation whose id begins like this one's
            origin = SessionInfo.parse_reply_ref(session.reply_ref)
            runs.append(SubAgentRun(session_id=session.id, agent=turn.agent, turn_id=int(turn.id or 0),
                                    status=turn.status, answer=turn.answer, error=turn.error,
                                    call_id=str(origin.get("call_id") or ""), parent_turn=origin.get("parent_turn")))
        return sorted(runs, key=lambda r: _number(r.session_id, prefix))


async def interrupt_subagents(s: AsyncSession, parents: Iterable[str] | None, now: datetime) -> int:
    """Sub-agent turns a dead process left running (of the conversations ``parents``; None: all) end as
    failed, never continued: a sub-agent is never silently re-run. Its parent, when it resumes, is told."""
    rows = (await s.exec(select(TurnRow.id, TurnRow.session_id).where(
        col(TurnRow.status).in_((TurnStatus.RUNNING, TurnStatus.QUEUED)),
        col(TurnRow.session_id).startswith(SUBAGENT_PREFIX, autoescape=True)))).all()
    wanted = set(parents) if parents is not None else None
    dead = [(t, sid) for t, sid in rows if wanted is None or thread_of(sid) in wanted]
    if dead:
        await s.exec(update(TurnRow).where(col(TurnRow.id).in_([t for t, _ in dead])).values(
            status=TurnStatus.FAILED, error=INTERRUPTED, finished_at=now))
        await s.exec(update(SessionRow).where(col(SessionRow.id).in_([sid for _, sid in dead])).values(
            status=SessionStatus.FAILED, updated_at=now))
    return len(dead)


def _number(session_id: str, prefix: str) -> int:
    tail = session_id[len(prefix):]
    return int(tail) if tail.isdigit() else 0
