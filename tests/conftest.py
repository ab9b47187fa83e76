from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bot.app import Application, build_application
from bot.settings import Settings, load_settings
from core.store import Database
from core.store.database import SchemaChange
from tests import bot_process
from tests.fakes.llm import FakeLLM
from tests.fakes.oauth import FakeOAuth
from tests.fakes.server import RunningServer
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import SIGNING_SECRET, dumps, event_body, signed_headers

# Where PYTHONDONTWRITEBYTECODE is set, every worker would rewrite and compile every test module again, and every
# ``bot`` process the suite starts would compile the whole project again: the suite keeps its bytecode.
sys.dont_write_bytecode = False


def pytest_configure(config: pytest.Config) -> None:
    """Compile the project once, before any worker starts (the ``bot`` processes read it)."""
    if hasattr(config, "workerinput"):  # an xdist worker: the controller has done it
        return
    import compileall

    root = Path(__file__).resolve().parent.parent
    for package in ("bot", "core", "channels"):
        compileall.compile_dir(root / package, quiet=1)



@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No SLACK_, LLM_ or BOT_ variable from the outer environment, and no stray ``.env``: settings read here are
    the test's own (``pytestmark = pytest.mark.usefixtures("clean_env")``)."""
    for key in list(os.environ):
        if key.upper().startswith(("SLACK_", "LLM_", "BOT_")):
            monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)

