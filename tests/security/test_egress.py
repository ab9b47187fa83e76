"""Point 4 (where http_request may connect) and the http_request part of point 3 (credential hosts, redirects).

Every call goes through the real tool and real aiohttp connections. A local server records what reaches
it, so "refused" means nothing was sent, not merely that an error came back.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import ipaddress
import json
import socket
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from sqlalchemy import update
from sqlmodel import col

from bot.settings import Settings
from bot.tools.http import http_request_tool
from core.errors import ToolError
from core.store.tables import SecretRow
from core.tools import Tool, ToolContext
from tests.conftest import GatewayClient
from tests.fakes.server import RunningServer

SECRET = "api-secret-4242"


def _ctx() -> ToolContext:
    return ToolContext(session_id="s", turn_id=1, agent="default", sender="U1")


async def _get(tool: Tool, url: str, **args: Any) -> str:
    return await tool.function(_ctx(), {"method": "GET", "url": url, **args})


@dataclass
class Recorder:
    """A local server that notes every request (path and headers) and can redirect."""

    seen: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    redirects: dict[str, str] = field(default_factory=dict)
    server: RunningServer | None = None

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.port

    def app(self) -> web.Application:
        async def handle(request: web.Request) -> web.Response:
            self.seen.append((request.path, dict(request.headers)))
            if request.path in self.redirects:
                raise web.HTTPFound(self.redirects[request.path])
            return web.Response(text=f"hello from {request.path}")

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        return app


@pytest.fixture
async def recorder() -> AsyncIterator[Recorder]:
    rec = Recorder()
    rec.server = await RunningServer(rec.app()).start()
    yield rec
    await rec.server.stop()


@pytest.fixture
async def other() -> AsyncIterator[Recorder]:
    rec = Recorder()
    rec.server = await RunningServer(rec.app()).start()
    yield rec
    await rec.server.stop()


def _tool_of(gw: GatewayClient) -> Tool:
    tool = gw.app.dispatcher.runner.tools.get("http_request")
    assert tool is not None
    return tool


async def _store_secret(gw: GatewayClient, name: str, hosts: list[str] | None) -> None:
    await gw.app.credentials.set_secret(name, SECRET, scope="agent", agent="default", by="U1")
    async with gw.app.db.write() as s:
        await s.exec(update(SecretRow).where(col(SecretRow.name) == name)
                     .values(hosts=None if hosts is None else json.dumps(hosts)))


# -- addresses ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("url", "why"), [
    ("http://127.0.0.1:{port}/", "loopback"),
    ("http://localhost:{port}/", "loopback"),  # a name: checked after resolution
    ("http://LOCALHOST:{port}/", "loopback"),
    ("http://[::1]:{port}/", "loopback"),
    ("http://[::ffff:127.0.0.1]:{port}/", "loopback"),  # IPv4-mapped
    ("http://[::127.0.0.1]:{port}/", "loopback"),  # IPv4-compatible
    ("http://2130706433:{port}/", "loopback"),  # decimal
    ("http://0x7f.1:{port}/", "loopback"),  # hexadecimal, short form
    ("http://127.1:{port}/", "loopback"),
    ("http://017700000001:{port}/", "loopback"),  # octal
    ("http://0.0.0.0:{port}/", "unspecified"),  # Linux connects 0.0.0.0 to this machine
    ("http://169.254.169.254/latest/meta-data/", "link-local"),
    ("http://[::ffff:169.254.169.254]/", "link-local"),
    ("http://10.0.0.5/", "private"),
    ("http://172.16.1.1/", "private"),
    ("http://192.168.1.1/", "private"),
    ("http://100.64.0.1/", "carrier-grade NAT"),
    ("http://[fd00::1]/", "private"),
    ("http://[fe80::1]/", "link-local"),
    ("http://224.0.0.1/", "multicast"),
    ("http://[2002:7f00:1::]:{port}/", "loopback"),  # 6to4 wrapping 127.0.0.1
])
async def test_non_public_addresses_are_refused(recorder: Recorder, url: str, why: str) -> None:
    tool = http_request_tool(timeout_s=2)  # the default policy: nothing private
    with pytest.raises(ToolError, match=rf"^http_request refused: .*{why}.*HTTP_ALLOW_HOSTS=") as err:
        await _get(tool, url.format(port=recorder.port))
    assert "timed out" not in str(err.value)
    assert recorder.seen == []


async def test_the_refusal_names_the_host_and_the_address() -> None:
    tool = http_request_tool(timeout_s=2)
    with pytest.raises(ToolError) as err:
        await _get(tool, "http://localhost:9/")
    message = str(err.value)
    assert message.startswith("http_request refused: localhost resolves to ")
    assert "a loopback address; set HTTP_ALLOW_HOSTS=localhost to allow it" in message


async def test_a_public_address_is_not_refused_by_the_policy() -> None:
    """Public addresses pass the rule (tests have no network, so this is checked on the rule itself);
    special-purpose space such as 192.0.2.0/24 (documentation) does not."""
    from bot.egress import EgressPolicy

    policy = EgressPolicy()
    assert policy.refusal("dns.example", "8.8.8.8", 443) is None
    assert policy.refusal("dns.example", "2001:4860:4860::8888", 443) is None
    assert "special-purpose" in (policy.refusal("doc.example", "192.0.2.10", 80) or "")


@pytest.mark.parametrize("address", ["192.0.0.9", "192.0.0.10", "192.0.0.170", "::ffff:192.0.0.9", "3fff::1",
                                     "198.18.0.1", "2001:db8::1"])
def test_special_purpose_space_is_refused_whatever_the_python_release(address: str) -> None:
    # 192.0.0.0/24 is IETF protocol space; Python before 3.11.10 called parts of it public (review point 8).
    from bot.egress import EgressPolicy

    assert "special-purpose" in (EgressPolicy().refusal("x.example", address, 443) or "")


def test_the_connect_time_check_sees_the_real_address() -> None:
    """The socket factory aiohttp uses checks the exact address a socket is about to connect to, so an
    answer that changes between a check and the connect (DNS rebinding) still meets the rule."""
    from bot.egress import EgressPolicy
    from bot.errors import EgressRefused

    make = EgressPolicy().socket_factory("rebind.example")
    with pytest.raises(EgressRefused, match=r"rebind\.example resolves to 127\.0\.0\.1, a loopback address"):
        make((socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.0.0.1", 80)))
    with pytest.raises(EgressRefused, match=r"169\.254\.169\.254"):
        make((socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("::ffff:169.254.169.254", 80, 0, 0)))
    sock = EgressPolicy().socket_factory("dns.example")(
        (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("8.8.8.8", 53)))
    sock.close()


# -- settings: HTTP_ALLOW_PRIVATE, HTTP_ALLOW_HOSTS, the bot's own listener ---------------------------


async def test_allow_private_reaches_a_local_server_but_never_the_bot_itself(
    make_settings: Callable[..., Settings], start_gateway: Any, recorder: Recorder
) -> None:
    gw: GatewayClient = await start_gateway(make_settings(http_allow_private=True))
    tool = _tool_of(gw)
    assert (await _get(tool, f"http://127.0.0.1:{recorder.port}/ok")).startswith("HTTP 200")
    assert (await _get(tool, f"http://localhost:{recorder.port}/ok")).startswith("HTTP 200")
    assert [path for path, _ in recorder.seen] == ["/ok", "/ok"]
    own = gw.app.bound_port
    for url in (f"http://127.0.0.1:{own}/healthz", f"http://localhost:{own}/healthz",
                f"http://[::ffff:127.0.0.1]:{own}/healthz", f"http://2130706433:{own}/healthz"):
        with pytest.raises(ToolError, match=r"^http_request refused: .*this bot's own listener"):
            await _get(tool, url)


async def test_a_wildcard_listener_is_refused_on_every_local_address(
    make_settings: Callable[..., Settings], start_gateway: Any
) -> None:
    gw: GatewayClient = await start_gateway(make_settings(host="0.0.0.0", bot_web_token="t" * 40,
                                                          http_allow_private=True))
    tool = _tool_of(gw)
    own = gw.app.bound_port
    addresses = ["127.0.0.1", "127.0.0.2"]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        with contextlib.suppress(OSError):
            s.connect(("192.0.2.1", 9))  # no packet is sent; this picks this machine's outgoing address
            if not ipaddress.ip_address(s.getsockname()[0]).is_unspecified:
                addresses.append(s.getsockname()[0])
    for address in addresses:
        with pytest.raises(ToolError, match=r"this bot's own listener"):
            await _get(tool, f"http://{address}:{own}/healthz")


async def test_allow_hosts_lets_exactly_the_listed_hosts_through(
    make_settings: Callable[..., Settings], start_gateway: Any, recorder: Recorder
) -> None:
    gw: GatewayClient = await start_gateway(make_settings(http_allow_hosts="localhost"))
    tool = _tool_of(gw)
    assert (await _get(tool, f"http://localhost:{recorder.port}/listed")).startswith("HTTP 200")
    assert (await _get(tool, f"http://LocalHost:{recorder.port}/listed")).startswith("HTTP 200")
    for url in (f"http://127.0.0.1:{recorder.port}/", f"http://[::1]:{recorder.port}/",
                f"http://localhost.localdomain.invalid:{recorder.port}/"):
        with pytest.raises(ToolError):
            await _get(tool, url)
    assert [path for path, _ in recorder.seen] == ["/listed", "/listed"]

    gw2: GatewayClient = await start_gateway(make_settings(http_allow_hosts="127.0.0.1"))
    assert (await _get(_tool_of(gw2), f"http://127.0.0.1:{recorder.port}/ip")).startswith("HTTP 200")
    with pytest.raises(ToolError, match="refused"):
        await _get(_tool_of(gw2), f"http://localhost:{recorder.port}/ip")  # the name is not listed


# -- credentials with hosts ---------------------------------------------------------------------------


async def test_a_credential_is_only_sent_to_its_hosts(
    make_settings: Callable[..., Settings], start_gateway: Any, recorder: Recorder
) -> None:
    # The recorder is local and speaks plain http: a credential goes there only to hosts declared internal.
    gw: GatewayClient = await start_gateway(make_settings(http_allow_hosts="127.0.0.1,localhost"))
    tool = _tool_of(gw)
    await _store_secret(gw, "api.token", ["api.example"])
    with pytest.raises(ToolError, match=r"api\.token may only be sent to api\.example, not 127\.0\.0\.1"):
        await _get(tool, f"http://127.0.0.1:{recorder.port}/steal", credential="api.token")
    with pytest.raises(ToolError, match=r"header Host is set from the URL"):
        # the URL says where the request goes; the model sets no Host (tests/security/test_credential_abuse.py)
        await _get(tool, f"http://127.0.0.1:{recorder.port}/steal", credential="api.token",
                   headers={"Host": "api.example"})
    assert recorder.seen == []  # refused before connecting

    await _store_secret(gw, "local.token", ["LOCALHOST", "*.example"])
    result = await _get(tool, f"http://localhost:{recorder.port}/fine", credential="local.token")
    assert result.startswith("HTTP 200")
    assert recorder.seen[-1][1]["Authorization"] == f"Bearer {SECRET}"

    await _store_secret(gw, "any.token", None)  # no hosts: not restricted
    assert (await _get(tool, f"http://127.0.0.1:{recorder.port}/any", credential="any.token")).startswith("HTTP")


def test_credential_host_matching() -> None:
    from core.stored_secrets import CredentialUse

    use = CredentialUse({"Authorization": "Bearer x"}, ("api.example", "*.corp.example"))
    assert use.allows("api.example") and use.allows("API.Example.")
    assert use.allows("git.corp.example") and use.allows("a.b.corp.example")
    assert not use.allows("corp.example")  # *. is for subdomains only
    assert not use.allows("api.example.evil") and not use.allows("evilapi.example")
    assert not use.allows("xcorp.example")
    assert CredentialUse({}, None).allows("anything.example")
    assert not CredentialUse({}, ()).allows("anything.example")


# -- redirects ----------------------------------------------------------------------------------------


async def test_a_cross_host_redirect_never_carries_the_credential(
    make_settings: Callable[..., Settings], start_gateway: Any, recorder: Recorder, other: Recorder
) -> None:
    # Local plain-http servers: listed as internal, or no credential would be sent to them at all.
    gw: GatewayClient = await start_gateway(make_settings(http_allow_hosts="127.0.0.1,localhost"))
    tool = _tool_of(gw)
    await _store_secret(gw, "api.token", None)
    targets = {
        "/to-name": f"http://localhost:{other.port}/land",  # same machine, other name
        "/to-port": f"http://127.0.0.1:{other.port}/land",  # same name, other port
        "/to-user": f"http://x@127.0.0.1:{other.port}/land",
        "/to-relative": f"//localhost:{other.port}/land",
    }
    recorder.redirects.update(targets)
    recorder.redirects["/same"] = "/next"
    for path in targets:
        result = await _get(tool, f"http://127.0.0.1:{recorder.port}{path}", credential="api.token")
        assert "HTTP 302" in result and "not followed" in result and "/land" in result, result
    assert other.seen == []
    # On the same host a redirect is followed, with the credential (it goes where it went before).
    result = await _get(tool, f"http://127.0.0.1:{recorder.port}/same", credential="api.token")
    assert "HTTP 200" in result and "followed redirect" in result
    assert recorder.seen[-1][0] == "/next" and recorder.seen[-1][1]["Authorization"] == f"Bearer {SECRET}"


def test_redirect_rule() -> None:
    from yarl import URL

    from bot.tools.http import redirect_refusal

    def refused(a: str, b: str) -> bool:
        return redirect_refusal(URL(a), URL(b)) is not None

    assert refused("https://api.example/a", "http://api.example/b")  # downgrade: the credential in clear
    assert refused("https://api.example:8443/a", "http://api.example:8443/b")
    assert refused("https://api.example/a", "https://other.example/b")
    assert refused("https://api.example/a", "https://api.example:8443/b")
    assert refused("http://api.example/a", "file:///etc/passwd")
    assert not refused("https://api.example/a", "https://API.example/b")
    assert not refused("http://api.example/a", "https://api.example/b")  # an upgrade is fine
    assert not refused("http://api.example:8080/a", "http://api.example:8080/b")
    # user:password@ would go out as an Authorization header no policy rule saw (review of issue 32.3)
    assert refused("https://api.example/a", "https://admin:pw@api.example/b")
    assert refused("https://api.example/a", "https://admin@api.example/b")


def _self_signed(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server context for 127.0.0.1 and a client context that trusts it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert_file, key_file)
    return server, ssl.create_default_context(cafile=str(cert_file))


async def test_an_https_to_http_redirect_on_the_same_host_is_not_followed(tmp_path: Path) -> None:
    """https://127.0.0.1:P/start answers 302 to http://127.0.0.1:P/next: same host, same port, plain text.

    Port P is a small relay: TLS goes on to the https server, anything else is plain text on the wire
    (what an eavesdropper would read) and is recorded."""
    from bot.egress import EgressPolicy
    from core.stored_secrets import CredentialUse

    server_ctx, client_ctx = _self_signed(tmp_path)
    plaintext: list[bytes] = []
    relay_port = 0

    async def start(request: web.Request) -> web.Response:
        raise web.HTTPFound(f"http://127.0.0.1:{relay_port}/next")

    app = web.Application()
    app.router.add_get("/start", start)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ctx)
    await site.start()
    tls_port = int(runner.addresses[0][1])
    pipes: set[asyncio.Task[None]] = set()

    async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        dst.close()

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = await reader.read(65536)
        if first[:1] == b"\x16":  # a TLS handshake record
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", tls_port)
            up_writer.write(first)
            for task in (asyncio.create_task(pipe(reader, up_writer)), asyncio.create_task(pipe(up_reader, writer))):
                pipes.add(task)
            return
        plaintext.append(first)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()

    relay_server = await asyncio.start_server(relay, "127.0.0.1", 0)
    relay_port = relay_server.sockets[0].getsockname()[1]

    async def credential(_ctx: ToolContext, _name: str) -> CredentialUse:
        return CredentialUse({"Authorization": f"Bearer {SECRET}"}, None)

    tool = http_request_tool(timeout_s=5, credential_headers=credential, egress=EgressPolicy(allow_private=True),
                             ssl_context=client_ctx)
    try:
        result = await _get(tool, f"https://127.0.0.1:{relay_port}/start", credential="api.token")
        assert "HTTP 302" in result and "not followed" in result and "http://" in result, result
        assert plaintext == []
    finally:
        relay_server.close()
        for task in pipes:
            task.cancel()
        await asyncio.gather(*pipes, return_exceptions=True)
        await runner.cleanup()


# -- the bot's own listener, whatever the settings ----------------------------------------------------


@pytest.mark.parametrize("settings", [
    {"http_allow_hosts": "localhost,127.0.0.1"},
    {"http_allow_hosts": "localhost", "http_allow_private": True},
    {"http_allow_private": True},
])
async def test_no_setting_opens_the_bots_own_listener(make_settings: Callable[..., Settings], start_gateway: Any,
                                                      settings: dict[str, Any]) -> None:
    """Listing localhost (to reach some other local service) must not let the model call the token-less web
    chat, which would take a loopback Host as "the operator's browser" (and approve its own requests)."""
    gw: GatewayClient = await start_gateway(make_settings(**settings))
    tool = _tool_of(gw)
    own = gw.app.bound_port
    for url in (f"http://localhost:{own}/api/conversations", f"http://127.0.0.1:{own}/api/conversations",
                f"http://LocalHost:{own}/api/conversations", f"http://[::ffff:127.0.0.1]:{own}/healthz"):
        with pytest.raises(ToolError, match=r"^http_request refused: .*this bot's own listener") as err:
            await _get(tool, url)
        assert "HTTP_ALLOW" not in str(err.value)  # no setting lifts it, so none is suggested
    with pytest.raises(ToolError, match="own listener"):
        await tool.function(_ctx(), {"method": "POST", "url": f"http://localhost:{own}/api/approvals/1",
                                     "headers": {"Content-Type": "application/json"}, "body": '{"verdict": "approve"}'})


def test_the_own_listener_rule_comes_before_the_allow_list() -> None:
    from bot.egress import EgressPolicy

    policy = EgressPolicy(allow_private=True, allow_hosts=("vm", "localhost"), own_port=lambda: 8080)
    assert "own listener" in (policy.refusal("vm", "127.0.0.1", 8080) or "")
    assert "own listener" in (policy.refusal("localhost", "::1", 8080) or "")
    assert policy.refusal("vm", "127.0.0.1", 8081) is None  # another port on this machine: listed, allowed


# -- headers from the model (or a stored credential) ----------------------------------------------------


@pytest.mark.parametrize("headers", [
    {"X-Test": "a\r\nHost: 127.0.0.1"},
    {"X-Test": "a\nb"},
    {"X-Test": "a\rb"},
    {"X-Test": "a\x00b"},
    {"X-Test\r\nHost": "x"},
    {"X Test": "x"},
    {"": "x"},
    {"X-Tést": "x"},
    {":authority": "x"},
    {"Host ": "127.0.0.1"},
])
async def test_bad_headers_are_a_tool_error_and_nothing_is_sent(recorder: Recorder, headers: dict[str, str]) -> None:
    from bot.egress import EgressPolicy

    tool = http_request_tool(timeout_s=2, egress=EgressPolicy(allow_private=True))
    with pytest.raises(ToolError, match=r"^http_request refused: header"):
        await _get(tool, f"http://127.0.0.1:{recorder.port}/", headers=headers)
    assert recorder.seen == []


@pytest.mark.parametrize("value", ["Host: 127.0.0.1:1", "X-Api-Key: abc\rdef", "tok\ren"])
async def test_a_credential_cannot_set_host_or_break_a_header(recorder: Recorder, value: str) -> None:
    """The credential's header is checked like the model's; the message never shows the value."""
    from bot.egress import EgressPolicy
    from core.stored_secrets import CredentialUse

    async def credential(_ctx: ToolContext, _name: str) -> CredentialUse:
        header, sep, rest = value.partition(":")
        return CredentialUse({header: rest.strip()} if sep else {"Authorization": f"Bearer {value}"}, None)

    tool = http_request_tool(timeout_s=2, credential_headers=credential,
                             egress=EgressPolicy(allow_private=True, allow_hosts=("127.0.0.1",)))
    with pytest.raises(ToolError, match=r"^http_request refused: credential api\.token") as err:
        await _get(tool, f"http://127.0.0.1:{recorder.port}/", credential="api.token")
    assert value.split(":")[-1].strip() not in str(err.value)
    assert recorder.seen == []


async def test_a_redirect_keeps_the_host_of_the_url(recorder: Recorder) -> None:
    """Every hop, with or without a credential, is sent with Host = the URL's own host and port."""
    from bot.egress import EgressPolicy

    recorder.redirects["/a"] = "/b"
    tool = http_request_tool(timeout_s=2, egress=EgressPolicy(allow_private=True))
    result = await _get(tool, f"http://127.0.0.1:{recorder.port}/a", headers={"X-Test": "1"})
    assert "HTTP 200" in result
    assert [(path, h["Host"]) for path, h in recorder.seen] == [("/a", f"127.0.0.1:{recorder.port}"),
                                                                ("/b", f"127.0.0.1:{recorder.port}")]
