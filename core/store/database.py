"""The async engine, SQLite tuning, read/write transactions and schema migrations."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Engine, Executable, Row, create_engine, event, inspect, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import ArgumentError, InvalidatePoolError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.util import greenlet_spawn
from sqlmodel import Session
from sqlmodel.ext.asyncio.session import AsyncSession

from core.errors import SchemaTooNew, StoreError
from core.store.sqlite_checkpoint import (
    AUTOCHECKPOINT_PAGES,
    CHECKPOINT_DELAY_S,
    WAL_SIZE_LIMIT_BYTES,
    SQLiteCheckpointer,
)
from core.store.sqlite_writer import SQLiteWriter

if TYPE_CHECKING:
    from alembic.script import ScriptDirectory

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 10_000
_NO_LOCK = contextlib.nullcontext()
SQLITE_SYNCHRONOUS = ("NORMAL", "FULL")
# The advisory lock every migration takes on PostgreSQL ("chatops" in ASCII): one key, whatever the database's name.
MIGRATION_LOCK_KEY = 0x63_68_61_74_6F_70_73
PING_IDLE_S = 2.0  # a pooled PostgreSQL connection idle this long is pinged before it is used
# DATABASE_URL's own option (no driver knows it; taken out before one sees the URL): `?prepared_statements=false` for
# PostgreSQL behind a pooler in transaction mode that does not track prepared statements (PgBouncer before 1.21, or
# without max_prepared_statements). Its next transaction may run on another server connection, where a statement the
# driver prepared and cached does not exist, or where another client's statement holds the same name.
PREPARED_STATEMENTS_OPTION = "prepared_statements"
T = TypeVar("T")


def async_url(url: str) -> str:
    """Map a plain SQLAlchemy URL to its async driver (sqlite → aiosqlite, postgresql → asyncpg)."""
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise StoreError(f"DATABASE_URL is not a valid SQLAlchemy URL: {url!r}") from exc
    backend = parsed.get_backend_name()
    # Only an explicit "+driver" counts: the implied default driver differs between SQLAlchemy versions.
    driver = parsed.drivername.partition("+")[2]
    if backend == "sqlite":
        if driver != "aiosqlite":
            parsed = parsed.set(drivername="sqlite+aiosqlite")
    elif backend == "postgresql":
        if driver not in ("asyncpg", "psycopg"):
            parsed = parsed.set(drivername="postgresql+asyncpg")
    else:
        raise StoreError(f"DATABASE_URL must be sqlite or postgresql, not {backend!r}")
    return parsed.render_as_string(hide_password=False)


def _prepared_statements(url: str) -> tuple[str, bool]:
    """``url`` without PREPARED_STATEMENTS_OPTION, and whether it allows prepared statements (the default)."""
    parsed = make_url(url)
    value = parsed.query.get(PREPARED_STATEMENTS_OPTION)
    if value is None:
        return url, True
    if value not in ("true", "false"):
        raise StoreError(f"DATABASE_URL: {PREPARED_STATEMENTS_OPTION} must be true or false, not {value!r}")
    return parsed.difference_update_query([PREPARED_STATEMENTS_OPTION]).render_as_string(hide_password=False), \
        value == "true"


def _unique_statement_name() -> str:
    # asyncpg numbers its statements per client connection: behind a pooler two clients' "__asyncpg_stmt_1__" meet
    # on one server connection. Never reused, and prepared inside the transaction that runs it.
    return f"__asyncpg_{uuid.uuid4().hex}__"


class Database:
    """One engine for the process. ``write()`` transactions take SQLite's write lock up front."""

    def __init__(self, url: str, *, echo: bool = False, sqlite_synchronous: str = "NORMAL", pool_size: int = 5,
                 sqlite_checkpoint_delay_s: float = CHECKPOINT_DELAY_S) -> None:
        self.url = async_url(url)
        self._engine_url, self.prepared_statements = _prepared_statements(self.url)
        self.is_sqlite = self.url.startswith("sqlite")
        if sqlite_synchronous.upper() not in SQLITE_SYNCHRONOUS:
            raise StoreError(f"SQLITE_SYNCHRONOUS must be one of {', '.join(SQLITE_SYNCHRONOUS)}, "
                             f"not {sqlite_synchronous!r}")
        self.sqlite_synchronous = sqlite_synchronous.upper()
        kwargs: dict[str, Any] = {"echo": echo}
        self._fast: SQLiteWriter | None = None
        self._checkpointer: SQLiteCheckpointer | None = None
        self._insert_or_ignore: dict[Any, sqlite.Insert | postgresql.Insert] = {}
        # SQLite has one writer at a time. Queueing our own writers here keeps them out of SQLite's
        # busy handler, which sleeps in growing steps (up to 100 ms) while another connection writes.
        self._write_turn = asyncio.Lock()
        if self.is_sqlite:
            path = make_url(self.url).database
            if path and path != ":memory:":
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            kwargs["connect_args"] = {"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}
        else:
            # Kept open for the busy case (turns, intake's group writers, reads, leases): past the pool's
            # size each checkout opens a new connection (TLS attempt, auth) and closes it after use.
            kwargs["pool_size"] = pool_size
            kwargs["max_overflow"] = pool_size
            if not self.prepared_statements:
                kwargs["connect_args"] = ({"prepare_threshold": None} if "+psycopg" in self.url else {
                    "statement_cache_size": 0, "prepared_statement_cache_size": 0,
                    "prepared_statement_name_func": _unique_statement_name})
        self.engine: AsyncEngine = create_async_engine(self._engine_url, **kwargs)
        self._write_engine = self.engine.execution_options(sqlite_begin="IMMEDIATE") if self.is_sqlite else self.engine
        # One statement that is its own transaction (``run_alone``): no BEGIN, no COMMIT, each a round trip.
        self._alone_engine = None if self.is_sqlite else self.engine.execution_options(isolation_level="AUTOCOMMIT")
        on_file = self.is_sqlite and make_url(self.url).database not in (None, "", ":memory:")
        if self.is_sqlite:
            _tune_sqlite(self.engine, self.sqlite_synchronous, own_checkpoints=on_file)
        else:
            _ping_when_idle(self.engine)
        if on_file:
            # The hot path's writes (intake, turns, deliveries) run on a thread of their own (see
            # core.store.sqlite_writer), queued behind the same write turn as the async writers; the
            # WAL's checkpoints on another (core.store.sqlite_checkpoint), out of every commit's way.
            fast = create_engine(self.sync_url, echo=echo, connect_args={
                "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, "check_same_thread": False})
            _tune_sqlite(fast, self.sqlite_synchronous, own_checkpoints=True)
            self._checkpointer = SQLiteCheckpointer(fast, delay_s=sqlite_checkpoint_delay_s)
            self._fast = SQLiteWriter(fast.execution_options(sqlite_begin="IMMEDIATE"), self._write_turn,
                                      on_commit=self._checkpointer.wrote)

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncSession]:
        async with AsyncSession(self.engine, expire_on_commit=False) as session:
            yield session

    @asynccontextmanager
    async def write(self) -> AsyncIterator[AsyncSession]:
        """A transaction that commits when the block ends, or rolls back on error."""
        async with self._write_lock(), AsyncSession(self._write_engine, expire_on_commit=False) as session:
            async with session.begin():
                yield session
        self._wrote()

    async def run_read(self, work: Callable[[Session], T]) -> T:
        """Run ``work`` (synchronous statements) on a read connection: for code shared with ``run_write``."""
        return await greenlet_spawn(self._read_through, work)

    async def run_write(self, work: Callable[[Session], T], *, urgent: bool = False) -> T:
        """Run ``work`` (synchronous ORM or Core statements) in one write transaction, committed when it
        returns, rolled back if it raises. On SQLite the whole transaction is one call on the writer
        thread; on PostgreSQL it runs in one greenlet on the async driver. ``work`` does nothing but
        database work: it may run on another thread. ``urgent``: someone (an ack) is waiting for it, so
        on SQLite it goes before queued turn writes."""
        if self._fast is not None:
            return await self._fast.run(work, urgent=urgent)
        async with self._write_lock():
            # The whole transaction (checkout, BEGIN, statements, COMMIT, checkin) in one greenlet: the async
            # session's layers would switch into one per step.
            result = await greenlet_spawn(self._write_through, work)
        self._wrote()
        return result

    async def run_alone(self, statement: Executable, params: dict[str, Any]) -> Sequence[Row[Any]]:
        """One write statement that is a whole transaction, committed when this returns; its RETURNING rows.
        On PostgreSQL it runs in autocommit: the server commits it before it answers, with the same durability
        as a transaction's COMMIT (synchronous_commit is the server's), in one round trip instead of three.
        On SQLite it is a ``run_write`` of its own."""
        if self._alone_engine is None:
            return await self.run_write(lambda s: s.connection().execute(statement, params).all())
        return await greenlet_spawn(self._alone_through, statement, params)

    def _alone_through(self, statement: Executable, params: dict[str, Any]) -> Sequence[Row[Any]]:
        assert self._alone_engine is not None
        with self._alone_engine.sync_engine.connect() as conn:
            return conn.execute(statement, params).all()

    def _write_through(self, work: Callable[[Session], T]) -> T:
        with self._write_engine.sync_engine.begin() as conn, Session(bind=conn, expire_on_commit=False) as session:
            result = work(session)
            session.flush()  # what the work added through the ORM is written before the commit
            return result

    def _read_through(self, work: Callable[[Session], T]) -> T:
        with self.engine.sync_engine.connect() as conn, Session(bind=conn, expire_on_commit=False) as session:
            return work(session)

    def _wrote(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.wrote()

    def _write_lock(self) -> asyncio.Lock | contextlib.nullcontext[None]:
        return self._write_turn if self.is_sqlite else _NO_LOCK

    @asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        """No write transaction of this process is open inside this block (SQLite): synchronous code
        that writes to the same file (APScheduler's job store) can run here without waiting on us."""
        async with self._write_lock():
            yield
        self._wrote()

    def insert(self, table: Any) -> sqlite.Insert | postgresql.Insert:
        """An INSERT in this database's dialect, which can say what a conflict does
        (``on_conflict_do_nothing`` / ``on_conflict_do_update``): the one place the dialects differ."""
        return sqlite.insert(table) if self.is_sqlite else postgresql.insert(table)

    def insert_or_ignore(self, table: Any) -> sqlite.Insert | postgresql.Insert:
        """``INSERT … ON CONFLICT DO NOTHING`` for ``table``, built once per table (a hot path's statement:
        see core.store.statements); the columns come from the parameters it is executed with."""
        statement = self._insert_or_ignore.get(table)
        if statement is None:
            statement = self._insert_or_ignore[table] = self.insert(table).on_conflict_do_nothing()
        return statement

    @property
    def write_in_progress(self) -> bool:
        return self.is_sqlite and self._write_turn.locked()

    def sync_engine(self, **options: Any) -> Engine:
        """A synchronous engine on the same database (APScheduler's job store), tuned like ours."""
        if not self.is_sqlite and not self.prepared_statements:  # psycopg prepares a query run 5 times, by name
            options["connect_args"] = {**options.get("connect_args", {}), "prepare_threshold": None}
        engine = create_engine(self.sync_url, **options)
        if self.is_sqlite:
            _tune_sqlite(engine, self.sqlite_synchronous, own_checkpoints=self._checkpointer is not None)
        return engine

    @property
    def sync_url(self) -> str:
        """The same database for synchronous clients (APScheduler's SQLAlchemyJobStore)."""
        url = make_url(self._engine_url)
        if url.get_backend_name() == "sqlite":
            url = url.set(drivername="sqlite")
        else:
            url = url.set(drivername="postgresql+psycopg")
        return url.render_as_string(hide_password=False)

    async def ping(self) -> None:
        async with self.engine.connect() as conn:
            await conn.execute(text("SELECT 1"))

    async def migrate(self) -> SchemaChange:
        """Bring the schema to the newest version, in place; a no-op when it is current. Safe to run from several
        processes at once (``bot migrate`` in each replica or an init container): on PostgreSQL one migrates while
        the others wait, then find nothing to do; SQLite's write lock does the same. A schema newer than this code
        raises SchemaTooNew and is left as it is."""
        try:
            async with self._write_engine.begin() as conn:
                change = await conn.run_sync(_upgrade_to_head)
        except (SQLAlchemyError, OSError) as exc:  # OSError: the server refused or its name did not resolve
            raise StoreError(f"could not open or migrate the database {self.display_url}: {exc}") from exc
        self._wrote()
        return change

    @property
    def display_url(self) -> str:
        return make_url(self.url).render_as_string(hide_password=True)

    async def close(self) -> None:
        await self.engine.dispose()
        if self._checkpointer is not None:
            await self._checkpointer.close()
        if self._fast is not None:
            await self._fast.close()


def _tune_sqlite(engine: AsyncEngine | Engine, synchronous: str, *, own_checkpoints: bool) -> None:
    sync_engine = engine.sync_engine if isinstance(engine, AsyncEngine) else engine

    @event.listens_for(sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let us emit BEGIN ourselves (the driver's implicit BEGIN is always DEFERRED).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute(f"PRAGMA synchronous={synchronous}")
        cursor.execute("PRAGMA foreign_keys=ON")
        if own_checkpoints:  # SQLiteCheckpointer checkpoints beside the commits; a commit only as a safety net
            cursor.execute(f"PRAGMA wal_autocheckpoint={AUTOCHECKPOINT_PAGES}")
            cursor.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT_BYTES}")
        cursor.close()

    @event.listens_for(sync_engine, "begin")
    def _on_begin(conn: Connection) -> None:
        mode = conn.get_execution_options().get("sqlite_begin", "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")


def _ping_when_idle(engine: AsyncEngine) -> None:
    """A connection that sat in the pool past ``PING_IDLE_S`` is pinged before use, and the pool renewed if
    it fails (the server restarted, or something between cut it). One used a moment ago is not: a ping per
    transaction was a round trip and a twentieth of the CPU of a busy replica."""

    @event.listens_for(engine.sync_engine, "checkin")
    def _returned(_dbapi_connection: Any, record: Any) -> None:
        record.info["returned"] = time.monotonic()

    @event.listens_for(engine.sync_engine, "checkout")
    def _checked_out(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        returned = record.info.get("returned")
        if returned is None or time.monotonic() - returned < PING_IDLE_S:
            return  # new, or used just now
        try:
            engine.sync_engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:
            # The pool replaces this connection and every one older (up to three attempts).
            raise InvalidatePoolError(f"an idle database connection failed its ping: {exc}") from exc


@dataclass(frozen=True)
class SchemaChange:
    """What a migration found and left: revisions (none before: a new database)."""

    before: tuple[str, ...]
    after: tuple[str, ...]


def _upgrade_to_head(conn: Connection) -> SchemaChange:
    head = _head_revision()
    found = _current_revisions(conn)
    if head is not None and found == [head]:
        # current: every start of a migrated database, without importing alembic (a tenth of a second)
        return SchemaChange(tuple(found), tuple(found))
    if conn.dialect.name == "postgresql":
        # Held until this transaction ends, which is the whole migration: another process migrating at the same time
        # waits here, and its alembic then reads the revision this one committed. Never a session lock: behind
        # PgBouncer's transaction pooling a session lock stays on a server connection someone else gets next.
        conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK_KEY})")
    from alembic import command
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["connection"] = conn
    found = _current_revisions(conn)  # again: another process may have migrated while this one waited for the lock
    problem = newer_schema(found, ScriptDirectory.from_config(cfg))
    if problem is not None:
        raise SchemaTooNew(problem)
    command.upgrade(cfg, "head")
    return SchemaChange(tuple(found), tuple(_current_revisions(conn)))


def newer_schema(revisions: list[str], script: ScriptDirectory) -> str | None:
    """What to tell the operator when the database is at a revision these migrations do not know (a newer bot
    migrated it; migrating or running against it could corrupt it), else None."""
    from alembic.util import CommandError

    unknown = []
    for revision in revisions:
        try:
            script.get_revision(revision)
        except CommandError:
            unknown.append(revision)
    if not unknown:
        return None
    return (f"the database's schema is at revision {', '.join(unknown)}, newer than this version of the bot knows "
            f"(its newest is {script.get_current_head()}): run the newer version of the bot, or restore the backup "
            "taken before the upgrade")


_REVISION_LINE = re.compile(r'^(down_revision|revision) = (None|"([0-9A-Za-z_]+)")$', re.MULTILINE)


@functools.cache
def _head_revision() -> str | None:
    """The newest migration, read from the files' ``revision`` / ``down_revision`` lines; None when that is not one
    plain chain's single head (alembic then decides)."""
    revisions: set[str] = set()
    parents: set[str] = set()
    for path in (MIGRATIONS_DIR / "versions").glob("*.py"):
        if path.name.startswith(("__init__", ".#")):  # the files alembic passes over, and only those
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None
        found = dict((m.group(1), m.group(3)) for m in _REVISION_LINE.finditer(text))
        if "revision" not in found or found["revision"] is None or "down_revision" not in found:
            return None
        revisions.add(found["revision"])
        if found["down_revision"] is not None:
            parents.add(found["down_revision"])
    heads = revisions - parents
    return heads.pop() if len(heads) == 1 else None


def _current_revisions(conn: Connection) -> list[str]:
    """The revisions the database says it is at (none for a new database)."""
    if not inspect(conn).has_table("alembic_version"):
        return []
    return [row[0] for row in conn.exec_driver_sql("SELECT version_num FROM alembic_version")]
