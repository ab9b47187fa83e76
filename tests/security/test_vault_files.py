"""Point 10: a sealed value is bound to its row, BOT_HOME is private, the link page trusts only proxies.

Each test plays the attacker: copy a blob to another row, read files as another user would, forge
the headers a reverse proxy would send.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import socket
import stat
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict
from sqlalchemy import update
from sqlmodel import col

from bot.channels import sealed_kinds
from bot.settings import Settings
from core.agents import Agent, AgentDirectory
from core.approval_policy import ApprovalPolicy
from core.clock import SystemClock
from core.credential_links import CredentialLinks
from core.credentials import CredentialService
from core.errors import ToolError, VaultError
from core.events import EventBus
from core.sealed_values import reseal_all
from core.store import CredentialStore, Database
from core.store.tables import SecretRow
from core.tools import ToolContext
from core.vault import KeyRing
from tests.conftest import GatewayClient
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import mention

ON_POSTGRES = bool(os.environ.get("TEST_DATABASE_URL"))
sqlite_only = pytest.mark.skipif(ON_POSTGRES, reason="file modes concern the SQLite files under BOT_HOME")


def key(key_id: str) -> str:
    return f"{key_id}:{base64.b64encode(os.urandom(32)).decode()}"


def ctx(agent: str) -> ToolContext:
    return ToolContext(session_id="s", turn_id=1, agent=agent, sender="U1")


async def _service(url: str, keys: str) -> tuple[CredentialService, Database]:
    db = Database(url)
    await db.migrate()
    service = CredentialService(CredentialStore(db), KeyRing.parse(keys), EventBus(), SystemClock(),
                                ApprovalPolicy(("requester",), ()), AgentDirectory([Agent()]))
    return service, db


async def _row(db: Database, name: str, scope: str, agent: str) -> SecretRow:
    async with db.read() as s:
        from sqlmodel import select

        row = (await s.exec(select(SecretRow).where(SecretRow.name == name, SecretRow.scope == scope,
                                                    SecretRow.agent == agent))).one()
        return row


async def _copy_blob(db: Database, source: SecretRow, target: SecretRow) -> None:
    """What someone with write access to the database (a backup, a shared replica) could do."""
    async with db.write() as s:
        await s.exec(update(SecretRow).where(col(SecretRow.id) == target.id)
                     .values(key_id=source.key_id, ciphertext=source.ciphertext, aad_version=source.aad_version))


async def _opens_as(service: CredentialService, agent: str, name: str) -> str:
    """The value a tool of ``agent`` would be given for ``name`` (its bearer header)."""
    use = await service.headers_for(ctx(agent), name)
    return use.headers["Authorization"].removeprefix("Bearer ")


# -- the AEAD binds name, scope, agent and row id ---------------------------------------------------


async def test_a_blob_moved_to_another_row_with_the_same_name_does_not_open(tmp_path: Path) -> None:
    service, db = await _service(f"sqlite:///{tmp_path / 'v.db'}", key("k1"))
    await service.set_secret("gh.token", "value-of-agent-a", scope="agent", agent="a", by="U1")
    await service.set_secret("gh.token", "value-of-agent-b", scope="agent", agent="b", by="U1")
    await service.set_secret("gh.token", "value-shared-c", scope="shared", agent="c", by="U1")
    assert await _opens_as(service, "a", "gh.token") == "value-of-agent-a"
    assert await _opens_as(service, "b", "gh.token") == "value-of-agent-b"

    a = await _row(db, "gh.token", "agent", "a")
    await _copy_blob(db, a, await _row(db, "gh.token", "agent", "b"))  # another agent's row
    await _copy_blob(db, a, await _row(db, "gh.token", "shared", ""))  # another scope's row
    for agent in ("b", "c"):
        with pytest.raises((VaultError, ToolError)) as caught:
            await _opens_as(service, agent, "gh.token")
        assert "gh.token" in str(caught.value) and "value-of-agent-a" not in str(caught.value)
    assert await _opens_as(service, "a", "gh.token") == "value-of-agent-a"  # the original still opens
    assert "value-of-agent-a" not in await service.redact("nothing to see")
    await db.close()


async def _insert_legacy(db: Database, keys: KeyRing, name: str, agent: str, value: str) -> None:
    """A row as sealed before revision 0007: the AAD was the name alone."""
    from datetime import UTC, datetime

    sealed = keys.seal(value, context=name)
    now = datetime.now(UTC)
    async with db.write() as s:
        s.add(SecretRow(name=name, scope="agent", agent=agent, key_id=sealed.key_id, ciphertext=sealed.blob,
                        aad_version=1, created_by="U1", created_at=now, updated_at=now))


async def test_a_legacy_row_opens_and_is_upgraded_at_start(
    make_settings: Callable[..., Settings], start_gateway: Any
) -> None:
    spec = key("k1")
    settings = make_settings(bot_secret_keys=spec)
    db = Database(settings.resolved_database_url)
    await db.migrate()
    await _insert_legacy(db, KeyRing.parse(spec), "old.token", "default", "legacy-value-default")
    await _insert_legacy(db, KeyRing.parse(spec), "old.token", "ops", "legacy-value-ops")
    legacy_default = await _row(db, "old.token", "agent", "default")
    await db.close()

    gateway: GatewayClient = await start_gateway(settings)
    service, app_db = gateway.app.credentials, gateway.app.db
    rows = await service.store.all_secrets()
    assert [r.aad_version for r in rows] == [2, 2]  # re-sealed at start, bound to their rows
    assert await _opens_as(service, "default", "old.token") == "legacy-value-default"
    assert await _opens_as(service, "ops", "old.token") == "legacy-value-ops"

    # After the upgrade, a blob moved to the other row no longer opens.
    await _copy_blob(app_db, await _row(app_db, "old.token", "agent", "default"),
                     await _row(app_db, "old.token", "agent", "ops"))
    with pytest.raises((VaultError, ToolError)):
        await _opens_as(service, "ops", "old.token")
    # So does the legacy blob (from a backup, say) put into an upgraded row.
    async with app_db.write() as s:
        await s.exec(update(SecretRow).where(col(SecretRow.name) == "old.token", col(SecretRow.agent) == "ops")
                     .values(ciphertext=legacy_default.ciphertext))
    with pytest.raises((VaultError, ToolError)):
        await _opens_as(service, "ops", "old.token")

    # A second start finds nothing to do and changes nothing.
    before = [(r.id, r.ciphertext) for r in await service.store.all_secrets()]
    again: GatewayClient = await start_gateway(settings)
    assert [(r.id, r.ciphertext) for r in await again.app.credentials.store.all_secrets()] == before
    assert await _opens_as(again.app.credentials, "default", "old.token") == "legacy-value-default"


async def test_rotate_also_upgrades_legacy_rows(tmp_path: Path) -> None:
    spec = key("k1")
    service, db = await _service(f"sqlite:///{tmp_path / 'v.db'}", spec)
    await _insert_legacy(db, service.keys, "old.token", "default", "legacy-value-1")
    await service.set_secret("new.token", "new-value-2", scope="agent", agent="default", by="U1")
    lines: list[str] = []

    async def rotate() -> tuple[int, int]:
        [report, *_others] = await reseal_all(sealed_kinds(db), service.keys, SystemClock(), lines.append)
        return report.resealed, report.current

    assert await rotate() == (1, 1)  # under the current key already, but name-only AAD
    assert len(lines) == 1 and "old.token" in lines[0] and "legacy-value-1" not in lines[0]
    assert "bound it to its row" in lines[0]
    assert {r.name: r.aad_version for r in await service.store.all_secrets()} == {"old.token": 2, "new.token": 2}
    assert await rotate() == (0, 2)  # a second run is a no-op
    assert await _opens_as(service, "default", "old.token") == "legacy-value-1"
    await db.close()


async def test_vault_errors_name_the_credential_never_the_value(tmp_path: Path) -> None:
    service, db = await _service(f"sqlite:///{tmp_path / 'v.db'}", key("k1"))
    await service.set_secret("x.token", "never-print-me-1", scope="agent", agent="default", by="U1")
    await db.close()
    other, db = await _service(f"sqlite:///{tmp_path / 'v.db'}", key("k1"))  # same id, other bytes
    with pytest.raises((VaultError, ToolError)) as caught:
        await _opens_as(other, "default", "x.token")
    assert "x.token" in str(caught.value) and "never-print-me-1" not in str(caught.value)
    await db.close()


# -- BOT_HOME: directories 0700, files 0600 ---------------------------------------------------------


@pytest.fixture
def loose_umask() -> Iterator[None]:
    """The usual shell default: files would be created world-readable unless the bot prevents it."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@sqlite_only