def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker per core and one more. Much of the suite waits (on sockets, on the ``bot`` processes it
    starts), so one per core leaves the cores idle; two per core kept them busy switching (on 2 cores, 3 workers ran
    the suite in 4:13 with 477 s of CPU, 4 workers in 4:19 with 502 s)."""
    return (os.cpu_count() or 1) + 1


@pytest.fixture(autouse=True)
def _no_process_left_behind() -> Iterator[None]:
    """A test that fails half way must not leave a real `bot run` running (and eating the CPU)."""
    yield
    from tests.bot_process import STARTED

    for proc in STARTED:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
    STARTED.clear()


# -- one migration per test process ----------------------------------------------------------------------
#
# Migrating an empty SQLite file to head runs every revision (table rebuilds included): a fifth of a second,
# paid by most tests. The first migration in each test process is real and its file becomes the template;
# after that, a migration about to run on an empty (or absent) SQLite file starts from a copy of that file,
# so Database.migrate itself still runs (and finds the schema current). Files holding anything (older
# revisions, a previous run's data) are migrated as ever.

_SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")
_real_migrate = Database.migrate


def _sqlite_file(database: Database) -> Path | None:
    from sqlalchemy.engine import make_url

    path = make_url(database.url).database if database.is_sqlite else None
    return Path(path) if path and path != ":memory:" else None


def _never_opened(path: Path) -> bool:
    """Absent or empty, and no side files: no connection has been made (each sets WAL, which writes)."""
    empty = not path.exists() or (path.is_file() and path.stat().st_size == 0)
    return empty and not any(path.with_name(path.name + side).exists() for side in _SQLITE_SIDE_FILES)


class _SqliteTemplate:
    def __init__(self, path: Path) -> None:
        self.path = path

    async def migrate(self, database: Database) -> SchemaChange:
        target = _sqlite_file(database)
        if target is None or not _never_opened(target):
            return await _real_migrate(database)
        if not self.path.exists():
            change = await _real_migrate(database)  # the real migration, once: its file is the template
            self._keep(target)
            return change
        # copyfile writes into an existing (empty, 0600) file in place: its inode and mode stay the product's.
        shutil.copyfile(self.path, target)
        change = await _real_migrate(database)  # finds head: a no-op, as at every later start
        return SchemaChange((), change.after)  # what the real migration of a new file would have said

    def _keep(self, source: Path) -> None:
        """Copy the freshly migrated file, whole (its WAL checkpointed into it), as the template."""
        import sqlite3

        partial = self.path.with_name(f"{self.path.name}.{uuid.uuid4().hex}")
        with contextlib.closing(sqlite3.connect(source)) as live, contextlib.closing(sqlite3.connect(partial)) as copy:
            live.backup(copy)
        with contextlib.closing(sqlite3.connect(partial)) as copy:
            copy.execute("PRAGMA journal_mode=WAL")  # as every connection of ours leaves it
        partial.replace(self.path)


@pytest.fixture(scope="session")
def _sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> _SqliteTemplate:
    template = _SqliteTemplate(tmp_path_factory.getbasetemp() / "migrated-template.db")
    bot_process.SQLITE_TEMPLATE[:] = [template.path]  # real `bot run` processes start from it too
    return template


@pytest.fixture(autouse=True)
def _migrate_from_template(monkeypatch: pytest.MonkeyPatch, _sqlite_template: _SqliteTemplate) -> None:
    async def migrate(database: Database) -> SchemaChange:
        return await _sqlite_template.migrate(database)

    monkeypatch.setattr(Database, "migrate", migrate)


@pytest.fixture
async def fake_slack() -> AsyncIterator[FakeSlack]:
    fake = FakeSlack()
    server = await RunningServer(fake.app()).start()
    fake.url = server.url  # type: ignore[attr-defined]
    yield fake
    await server.stop()


@pytest.fixture
async def fake_llm() -> AsyncIterator[FakeLLM]:
    async with running_llm() as fake:
        yield fake


@contextlib.asynccontextmanager
async def running_llm() -> AsyncIterator[FakeLLM]:
    """A fake OpenAI-compatible server (its URL on ``.url``), stopped on leaving; a request still held is let go."""
    fake = FakeLLM()
    server = await RunningServer(fake.app()).start()
    fake.url = server.url  # type: ignore[attr-defined]
    try:
        yield fake
    finally:
        for step in fake.script:  # never leave a held request hanging (a Gate's ``opened``, a stall's ``resume``)
            for event in (getattr(step, "opened", None), getattr(step, "resume", None)):
                if event is not None:
                    event.set()
        await server.stop()


@contextlib.asynccontextmanager
async def fresh_postgres(admin_url: str) -> AsyncIterator[str]:
    """A new, empty database on the PostgreSQL server of ``admin_url``; dropped afterwards."""
    import asyncpg
    from sqlalchemy.engine import make_url

    url = make_url(admin_url)
    name = f"t_{uuid.uuid4().hex[:16]}"
    dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
    admin = await asyncpg.connect(dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    try:
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        admin = await asyncpg.connect(dsn)
        try:
            for attempt in range(50):
                try:
                    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                    break
                except asyncpg.InsufficientPrivilegeError:
                    # An autovacuum worker (the superuser's) is in it, and FORCE may not end it: it soon
                    # leaves by itself. Seen once on a loaded machine.
                    if attempt == 49:
                        raise
                    await asyncio.sleep(0.1)
        finally:
            await admin.close()


@pytest.fixture
async def database_url(tmp_path: Path) -> AsyncIterator[str | None]:
    """None (SQLite under BOT_HOME), or with TEST_DATABASE_URL a fresh PostgreSQL database per test."""
    admin_url = os.environ.get("TEST_DATABASE_URL")
    if not admin_url:
        yield None
        return
    async with fresh_postgres(admin_url) as url:
        yield url


@functools.cache
def sandbox_mode() -> str:
    """bwrap where bubblewrap works; on a machine without it the suite still runs shell_run, unsandboxed
    (the sandbox tests themselves skip there, and CI sets BOT_REQUIRE_SANDBOX=1 so they cannot)."""
    from bot.sandbox import probe

    if probe("bwrap").sandbox is not None or os.environ.get("BOT_REQUIRE_SANDBOX") == "1":
        return "bwrap"
    return "none"


@pytest.fixture
def make_settings(tmp_path: Path, fake_slack: FakeSlack, fake_llm: FakeLLM,
                  database_url: str | None) -> Callable[..., Settings]:
    def make(**overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "database_url": database_url,
            "bot_home": tmp_path / "home",
            "host": "127.0.0.1",
            "port": 0,
            "slack_bot_token": "xoxb-test-token-123456",
            "slack_signing_secret": SIGNING_SECRET,
            "slack_api_url": f"{fake_slack.url}/api/",  # type: ignore[attr-defined]
            "llm_base_url": f"{fake_llm.url}/v1",  # type: ignore[attr-defined]
            "llm_api_key": "sk-test-key-abcdef",
            "llm_model": "fake-model",
            "llm_retry_base_s": 0.01,
            "shutdown_drain_s": 1,
            "queue_debounce_ms": 50,
            "shell_sandbox": sandbox_mode(),
            # Progress reactions at once, so tests that look at them need not wait; the delay (the
            # default) has its own tests in test_slack_conversation.py.
            "slack_progress_delay_s": 0,
            # Answers as one post, so tests that read the answer need not know whether a turn outlasted the
            # stream's delay; streaming has its own tests (test_slack_streaming.py). The model still streams.
            "slack_streaming": False,
        }
        values.update(overrides)
        return load_settings(env_file=None, **values)

    return make


class GatewayClient:
    """Talks to a started Application over real HTTP, signing like Slack."""

    def __init__(self, app: Application, http: aiohttp.ClientSession) -> None:
        self.app = app
        self.http = http
        self.base = f"http://127.0.0.1:{app.bound_port}"

    async def post_raw(self, body: str, headers: dict[str, str]) -> aiohttp.ClientResponse:
        async with self.http.post(f"{self.base}/slack/events", data=body, headers=headers) as resp:
            await resp.read()
            return resp

    async def send_event(self, event: dict[str, Any], *, event_id: str | None = None,
                         retry_num: int | None = None) -> aiohttp.ClientResponse:
        body = dumps(event_body(event, event_id=event_id))
        headers = signed_headers(body)
        if retry_num is not None:
            headers["X-Slack-Retry-Num"] = str(retry_num)
            headers["X-Slack-Retry-Reason"] = "http_timeout"
        return await self.post_raw(body, headers)

    async def interact(self, form_body: str) -> aiohttp.ClientResponse:
        """A signed interactivity request (button click, modal submission) or slash command."""
        form = "application/x-www-form-urlencoded"
        return await self.post_raw(form_body, signed_headers(form_body, content_type=form))

    async def metrics(self) -> dict[str, float]:
        """``GET /metrics`` as {series with its labels: value}."""
        async with self.http.get(f"{self.base}/metrics") as resp:
            assert resp.status == 200 and resp.content_type == "text/plain"
            text = await resp.text()
        figures: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                figures[name] = float(value)
        return figures

    async def idle(self, timeout: float = 10.0) -> None:
        """Wait until no turn is running and every event has been rendered."""
        async with asyncio.timeout(timeout):
            while self.app.dispatcher.running_sessions:
                await asyncio.sleep(0.01)
            await self.app.dispatcher.bus.drain(timeout)


@pytest.fixture
async def start_gateway() -> AsyncIterator[Callable[[Settings], Any]]:
    started: list[tuple[Application, aiohttp.ClientSession]] = []

    async def start(settings: Settings, provider: Any = None, clock: Any = None) -> GatewayClient:
        app = build_application(settings, provider=provider, clock=clock)
        await app.start()
        http = aiohttp.ClientSession()
        started.append((app, http))
        return GatewayClient(app, http)

    yield start
    for app, http in started:
        await http.close()
        await app.stop()


@pytest.fixture
async def gateway(make_settings: Callable[..., Settings], start_gateway: Any) -> GatewayClient:
    client: GatewayClient = await start_gateway(make_settings())
    return client


@pytest.fixture
def unused_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


STORE_BACKENDS = [
    pytest.param("sqlite"),
    pytest.param("postgresql", marks=pytest.mark.skipif(not os.environ.get("TEST_DATABASE_URL"),
                                                        reason="needs TEST_DATABASE_URL")),
]


@pytest.fixture(params=STORE_BACKENDS)
async def store_db(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Database]:
    """A freshly migrated database of each backend."""
    if request.param == "sqlite":
        database = Database(f"sqlite:///{tmp_path}/x.db")
        await database.migrate()
        yield database
        await database.close()
        return
    async with fresh_postgres(os.environ["TEST_DATABASE_URL"]) as url:
        database = Database(url)
        await database.migrate()
        yield database
        await database.close()


# -- OAuth connections (tests/test_connections*.py) --------------------------------------------------------

CLIENT_SECRET_ENV = "FAKE_OAUTH_CLIENT_SECRET"


@pytest.fixture
async def oauth(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeOAuth]:
    fake = FakeOAuth()
    server = await RunningServer(fake.app()).start()
    fake.url = server.url  # type: ignore[attr-defined]
    monkeypatch.setenv(CLIENT_SECRET_ENV, fake.client_secret)
    yield fake
    await server.stop()


def connections_toml(oauth: FakeOAuth, *, authorize: bool = True, owner: str = "user", extra: str = "") -> str:
    url = oauth.url  # type: ignore[attr-defined]
    return "\n".join(line for line in (
        "[[connections]]",
        'name = "github"',
        f'authorize_url = "{url}/authorize"' if authorize else "",
        f'token_url = "{url}/token"',
        f'revoke_url = "{url}/revoke"',
        f'client_id = "{oauth.client_id}"',
        f'client_secret_env = "{CLIENT_SECRET_ENV}"',
        'scopes = ["repo"]',
        f'owner = "{owner}"',
        extra,
    ) if line)


@pytest.fixture
def connected_settings(make_settings: Callable[..., Settings], tmp_path: Path, oauth: FakeOAuth
                       ) -> Callable[..., Settings]:
    def make(toml: str | None = None, **overrides: Any) -> Settings:
        config = tmp_path / "bot.toml"
        config.write_text(toml if toml is not None else connections_toml(oauth), encoding="utf-8")
        values: dict[str, Any] = {"bot_config": config, "http_allow_hosts": "127.0.0.1"}
        return make_settings(**(values | overrides))

    return make


@pytest.fixture
async def workspaces(make_settings: Callable[..., Settings], start_gateway: Any,
                     fake_slack: FakeSlack) -> GatewayClient:
    """A bot in multi-workspace mode for T1 and T2 (SLACK_ALLOWED_TEAMS), installed through the install page."""
    from tests.slack_workspaces import install

    gw: GatewayClient = await start_gateway(make_settings(
        slack_bot_token=None, slack_client_id=fake_slack.client_id, slack_client_secret=fake_slack.client_secret,
        slack_allowed_teams="T1,T2", schedule_min_interval_s=1))
    for team in ("T1", "T2"):
        await install(gw, fake_slack, team)
    return gw


@pytest.fixture
async def events(make_settings: Any, start_gateway: Any, tmp_path: Path,
                 monkeypatch: pytest.MonkeyPatch, clock: Any) -> Any:
    """A gateway with the test sources of ``events_config`` (and a small EVENT_MAX_BODY_BYTES), on the test's
    ``clock`` (each event test file has its own: one second into a minute)."""
    from tests.event_requests import MAX_BODY, events_config

    config = events_config(tmp_path, monkeypatch)
    return await start_gateway(make_settings(bot_config=config, event_max_body_bytes=MAX_BODY), clock=clock)
