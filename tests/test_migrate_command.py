"""``bot migrate``: to the current schema, twice safely, concurrently on PostgreSQL; a newer schema is refused."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from sqlalchemy import text

from core.errors import SchemaTooNew
from core.store import Database
from core.store.database import MIGRATION_LOCK_KEY, _head_revision
from tests.bot_process import run_cli, run_to_exit
from tests.conftest import fresh_postgres

HEAD = _head_revision()
NEWER = "9999_from_a_newer_bot"


@pytest.fixture(autouse=True)
def _process_database(database_url: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """With TEST_DATABASE_URL, the commands run against this test's fresh PostgreSQL database."""
    if database_url:
        monkeypatch.setenv("BOT_PROCESS_DATABASE_URL", database_url)


def _url(tmp_path: Path, database_url: str | None) -> str:
    return database_url or f"sqlite:///{tmp_path}/.bot/bot.db"  # where `bot` puts it with no DATABASE_URL


async def _versions(url: str) -> list[str]:
    db = Database(url)
    try:
        async with db.engine.connect() as conn:
            return list((await conn.execute(text("SELECT version_num FROM alembic_version"))).scalars())
    finally:
        await db.close()


async def test_migrate_twice_creates_the_schema_then_finds_nothing_to_do(tmp_path: Path,
                                                                          database_url: str | None) -> None:
    code, out = await run_cli(tmp_path, {}, "migrate")
    assert code == 0, out
    assert out.startswith(f"bot: created the schema ({HEAD}) in "), out
    code, out = await run_cli(tmp_path, {}, "migrate")
    assert code == 0, out
    assert out.strip().endswith(f"is at the current schema ({HEAD}); nothing to do"), out
    assert await _versions(_url(tmp_path, database_url)) == [HEAD]


async def test_a_database_a_newer_bot_migrated_is_refused_by_migrate_and_run(tmp_path: Path,
                                                                              database_url: str | None) -> None:
    assert (await run_cli(tmp_path, {}, "migrate"))[0] == 0
    url = _url(tmp_path, database_url)
    db = Database(url)
    try:
        async with db.engine.begin() as conn:
            await conn.execute(text("UPDATE alembic_version SET version_num = :v"), {"v": NEWER})
    finally:
        await db.close()
    expected = (f"bot: error: the database's schema is at revision {NEWER}, newer than this version of the bot "
                f"knows (its newest is {HEAD}): run the newer version of the bot, or restore the backup taken "
                "before the upgrade")
    code, out = await run_cli(tmp_path, {}, "migrate")
    assert (code, out) == (1, expected + "\n")
    code, out = await run_to_exit(tmp_path, {"PORT": "0"})
    assert code == 1, out
    assert out.splitlines()[-1] == expected and "Traceback" not in out, out
    assert await _versions(url) == [NEWER]  # left as it was


@pytest.mark.skipif(not os.environ.get("TEST_DATABASE_URL"), reason="needs TEST_DATABASE_URL (PostgreSQL)")
async def test_replicas_running_migrate_at_once_on_postgresql_migrate_once(tmp_path: Path,
                                                                           database_url: str | None) -> None:
    """Three `bot migrate` processes (replicas' init containers) on one empty database at the same moment: one
    migrates under the advisory transaction lock, the others wait for it, then find the schema current."""
    assert database_url is not None
    async with asyncio.timeout(60):  # without the lock they deadlock or fail; never hang the suite
        finished = await asyncio.gather(*(run_cli(tmp_path, {}, "migrate", process=True) for _ in range(3)))
    assert [code for code, _out in finished] == [0, 0, 0], finished
    outs = sorted(out.strip() for _code, out in finished)
    assert outs[0].startswith(f"bot: created the schema ({HEAD}) in "), outs
    assert all(out.endswith(f"is at the current schema ({HEAD}); nothing to do") for out in outs[1:]), outs
    assert await _versions(database_url) == [HEAD]


@pytest.mark.skipif(not os.environ.get("TEST_DATABASE_URL"), reason="needs TEST_DATABASE_URL (PostgreSQL)")
async def test_the_migration_lock_is_a_transaction_lock_gone_at_commit() -> None:
    """Behind PgBouncer (transaction pooling) a session lock would stay on a server connection that another client
    gets next: once a migration has committed, no advisory lock is left on its connection."""
    async with fresh_postgres(os.environ["TEST_DATABASE_URL"]) as url:
        db = Database(url)
        try:
            await db.migrate()
            async with db.engine.connect() as conn:
                held = (await conn.execute(text(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = :key & 4294967295"
                    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"),
                    {"key": MIGRATION_LOCK_KEY})).scalar()
            assert held == 0
            with pytest.raises(SchemaTooNew):
                async with db.engine.begin() as conn:
                    await conn.execute(text("UPDATE alembic_version SET version_num = :v"), {"v": NEWER})
                await db.migrate()
        finally:
            await db.close()