async def test_bot_home_files_are_private_after_start(
    loose_umask: None, make_settings: Callable[..., Settings], start_gateway: Any, fake_llm: FakeLLM
) -> None:
    settings = make_settings()
    gateway: GatewayClient = await start_gateway(settings)
    await gateway.app.credentials.set_secret("a.token", "some-value-1", scope="agent", agent="default", by="U1")
    home = settings.bot_home
    assert _mode(home) == 0o700
    assert _mode(home / "work") == 0o700
    assert _mode(home / "secret.key") == 0o600
    db_files = sorted(home.glob("bot.db*"))
    assert {p.name for p in db_files} >= {"bot.db", "bot.db-wal", "bot.db-shm"}
    for path in db_files:
        assert _mode(path) & 0o077 == 0, f"{path} is {_mode(path):o}"


@sqlite_only
async def test_loose_modes_left_from_before_are_tightened_with_a_warning(
    loose_umask: None, make_settings: Callable[..., Settings], start_gateway: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = make_settings()
    home = settings.bot_home
    db = Database(settings.resolved_database_url)  # an older version created these world-readable
    await db.migrate()
    await db.close()
    (home / "work").mkdir(exist_ok=True)
    (home / "notes.txt").write_text("left by an operator")
    for path, mode in ((home, 0o755), (home / "bot.db", 0o644), (home / "work", 0o755),
                       (home / "notes.txt", 0o644)):
        path.chmod(mode)
    caplog.set_level(logging.WARNING)
    await start_gateway(settings)
    for path, mode in ((home, 0o700), (home / "bot.db", 0o600), (home / "work", 0o700),
                       (home / "notes.txt", 0o600)):
        assert _mode(path) == mode, path
        assert any(str(path) in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records), path


@sqlite_only
async def test_a_home_others_can_write_to_or_a_readable_key_is_refused(
    make_settings: Callable[..., Settings], start_gateway: Any
) -> None:
    from bot.errors import BotError

    settings = make_settings()
    home = settings.bot_home
    home.mkdir()
    home.chmod(0o777)  # anyone could have replaced the key or the database: do not use them
    with pytest.raises(BotError, match="writable by other users"):
        await start_gateway(settings)
    home.chmod(0o700)
    await start_gateway(settings)
    (home / "secret.key").chmod(0o644)  # it may already have been copied: the operator must know
    with pytest.raises(BotError, match="readable by other users"):
        await start_gateway(settings)


@pytest.mark.parametrize("target", ["directory", "fifo", "other_users_file"])
def test_a_database_url_naming_something_that_is_not_our_file_is_refused_before_anything_changes(
    make_settings: Callable[..., Settings], tmp_path: Path, target: str
) -> None:
    """A typo such as DATABASE_URL=sqlite:////tmp (or a FIFO, a device, someone else's file) must not have
    its mode changed, nor a lock file put beside it, before the bot says no."""
    from bot.errors import BotError
    from bot.home import secure_home

    place = tmp_path / "shared"
    place.mkdir(mode=0o755)
    place.chmod(0o1777)  # a shared folder, like /tmp
    path = place / "db"
    if target == "directory":
        path.mkdir(mode=0o755)
    elif target == "fifo":
        os.mkfifo(path, 0o666)
        path.chmod(0o666)
    else:
        path.write_text("")
        path.chmod(0o644)
        if os.getuid() == 0:
            os.chown(path, 65534, 65534)  # nobody's
        else:
            pytest.skip("needs root to make a file of another user's")
    before = {p: stat.S_IMODE(p.lstat().st_mode) for p in (place, path)}
    settings = make_settings(database_url=f"sqlite:///{path}")
    with pytest.raises(BotError, match="not a plain file of this user's"):
        secure_home(settings)
    assert {p: stat.S_IMODE(p.lstat().st_mode) for p in (place, path)} == before
    assert sorted(q.name for q in place.iterdir()) == ["db"]


# -- the one-time link page: forwarded headers only from a configured proxy ------------------------


async def _link(gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM) -> str:
    fake_llm.then(Reply(tool_calls=[("credential_request", {"name": "link.token", "reason": "via a link"})]))
    credentials = gateway.app.credentials
    seen = {r.id for r in await credentials.store.pending()}
    await gateway.send_event(mention("need a token"))
    async with asyncio.timeout(10):
        while not (new := [r for r in await credentials.store.pending() if r.id not in seen]):
            await asyncio.sleep(0.02)
    return await CredentialLinks(credentials).create_link(new[0].id)


async def _status(url: str, headers: Mapping[str, str] | None = None) -> int:
    async with aiohttp.ClientSession() as http, http.get(url, headers=headers or {}) as resp:
        return resp.status


FORGED = {"Host": "bot.example.com", "X-Forwarded-Proto": "https"}


async def test_forwarded_proto_from_a_peer_that_is_not_a_trusted_proxy_is_refused(
    make_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    # The peer is 127.0.0.1, but the only trusted proxy is elsewhere: the header is a forgery.
    gateway: GatewayClient = await start_gateway(make_settings(bot_trusted_proxies="10.9.0.0/16"))
    url = f"{gateway.base}/credentials/{await _link(gateway, fake_slack, fake_llm)}"
    assert await _status(url, FORGED) == 403
    # An untrusted proxy on this machine in front of 127.0.0.1 (nginx's default Host is the upstream):
    # a loopback peer and Host, but the request came from elsewhere, maybe in clear.
    assert await _status(url, {"X-Forwarded-For": "203.0.113.9"}) == 403
    assert await _status(url, {"X-Forwarded-Proto": "http", "X-Forwarded-Host": "localhost"}) == 403
    assert await _status(url, {"Forwarded": "for=203.0.113.9;proto=https"}) == 403
    assert await _status(url) == 200  # a browser on this machine, talking to 127.0.0.1 directly
    async with aiohttp.ClientSession() as http:
        async with http.post(url, data={"value": "forged-secret-1"}, headers=FORGED) as resp:
            assert resp.status == 403
    assert await gateway.app.credentials.store.all_secrets() == []


async def test_forwarded_proto_from_a_trusted_proxy_is_believed(
    make_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    gateway: GatewayClient = await start_gateway(make_settings(bot_trusted_proxies="127.0.0.1"))
    url = f"{gateway.base}/credentials/{await _link(gateway, fake_slack, fake_llm)}"
    assert await _status(url, FORGED) == 200  # the proxy terminated TLS and says so
    assert await _status(url, {"Host": "bot.example.com", "X-Forwarded-Proto": "http"}) == 403
    # A client cannot smuggle "https" ahead of what the proxy appended, in one header line or two.
    assert await _status(url, {"Host": "bot.example.com", "X-Forwarded-Proto": "https, http"}) == 403
    two_lines = CIMultiDict([("Host", "bot.example.com"), ("X-Forwarded-Proto", "https"),
                             ("X-Forwarded-Proto", "http")])
    assert await _status(url, two_lines) == 403
    async with aiohttp.ClientSession() as http:
        async with http.post(url, data={"value": "proxied-secret-2"}, headers=FORGED) as resp:
            assert resp.status == 200


def _outward_address() -> str | None:
    """An address of this machine that is not loopback (connecting to it, the peer is not 127.0.0.1)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.123", 9))  # no packet is sent: this only picks a source address
            address = str(s.getsockname()[0])
        except OSError:
            return None
    return None if address.startswith("127.") else address


async def test_a_peer_that_is_not_loopback_cannot_pretend_to_be_local(
    make_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    address = _outward_address()
    if address is None:
        pytest.skip("this machine has no address other than loopback")
    settings = make_settings(host="0.0.0.0", bot_web_chat=False)
    gateway: GatewayClient = await start_gateway(settings)
    url = f"http://{address}:{gateway.app.bound_port}/credentials/{await _link(gateway, fake_slack, fake_llm)}"
    assert await _status(url) == 403  # from another address in clear
    assert await _status(url, {"Host": f"localhost:{gateway.app.bound_port}"}) == 403  # a forged local Host
    assert await _status(url, {"Host": "127.0.0.1"}) == 403
    assert await _status(url, FORGED) == 403

    trusting: GatewayClient = await start_gateway(make_settings(
        host="0.0.0.0", bot_web_chat=False, bot_trusted_proxies=f"{address}/32", bot_home=settings.bot_home / "2"))
    url = f"http://{address}:{trusting.app.bound_port}/credentials/{await _link(trusting, fake_slack, fake_llm)}"
    assert await _status(url, FORGED) == 200  # that address is the configured proxy
    assert await _status(url, {"Host": f"localhost:{trusting.app.bound_port}"}) == 403


async def test_a_legacy_row_whose_key_is_missing_does_not_stop_the_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    old_spec = key("old")
    service, db = await _service(f"sqlite:///{tmp_path / 'v.db'}", old_spec)
    await _insert_legacy(db, service.keys, "old.token", "default", "legacy-value-9")
    await db.close()
    service, db = await _service(f"sqlite:///{tmp_path / 'v.db'}", key("new"))
    caplog.set_level(logging.WARNING)
    assert await service.upgrade_legacy() == 0  # it stays as it is, with a warning naming it
    assert [r.aad_version for r in await service.store.all_secrets()] == [1]
    assert any("old.token" in r.getMessage() and "'old'" in r.getMessage() for r in caplog.records)
    assert all("legacy-value-9" not in r.getMessage() for r in caplog.records)
    await db.close()
    service, db = await _service(f"sqlite:///{tmp_path / 'v.db'}", f"{key('new')},{old_spec}")
    assert await service.upgrade_legacy() == 1  # once the key is back
    assert await _opens_as(service, "default", "old.token") == "legacy-value-9"
    await db.close()


async def test_the_link_page_knows_every_relay_header_and_checks_the_port(
    gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    """The same rule as the web chat without a token (channels/web/local.py): any header a proxy or CDN adds
    means "relayed", and the Host must be localhost, 127.0.0.1 or [::1] with this server's port."""
    from tests.security.test_web_origin import RELAY_HEADERS

    port = gateway.app.bound_port
    url = f"{gateway.base}/credentials/{await _link(gateway, fake_slack, fake_llm)}"
    for name in RELAY_HEADERS:
        assert await _status(url, {name: "203.0.113.9"}) == 403, name
    for host in ("localhost:1", f"localhost:{port + 1}", "127.99.1.1", f"127.0.0.2:{port}", "localhost",
                 f"attacker.example:{port}"):
        assert await _status(url, {"Host": host}) == 403, host
    assert await _status(url, {"Host": f"localhost:{port}"}) == 200


async def test_the_link_page_refuses_an_absolute_form_request_target(
    gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    port = gateway.app.bound_port
    path = f"/credentials/{await _link(gateway, fake_slack, fake_llm)}"
    for target, expected in ((f"http://evil.example{path}", 403), (path, 200)):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
        async with asyncio.timeout(5):
            data = await reader.read()
        writer.close()
        assert int(data.split(b" ", 2)[1]) == expected, (target, data[:200])
