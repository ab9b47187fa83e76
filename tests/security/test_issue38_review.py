"""Review of issue 38 (deploy files, lock files, `bot migrate`, JSON logs) as an attacker: a package index or a pip
configuration that serves something else, a lock file edited by hand, PgBouncer in front of PostgreSQL, a password
in DATABASE_URL, and log fields that carry a person's text."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import os
import re
import shlex
import shutil
import socket
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from bot.logs import JsonFormatter, RedactingFilter
from core.store import Database
from tests.bot_process import run_cli
from tests.conftest import fresh_postgres

ROOT = Path(__file__).resolve().parent.parent.parent
REQUIREMENTS = ROOT / "requirements"


# -- supply chain: nothing is installed that a lock file did not pin and hash ----------------------------------------


def shell_commands(path: Path) -> list[list[str]]:
    """The commands of a shell script, split as the shell would split words (continuations joined, comments and
    ``&&`` chains taken apart; variables left as written)."""
    text = re.sub(r"\\\n", " ", path.read_text(encoding="utf-8"))
    commands: list[list[str]] = []
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        current: list[str] = []
        for word in words:
            if word in ("&&", "||", ";", "|"):
                commands.append(current)
                current = []
            else:
                current.append(word)
        commands.append(current)
    return [command for command in commands if command]


def pip_installs(path: Path) -> list[list[str]]:
    return [command for command in shell_commands(path)
            if len(command) > 2 and command[0].endswith("pip") and command[1] in ("install", "wheel")]


def builds_the_project(command: list[str]) -> bool:
    return "." in command  # `pip install .`, `pip install -e .`, `pip wheel … .`


@pytest.mark.parametrize("script", ["deploy/container/install.sh", ".ci/run"])
def test_building_the_project_downloads_no_unpinned_build_backend(script: str) -> None:
    """pip builds ``.`` in an isolated environment by default, and fills it with pyproject's [build-system]
    requirements (``setuptools>=68``, ``wheel``) from whatever index it is configured with: no pin, no hash, and code
    that runs during the build of the image (or of CI's venv). The build backend must come from a hashed lock too."""
    installs = pip_installs(ROOT / script)
    builds = [command for command in installs if builds_the_project(command)]
    assert builds, installs
    for command in builds:
        assert "--no-build-isolation" in command, shlex.join(command)
    before_first_build = installs[:installs.index(builds[0])]
    assert any("--require-hashes" in command and "requirements/build.txt" in command
               for command in before_first_build), [shlex.join(c) for c in before_first_build]


def test_the_build_lock_pins_what_pyproject_builds_with() -> None:
    wanted = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    pinned = dict(lock_pins(REQUIREMENTS / "build.txt"))
    for line in wanted:
        requirement = Requirement(line)
        version = pinned.get(canonicalize_name(requirement.name))
        assert version is not None and requirement.specifier.contains(version), (line, pinned)


# A lock file line: a pin, its hashes, or a comment. Anything else changes where or what pip installs: another
# index (--index-url, --extra-index-url, --find-links), TLS turned off (--trusted-host), a file that pulls in
# another (-r, -c), an editable, a VCS, URL or path requirement ("name @ https://…", "git+…", "./pkg").
PIN_LINE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.+!_-]+( ; [^\\#@]+)?( --hash=sha256:[0-9a-f]{64})+")


def lock_lines(path: Path) -> list[str]:
    """The logical lines of a requirements file: continuations joined, comments and blank lines left out."""
    joined = re.sub(r"[ \t]*\\\n[ \t]*", " ", path.read_text(encoding="utf-8"))
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def lock_problems(path: Path) -> list[str]:
    return [line[:120] for line in lock_lines(path) if not PIN_LINE.fullmatch(re.sub(r"\s+#.*$", "", line))]


def lock_pins(path: Path) -> list[tuple[str, str]]:
    pins = []
    for line in lock_lines(path):
        name, _, rest = line.partition("==")
        pins.append((canonicalize_name(name), rest.split()[0]))
    return pins


def lock_files() -> list[str]:
    return sorted(path.name for path in REQUIREMENTS.glob("*.txt"))


@pytest.mark.parametrize("lock", lock_files())
def test_every_lock_file_holds_hashed_pins_and_nothing_else(lock: str) -> None:
    assert not lock_problems(REQUIREMENTS / lock)
    assert lock_pins(REQUIREMENTS / lock)


@pytest.mark.parametrize("tampered", [
    "--extra-index-url https://pypi.example.net/simple",
    "--index-url=https://pypi.example.net/simple",
    "--trusted-host pypi.example.net",
    "--find-links /tmp/wheels",
    "-r extra.txt",
    "-e git+https://git.example.net/slack-bolt.git#egg=slack-bolt",
    "slack-bolt @ https://files.example.net/slack_bolt-9.9-py3-none-any.whl \\\n    --hash=sha256:" + "0" * 64,
    "./vendor/slack-bolt",
    "slack-bolt>=1.28 \\\n    --hash=sha256:" + "0" * 64,
    "slack-bolt==1.28.0",
])
def test_a_lock_file_edited_to_install_from_elsewhere_is_caught(tmp_path: Path, tampered: str) -> None:
    lock = tmp_path / "run.txt"
    pinned = "wheel==0.46.3 \\\n    --hash=sha256:" + "1" * 64 + "\n    # via -r requirements/build.in\n"
    lock.write_text(pinned + tampered + "\n")
    assert lock_problems(lock) == [re.sub(r"[ \t]*\\\n[ \t]*", " ", tampered)[:120]]


def test_the_lock_tool_itself_is_installed_pinned_hashed_and_from_pypi_only() -> None:
    """requirements/update writes every hash the image later trusts: the resolver it runs must not come from this
    machine's pip configuration (PIP_INDEX_URL, an extra index, pip.conf) or arrive unhashed."""
    installs = pip_installs(REQUIREMENTS / "update")
    assert installs
    for command in installs:
        assert "--isolated" in command and "--require-hashes" in command, shlex.join(command)
        assert command[command.index("--index-url") + 1] == "https://pypi.org/simple", shlex.join(command)


# -- PostgreSQL behind PgBouncer (transaction pooling) --------------------------------------------------------------


@contextlib.asynccontextmanager
async def pgbouncer(server_url: str, folder: Path) -> AsyncIterator[str]:
    """A PgBouncer in transaction mode in front of ``server_url``'s server, with few server connections (so clients'
    transactions keep landing on each other's); yields ``server_url`` through it."""
    from sqlalchemy.engine import make_url

    url = make_url(server_url)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (folder / "users.txt").write_text(f'"{url.username}" "{url.password or ""}"\n')
    (folder / "pgbouncer.ini").write_text(
        f"[databases]\n* = host={url.host} port={url.port or 5432}\n[pgbouncer]\nlisten_addr = 127.0.0.1\n"
        f"listen_port = {port}\nauth_type = trust\nauth_file = {folder / 'users.txt'}\npool_mode = transaction\n"
        "default_pool_size = 2\nmax_client_conn = 100\nunix_socket_dir =\n"
        "ignore_startup_parameters = extra_float_digits\n")
    user = ["-u", "nobody"] if os.geteuid() == 0 else []  # it refuses to run as root
    process = await asyncio.create_subprocess_exec(
        "pgbouncer", *user, str(folder / "pgbouncer.ini"), stderr=asyncio.subprocess.PIPE)
    try:
        assert process.stderr is not None
        async with asyncio.timeout(10):
            while b"process up" not in (line := await process.stderr.readline()):
                assert line, "pgbouncer exited"
        yield url.set(host="127.0.0.1", port=port).render_as_string(hide_password=False)
    finally:
        process.terminate()
        await process.wait()


async def _queries_through(db: Database) -> list[str]:
    """Ten clients' reads and writes at once, the same statements again and again (what a driver caches), on the
    async engine and on the synchronous one APScheduler uses; the errors they met."""
    from sqlalchemy import text

    errors: list[str] = []

    async def client(number: int) -> None:
        for attempt in range(12):
            try:
                async with db.read() as session:
                    await (await session.connection()).execute(
                        text("SELECT version_num FROM alembic_version WHERE version_num <> :v"), {"v": str(number)})
                async with db.write() as session:
                    await (await session.connection()).execute(
                        text("SELECT count(*) FROM inputs WHERE id > :i"), {"i": attempt})
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {str(exc)[:120]}")

    def sync_client(engine: Any) -> None:
        for attempt in range(12):
            try:
                with engine.begin() as conn:
                    conn.execute(text("SELECT count(*) FROM inputs WHERE id > :i"), {"i": attempt})
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {str(exc)[:120]}")

    engine = db.sync_engine(pool_size=3)
    try:
        await asyncio.gather(*(client(n) for n in range(10)),
                             *(asyncio.to_thread(sync_client, engine) for _ in range(3)))
    finally:
        engine.dispose()
    return errors


@pytest.mark.skipif(not os.environ.get("TEST_DATABASE_URL") or not shutil.which("pgbouncer"),
                    reason="needs TEST_DATABASE_URL (PostgreSQL) and pgbouncer")
async def test_the_store_works_behind_pgbouncer_in_transaction_mode_with_prepared_statements_off(
        tmp_path: Path) -> None:
    """SPEC §17: prepared statements must survive transaction pooling, or be switchable off. asyncpg caches named
    statements per connection and psycopg prepares a query it has run five times: through PgBouncer 1.18 ("prepared
    statement __asyncpg_stmt_10__ requires 0 parameters", "prepared statement _pg3_0 already exists") nearly every
    query failed. `?prepared_statements=false` on DATABASE_URL turns them off; `bot migrate` works through it too."""
    async with fresh_postgres(os.environ["TEST_DATABASE_URL"]) as server_url, \
            pgbouncer(server_url, tmp_path) as bounced:
        url = bounced + "?prepared_statements=false"
        code, out = await run_cli(tmp_path, {"DATABASE_URL": url}, "migrate")
        assert code == 0 and "created the schema" in out, out
        db = Database(url)
        try:
            assert await _queries_through(db) == []
        finally:
            await db.close()


async def test_an_unknown_value_of_the_prepared_statements_option_is_refused(tmp_path: Path) -> None:
    code, out = await run_cli(tmp_path, {"DATABASE_URL": f"sqlite:///{tmp_path}/x.db?prepared_statements=no"},
                              "migrate")
    assert (code, out.strip()) == (1, "bot: error: DATABASE_URL: prepared_statements must be true or false, not 'no'")


# -- DATABASE_URL's password in error lines -------------------------------------------------------------------------


async def test_a_password_with_an_unescaped_at_and_slash_is_refused_without_showing_its_tail(tmp_path: Path) -> None:
    """"p@ss/word" unescaped: the URL parser ends the password at the first "@", so "ss" became the host and
    "word@db…/bot" the database name, and the connection error showed them (`bot migrate` in a Job's log): the masked
    password was "p" only. Refused like an "@" that lands in the host name."""
    code, out = await run_cli(tmp_path, {"DATABASE_URL": "postgresql://bot:Pa55@Hidden/Tail@127.0.0.1:1/bot"},
                              "migrate")
    assert code != 0 and "write it as %40" in out, out
    assert "Hidden" not in out and "Tail" not in out, out


# -- JSON logs: one line of strict JSON whatever a field holds ------------------------------------------------------


def json_logger() -> tuple[logging.Logger, io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactingFilter(["s3cret-value-1234"]))
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger(f"test.issue38.{id(stream)}")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    return logger, stream


def strict_json(line: str) -> dict[str, Any]:
    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    entry: dict[str, Any] = json.loads(line, parse_constant=refuse)
    return entry


def test_numbers_json_cannot_hold_are_written_as_text_not_lost_or_invalid(capsys: pytest.CaptureFixture[str]) -> None:
    """extra= numbers were written as given: NaN and Infinity made a line no log collector parses (JSON has neither),
    and an int past Python's 4300-digit limit raised inside the formatter, so the line was lost."""
    logger, out = json_logger()
    logger.info("ratio", extra={"ratio": float("nan"), "limit": float("inf"), "big": 7 ** 6000, "ok": 3})
    lines = out.getvalue().splitlines()
    assert len(lines) == 1, capsys.readouterr().err[-300:]
    entry = strict_json(lines[0])
    assert (entry["ratio"], entry["limit"], entry["ok"]) == ("nan", "inf", 3)
    assert isinstance(entry["big"], str) and entry["big"].startswith("[int of ")


def test_a_persons_text_cannot_split_a_json_line_or_reach_the_terminal_raw() -> None:
    """ensure_ascii=False leaves U+2028, U+2029 and NEL (U+0085) as they are: valid inside a JSON string, but line
    breaks to str.splitlines(), JavaScript-era parsers and some log viewers, so a Slack message can start a line of
    its own there; the C1 controls (U+009B is CSI) reach `kubectl logs` on a terminal as escape sequences."""
    text = 'hi\u2028{"level": "error", "msg": "forged"}\u2029\x85\x9b31m red \x1b[2J'
    logger, out = json_logger()
    logger.warning("from slack: %s", text, extra={"text": text})
    written = out.getvalue()
    assert len(written.splitlines()) == 1, written.splitlines()
    assert not re.search("[\x00-\x1f\x7f-\x9f\u2028\u2029]", written.rstrip("\n"))
    entry = strict_json(written)
    assert entry["msg"] == f"from slack: {text}" and entry["text"] == text  # escaped, not changed


# -- compose.yaml ---------------------------------------------------------------------------------------------------


def test_compose_publishes_the_bots_plain_http_port_on_loopback_unless_told_otherwise() -> None:
    """"3000:3000" publishes on every interface of the host (and Docker's rules go around ufw/firewalld): the web chat's
    login token and /metrics' bearer token in plain HTTP from anywhere. The TLS proxy in front (the example's advice)
    reaches loopback; BOT_BIND=0.0.0.0 says otherwise on purpose."""
    import yaml

    services = yaml.safe_load((ROOT / "compose.yaml").read_text(encoding="utf-8"))["services"]
    assert services["bot"]["ports"] == ["${BOT_BIND:-127.0.0.1}:${BOT_PORT:-3000}:3000"]
    assert "ports" not in services["postgres"] and "ports" not in services["migrate"]
    for name in ("bot", "migrate"):  # as the Kubernetes pods and the systemd unit: no capabilities, no setuid gains
        assert services[name]["cap_drop"] == ["ALL"]
        assert "no-new-privileges:true" in services[name]["security_opt"]
