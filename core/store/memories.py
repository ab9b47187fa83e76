"""An agent's memories (SPEC §17): stored, counted against the agent's limit, searched by words, forgotten.

Search is by words on both backends, with one meaning: the query's words (letters and digits; everything else
separates them), each matching as a word or a word's beginning (a one-character word only as a word), any of
them; the best matches first (bm25 on SQLite, ``ts_rank`` on PostgreSQL), newer first among equals. The query is
never handed to a search syntax as written: only its words go in, quoted (FTS5) or as plain lexemes
(``to_tsquery``), so ``"``, ``*``, ``NEAR``, ``-``, ``:`` or ``!`` can neither fail the search nor change what it
means.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, false, func, insert, select, text, true, update
from sqlmodel import Session

from core.errors import Conflict
from core.store.approvals import audit_row
from core.store.database import Database
from core.store.tables import MemoryRow

memories = MemoryRow.__table__  # type: ignore[attr-defined]

# What the search needs beside the table, made by migration 0020 and not described by the table metadata (SQLite's
# FTS5 tables; PostgreSQL's generated column and its index): schema comparisons leave them out (``in_metadata``).
SEARCH_TABLES = frozenset({"memories_fts", "memories_fts_data", "memories_fts_idx", "memories_fts_docsize",
                           "memories_fts_config"})
SEARCH_COLUMN, SEARCH_INDEX = "text_search", "ix_memories_search"
MAX_TERMS = 16  # words of a query searched for (the rest are dropped)
MAX_TERM_CHARS = 64
_WORD = re.compile(r"[^\W_]+")  # letters and digits: FTS5's unicode61 and PostgreSQL's parser both split on the rest

_SQLITE_SEARCH = text(
    "SELECT m.id, m.agent, m.text, m.pinned, m.proposed, m.written_by, m.session_id, m.created_at "
    "FROM memories_fts JOIN memories AS m ON m.id = memories_fts.rowid "
    "WHERE memories_fts MATCH :query AND m.agent = :agent "
    "ORDER BY bm25(memories_fts), m.id DESC LIMIT :limit").columns(*memories.c)
# ``text_search``: the stored ``to_tsvector('simple', text)``, GIN-indexed (migration 0020).
_POSTGRES_SEARCH = text(
    "SELECT m.id, m.agent, m.text, m.pinned, m.proposed, m.written_by, m.session_id, m.created_at "
    "FROM memories AS m, to_tsquery('simple', :query) AS q "
    "WHERE m.agent = :agent AND m.text_search @@ q "
    "ORDER BY ts_rank(m.text_search, q) DESC, m.id DESC LIMIT :limit").columns(*memories.c)


def in_metadata(name: str | None, type_: str, parents: Any = None) -> bool:
    """For schema comparisons (alembic ``include_name``): False for the search's own tables, column and index."""
    if type_ == "table":
        return name not in SEARCH_TABLES
    if type_ in ("column", "index"):
        on_memories = (parents or {}).get("table_name") == "memories"
        return not (on_memories and name == (SEARCH_COLUMN if type_ == "column" else SEARCH_INDEX))
    return True


def search_terms(query: str) -> list[str]:
    """The words searched for in ``query``: lower case, each once, at most ``MAX_TERMS``."""
    words = dict.fromkeys(word[:MAX_TERM_CHARS] for word in _WORD.findall(query.lower()))
    return list(words)[:MAX_TERMS]


@dataclass(frozen=True)
class Memory:
    id: int
    agent: str
    text: str
    pinned: bool
    proposed: bool
    written_by: str | None
    session_id: str | None
    created_at: datetime


@dataclass(frozen=True)
class NewMemory:
    agent: str
    text: str
    pinned: bool = False
    proposed: bool = False
    written_by: str | None = None
    session_id: str | None = None


@dataclass(frozen=True)
class Added:
    memory: Memory
    created: bool  # False: the agent already held this text (pinned now if asked)
    evicted: tuple[int, ...] = ()  # the oldest unpinned ones that made room


class MemoryFull(Conflict):
    """Every one of the agent's memories is pinned and there are as many as it may keep."""


class MemoryStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def add(self, new: NewMemory, *, max_items: int, now: datetime, actor: str) -> Added:
        """Store ``new`` (audited as ``actor``'s), or pin the same text the agent already holds. At ``max_items``
        the agent's oldest unpinned memories make room; when all are pinned, MemoryFull."""
        return await self.db.run_write(lambda s: self._add(s, new, max_items, now, actor))

    def _add(self, s: Session, new: NewMemory, max_items: int, now: datetime, actor: str) -> Added:
        conn = s.connection()
        if not self.db.is_sqlite:  # one writer per agent at a time, so the count below stays true (SQLite: always)
            conn.execute(select(func.pg_advisory_xact_lock(_lock_key(new.agent))))
        same = conn.execute(select(memories).where(memories.c.agent == new.agent, memories.c.text == new.text)
                            .order_by(memories.c.id).limit(1)).first()
        if same is not None:
            if new.pinned and not same.pinned:
                conn.execute(update(memories).where(memories.c.id == same.id).values(pinned=True))
                s.add(audit_row(now, actor, "memory.pinned", f"memory:{same.id}", {"agent": new.agent}))
                return Added(_memory(same, pinned=True), created=False)
            return Added(_memory(same), created=False)
        held = int(conn.execute(select(func.count()).where(memories.c.agent == new.agent)).scalar_one())
        evicted: list[int] = []
        if held >= max_items:
            need = held - max_items + 1
            evicted = list(conn.execute(
                select(memories.c.id).where(memories.c.agent == new.agent, memories.c.pinned == false())
                .order_by(memories.c.id).limit(need)).scalars())
            if len(evicted) < need:
                raise MemoryFull(f"agent {new.agent} holds {held} memories, all pinned, and may keep {max_items}: "
                                 "forget one first")
            conn.execute(delete(memories).where(memories.c.id.in_(evicted)))
            s.add(audit_row(now, actor, "memory.evicted", f"agent:{new.agent}",
                            {"ids": evicted, "max_items": max_items}))
        values: dict[str, Any] = {"agent": new.agent, "text": new.text, "pinned": new.pinned, "proposed": new.proposed,
                  "written_by": new.written_by, "session_id": new.session_id, "created_at": now}
        memory_id = int(conn.execute(insert(memories).values(**values).returning(memories.c.id)).scalar_one())
        s.add(audit_row(now, actor, "memory.proposed" if new.proposed else "memory.remembered",
                        f"memory:{memory_id}", {"agent": new.agent, "pinned": new.pinned,
                                                "session": new.session_id, "text": new.text}))
        return Added(Memory(id=memory_id, **values), created=True, evicted=tuple(evicted))

    async def forget(self, memory_id: int, *, agent: str | None, now: datetime, actor: str) -> Memory | None:
        """Delete memory ``memory_id`` (only if it is ``agent``'s, when one is named), audited with its text; None
        when there is no such memory."""
        def work(s: Session) -> Memory | None:
            query = select(memories).where(memories.c.id == memory_id)
            if agent is not None:
                query = query.where(memories.c.agent == agent)
            row = s.connection().execute(query).first()
            if row is None:
                return None
            s.connection().execute(delete(memories).where(memories.c.id == memory_id))
            s.add(audit_row(now, actor, "memory.forgotten", f"memory:{memory_id}",
                            {"agent": row.agent, "pinned": row.pinned, "text": row.text}))
            return _memory(row)

        return await self.db.run_write(work)

    async def search(self, agent: str, query: str, *, limit: int) -> list[Memory]:
        """``agent``'s memories that hold any word of ``query`` (see the module's note), best first; with no word
        in it, the newest."""
        terms = search_terms(query)
        if not terms:
            return await self.recent(agent, limit=limit)
        # A one-character beginning matches nearly every memory through hundreds of words: sixteen of them ("a b c
        # … p") made one recall over 10,000 memories cost 1.2 s on SQLite (48 ms as words).
        if self.db.is_sqlite:
            statement, phrase = _SQLITE_SEARCH, " OR ".join(
                f'"{term}"*' if len(term) > 1 else f'"{term}"' for term in terms)
        else:
            statement, phrase = _POSTGRES_SEARCH, " | ".join(
                f"{term}:*" if len(term) > 1 else term for term in terms)
        params = {"query": phrase, "agent": agent, "limit": limit}
        rows = await self.db.run_read(lambda s: s.connection().execute(statement, params).all())
        return [_memory(row) for row in rows]

    async def pinned(self, agent: str, *, limit: int) -> list[Memory]:
        """``agent``'s pinned memories, newest first."""
        return await self._rows(select(memories).where(memories.c.agent == agent, memories.c.pinned == true())
                                .order_by(memories.c.id.desc()).limit(limit))

    async def recent(self, agent: str | None, *, limit: int) -> list[Memory]:
        """The newest memories, of ``agent`` or of every agent."""
        query = select(memories).order_by(memories.c.id.desc()).limit(limit)
        if agent is not None:
            query = query.where(memories.c.agent == agent)
        return await self._rows(query)

    async def count(self, agent: str) -> int:
        return int(await self.db.run_read(lambda s: s.connection().execute(
            select(func.count()).where(memories.c.agent == agent)).scalar_one()))

    async def get(self, memory_id: int) -> Memory | None:
        rows = await self._rows(select(memories).where(memories.c.id == memory_id))
        return rows[0] if rows else None

    async def _rows(self, query: Any) -> list[Memory]:
        return [_memory(row) for row in await self.db.run_read(lambda s: s.connection().execute(query).all())]


def _memory(row: Any, **changed: Any) -> Memory:
    values = {"id": row.id, "agent": row.agent, "text": row.text, "pinned": bool(row.pinned),
              "proposed": bool(row.proposed), "written_by": row.written_by, "session_id": row.session_id,
              "created_at": row.created_at}
    return Memory(**(values | changed))


def _lock_key(agent: str) -> int:
    """A signed 64-bit key for ``pg_advisory_xact_lock``, the same in every process for one agent."""
    return int.from_bytes(hashlib.sha256(f"memories:{agent}".encode()).digest()[:8], "big", signed=True)
