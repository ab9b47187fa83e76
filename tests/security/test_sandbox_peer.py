"""A ``shell_run`` command shares the host's network (SHELL_NETWORK=true), so it can reach the bot's own
listener at 127.0.0.1. It must not be "this machine" there: while a call runs, a connection is served
only when a trusted process holds its client socket (one in the bot's PID namespace that the bot did not
start), on every route (issue 12, points 2 and 6). A command can neither slip through while it is killed
nor, by flooding the server, delay anyone else's requests.

Everything goes over real sockets to the real server; the commands run in the real sandbox.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bot.settings import Settings
from tests.conftest import GatewayClient
from tests.fakes.llm import FakeLLM, Reply
from tests.security.test_sandbox import BWRAP, REQUIRED
from tests.security.test_web_origin import _outside_address

CID = "0123456789abcdef0123456789abcdef"
OTHER_CID = "fedcba9876543210fedcba9876543210"

# Run inside the command (and by a process outside it, for comparison): prints "<label> route=status ...".
PROBE = r"""
import json, sys, urllib.error, urllib.request
base, label, approval = sys.argv[1], sys.argv[2], sys.argv[3]

def status(method, path, body=None, headers=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except Exception as exc:
        return type(exc).__name__

found = [("conversations", status("GET", "/api/conversations")), ("metrics", status("GET", "/metrics")),
         ("page", status("GET", "/")),
         ("link", status("GET", "/credentials/no-such-link", headers={"X-Forwarded-Proto": "https"}))]
if approval != "-":
    found.append(("approve", status("POST", "/api/approvals/" + approval, {"verdict": "approve"},
                                    {"Content-Type": "application/json"})))
print(label, " ".join(f"{name}={code}" for name, code in found), flush=True)
"""


@pytest.fixture(params=["bwrap", "none"])
def mode(request: pytest.FixtureRequest) -> str:
    if request.param == "bwrap" and not BWRAP and not REQUIRED:
        pytest.skip("bubblewrap is missing or cannot run here")
    return str(request.param)


async def _fetch(method: str, url: str, body: Any = None) -> int:
    async with aiohttp.ClientSession() as http:
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": "application/json"} if body is not None else {}
        async with http.request(method, url, data=data, headers=headers) as resp:
            await resp.read()
            return resp.status


async def _parked(gw: GatewayClient, conversation: str, text: str, tool: str, args: dict[str, Any],
                  fake_llm: FakeLLM, before: set[int]) -> int:
    fake_llm.then(Reply(tool_calls=[(tool, args)]))
    assert await _fetch("POST", f"{gw.base}/api/conversations/{conversation}/messages", {"text": text}) == 200
    async with asyncio.timeout(10):
        while True:
            fresh = [a.id for a in await gw.app.approvals.pending() if a.id not in before]
            if fresh:
                return fresh[0]
            await asyncio.sleep(0.01)


def _outsider(work: Path, base: str) -> subprocess.Popen[bytes]:
    """A client that is not the bot's descendant (like a browser): double-forked, reparented away."""
    script = f"(setsid {sys.executable} probe.py {base} outside - > outside.txt 2>&1 &)"
    return subprocess.Popen(["/bin/sh", "-c", script], cwd=work)


async def test_a_command_cannot_use_the_bots_own_listener(
    mode: str, make_settings: Callable[..., Settings], start_gateway: Any, fake_llm: FakeLLM, tmp_path: Path,
) -> None:
    # A proxy on this machine is trusted: a command could claim to be it (X-Forwarded-Proto: https).
    gw: GatewayClient = await start_gateway(make_settings(shell_sandbox=mode, bot_trusted_proxies="127.0.0.1"))
    work = tmp_path / "home" / "work" / "default"
    work.mkdir(parents=True, exist_ok=True)
    (work / "probe.py").write_text(PROBE)
    base = gw.base
    victim = await _parked(gw, OTHER_CID, "fetch it", "http_request",
                           {"method": "GET", "url": "http://example.invalid/"}, fake_llm, set())
    command = (
        f"python3 probe.py {base} inside {victim}; "
        # A background process (detached, in its own session) tries too, while the call runs.
        f"(setsid python3 probe.py {base} background {victim} > bg.txt 2>&1 &); "
        "for i in $(seq 200); do grep -q background bg.txt 2>/dev/null && break; sleep 0.05; done; cat bg.txt; "
        "touch probed; for i in $(seq 200); do [ -e release ] && break; sleep 0.05; done"
    )
    own = await _parked(gw, CID, "probe it", "shell_run", {"command": command, "timeout_s": 20}, fake_llm, {victim})
    fake_llm.then(Reply("done"))
    peers = gw.app.sandbox_peers
    assert peers is not None
    assert await _fetch("POST", f"{base}/api/approvals/{own}", {"verdict": "approve"}) == 200
    async with asyncio.timeout(10):
        while not (work / "probed").exists():
            await asyncio.sleep(0.02)
    # During the same call, this machine's clients are still served: the test process itself, and a
    # separate process that the bot did not start.
    checks = peers.lookups
    for path in ("/api/conversations", "/metrics", "/"):
        assert await _fetch("GET", base + path) == 200, path
    assert peers.lookups > checks  # the check ran (a sandbox is running) and let us through
    outsider = _outsider(work, base)
    outsider.wait(5)
    async with asyncio.timeout(10):
        while "outside" not in ((work / "outside.txt").read_text() if (work / "outside.txt").exists() else ""):
            await asyncio.sleep(0.02)
    (work / "release").touch()
    async with asyncio.timeout(10):  # the other conversation stays parked: wait for this tool result
        while not any("inside " in str(r["messages"][-1].get("content")) for r in fake_llm.requests):
            await asyncio.sleep(0.02)

    told = next(str(r["messages"][-1]["content"]) for r in fake_llm.requests
                if "inside " in str(r["messages"][-1].get("content")))
    inside = next(line for line in told.splitlines() if line.startswith("inside "))
    background = next(line for line in told.splitlines() if line.startswith("background "))
    for line in (inside, background):
        assert line.split()[1:] == ["conversations=403", "metrics=403", "page=403", "link=403", "approve=403"], told
    # The same requests from outside the command: served (the link does not exist: 410).
    assert (work / "outside.txt").read_text().split() == [
        "outside", "conversations=200", "metrics=200", "page=200", "link=410"]
    info = await gw.app.approvals.get(victim)
    assert info is not None and info.status == "pending"  # the command did not approve it
    await gw.app.approvals.decide(victim, "deny", by="web")  # let that turn end: a quick shutdown
    await gw.idle()


async def test_no_check_while_no_command_runs(gateway: GatewayClient) -> None:
    """The lookup costs nothing when no command is running: not one read of /proc."""
    peers = gateway.app.sandbox_peers
    assert peers is not None
    for path in ("/api/conversations", "/metrics", "/", "/healthz"):
        assert await _fetch("GET", gateway.base + path) == 200
    assert peers.lookups == 0
    tool = gateway.app.dispatcher.runner.tools.get("shell_run")
    assert tool is not None
    from core.tools import ToolContext

    peers.grace_s = 60  # deterministic: "just after" lasts as long as this test needs
    out = await tool.function(ToolContext(session_id="s", turn_id=1, agent="default", sender="U1"),
                              tool.parse_arguments({"command": "true"}))
    assert out.startswith("exit code 0"), out
    # Just after a call, a request may still be one its processes sent: it is checked...
    assert await _fetch("GET", gateway.base + "/api/conversations") == 200
    assert peers.lookups == 1
    # ...but not once the grace has passed.
    peers.grace_s = 0
    for path in ("/api/conversations", "/metrics"):
        assert await _fetch("GET", gateway.base + path) == 200
    assert peers.lookups == 1


async def test_no_check_when_commands_have_no_network(make_settings: Callable[..., Settings],
                                                      start_gateway: Any) -> None:
    if not BWRAP and not REQUIRED:
        pytest.skip("bubblewrap is missing or cannot run here")
    gw: GatewayClient = await start_gateway(make_settings(shell_sandbox="bwrap", shell_network=False))
    peers = gw.app.sandbox_peers
    tool = gw.app.dispatcher.runner.tools.get("shell_run")
    assert peers is not None and tool is not None
    from core.tools import ToolContext

    call = asyncio.ensure_future(tool.function(ToolContext(session_id="s", turn_id=1, agent="default", sender="U1"),
                                               tool.parse_arguments({"command": "sleep 0.3"})))
    await asyncio.sleep(0.1)
    assert await _fetch("GET", gw.base + "/api/conversations") == 200
    assert (await call).startswith("exit code 0")
    assert peers.lookups == 0 and not peers.active


# -- a command that floods the server, or keeps sending while it is killed -------------------------------

REQUEST = r"""
import os, socket, sys, time
port, cid = int(sys.argv[1]), sys.argv[2]
body = b'{"text": "sent by a command"}'
request = (f"POST /api/conversations/{cid}/messages HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
           f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
"""

# Processes holding as many descriptors as they may (slow to walk), and hundreds of connections, each
# with a message for the web chat; then the statuses the server answered.
FLOOD = REQUEST + r"""
import resource
children, connections = int(sys.argv[3]), int(sys.argv[4])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
connections = min(connections, hard - 100)

def fill(keep):
    fd = os.open("/dev/null", os.O_RDONLY)
    try:
        for _ in range(min(hard, 20000) - keep):
            os.dup(fd)
    except OSError:
        pass

for _ in range(children):
    if os.fork() == 0:
        fill(64)
        time.sleep(60)
        os._exit(0)
fill(connections + 64)
socks = []
for _ in range(connections):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(request)
    socks.append(s)
open("flooded", "w").close()
while not os.path.exists("release"):
    time.sleep(0.01)
statuses = {}
deadline = time.time() + 5
for s in socks:
    s.settimeout(max(0.01, deadline - time.time()))
    try:
        status = s.recv(64).split(b" ")[1].decode()
    except Exception as exc:
        status = type(exc).__name__
    statuses[status] = statuses.get(status, 0) + 1
print("statuses", sorted(statuses.items()), flush=True)
"""

# Detached processes (double-forked: they hang off the sandbox's init) that open connection after
# connection, each with a message, and keep them all open: requests are on their way during the kill.
KEEP_SENDING = REQUEST + r"""
for _ in range(4):
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            held = []
            while True:
                try:
                    s = socket.create_connection(("127.0.0.1", port))
                    s.sendall(request)
                    held.append(s)
                except OSError:
                    pass
                time.sleep(0.004)
        os._exit(0)
time.sleep(60)
"""


def _ctx() -> Any:
    from core.tools import ToolContext

    return ToolContext(session_id="s", turn_id=1, agent="default", sender="U1")


async def _conversations(gw: GatewayClient) -> list[str]:
    async with aiohttp.ClientSession() as http, http.get(gw.base + "/api/conversations") as resp:
        assert resp.status == 200
        return [str(c.get("id")) for c in (await resp.json())["conversations"]]


async def test_a_command_killed_while_it_sends_is_never_served(
    mode: str, make_settings: Callable[..., Settings], start_gateway: Any, tmp_path: Path,
) -> None:
    """Requests queued while the call is killed (its processes dying, reparented away from the bot) are
    refused like those sent before; the bot's own requests meanwhile are served."""
    gw: GatewayClient = await start_gateway(make_settings(shell_sandbox=mode))
    peers = gw.app.sandbox_peers
    tool = gw.app.dispatcher.runner.tools.get("shell_run")
    assert peers is not None and tool is not None
    work = tmp_path / "home" / "work" / "default"
    work.mkdir(parents=True, exist_ok=True)
    (work / "send.py").write_text(KEEP_SENDING)
    command = f"python3 send.py {gw.app.bound_port} {CID}"
    out = await tool.function(_ctx(), tool.parse_arguments({"command": command, "timeout_s": 1}))
    assert out.startswith("timed out after 1 s"), out
    await asyncio.sleep(0.3)  # what was sent during the kill has been answered
    assert peers.lookups > 20  # they did send, all along
    assert CID not in await _conversations(gw)  # not one message was accepted from the command


async def test_a_flood_from_a_command_does_not_delay_a_local_user(
    make_settings: Callable[..., Settings], start_gateway: Any, tmp_path: Path,
) -> None:
    """Hundreds of connections from processes with ~20,000 descriptors each: those processes are never
    read, so a local user's request is served at once, and none of the command's."""
    if not BWRAP and not REQUIRED:
        pytest.skip("bubblewrap is missing or cannot run here")
    gw: GatewayClient = await start_gateway(make_settings(shell_sandbox="bwrap"))
    tool = gw.app.dispatcher.runner.tools.get("shell_run")
    assert tool is not None
    work = tmp_path / "home" / "work" / "default"
    work.mkdir(parents=True, exist_ok=True)
    (work / "flood.py").write_text(FLOOD)
    port = gw.app.bound_port
    call = asyncio.ensure_future(tool.function(_ctx(), tool.parse_arguments(
        {"command": f"python3 flood.py {port} {CID} 4 300", "timeout_s": 20})))
    try:
        async with asyncio.timeout(15):
            while not (work / "flooded").exists():
                await asyncio.sleep(0.01)
        started = time.monotonic()
        async with asyncio.timeout(10):
            status = await _get(port, "/api/conversations")
        elapsed = time.monotonic() - started
    finally:
        (work / "release").touch()
        out = await call
    assert status == 200
    # Served while the flood still holds its connections (released only after this request): a server that
    # read them first would wait out the timeout. The bound is loose on purpose: a loaded 2-core runner took 1.8 s.
    assert elapsed < 5, f"a local request waited {elapsed:.2f} s"
    assert "statuses [('403', 300)]" in out, out
    assert CID not in await _conversations(gw)


@pytest.mark.skipif(not BWRAP and not REQUIRED, reason="bubblewrap is missing or cannot run here")
async def test_a_call_ends_only_once_its_sandbox_is_empty(
    make_settings: Callable[..., Settings], start_gateway: Any, tmp_path: Path,
) -> None:
    """The grace after a call starts once none of its processes can send any more."""
    gw: GatewayClient = await start_gateway(make_settings(shell_sandbox="bwrap"))
    peers = gw.app.sandbox_peers
    tool = gw.app.dispatcher.runner.tools.get("shell_run")
    assert peers is not None and tool is not None
    work = tmp_path / "home" / "work" / "default"
    work.mkdir(parents=True, exist_ok=True)
    left: list[list[int]] = []
    begin = peers.begin

    def watched(marker: str | None) -> Callable[[], None]:  # observes the moment the call is declared over
        end = begin(marker)

        def ended() -> None:
            namespace = (work / "ns").read_text().strip()
            left.append([pid for pid in _pids() if _namespace(pid) == namespace and _alive(pid)])
            end()

        return ended

    peers.begin = watched  # type: ignore[method-assign]
    # Background processes that are slow to die (many descriptors to close), with their output closed:
    # nothing waits for them but the end of the call.
    hog = "import os; fd = os.open('/dev/null', 0); [os.dup(fd) for _ in range(15000)]; os.system('sleep 30')"
    command = (f"readlink /proc/self/ns/pid > ns; for i in 1 2 3 4 5 6; do python3 -c \"{hog}\" >/dev/null 2>&1 & "
               "done; sleep 0.3; sleep 30")
    out = await tool.function(_ctx(), tool.parse_arguments({"command": command, "timeout_s": 1}))
    assert out.startswith("timed out"), out
    async with asyncio.timeout(3):
        while not left:
            await asyncio.sleep(0.01)
    assert left == [[]]


def _pids() -> list[int]:
    return [int(e) for e in os.listdir("/proc") if e.isdigit()]


def _alive(pid: int) -> bool:
    """Not a zombie (whose descriptors are all closed)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


def _namespace(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return ""


# -- the lookup itself, on real sockets --------------------------------------------------------------


def _listener() -> socket.socket:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1024)
    return server


HOLD = ("import socket, os, sys, time; s = socket.create_connection((sys.argv[1], int(sys.argv[2]))); "
        "t = time.time() + 10\nwhile time.time() < t and not os.path.exists(sys.argv[3]): time.sleep(0.02)")


def _holder(address: tuple[str, int], release: Path, *, detach: bool, prefix: list[str] | None = None,
            python: str = sys.executable, **popen: Any) -> subprocess.Popen[bytes]:
    """A process holding a connection to ``address`` until ``release`` exists (at most 10 s); ``prefix``
    runs it in a sandbox. Detached: double-forked into a session of its own, so not our descendant."""
    argv = [*(prefix or []), python, "-c", HOLD, address[0], str(address[1]), str(release)]
    if not detach:
        return subprocess.Popen(argv, **popen)
    return subprocess.Popen(["/bin/sh", "-c", '(setsid "$@" &)', "sh", *argv], **popen)


async def _accept(server: socket.socket) -> tuple[socket.socket, Any]:
    server.settimeout(10)
    return await asyncio.to_thread(server.accept)


@pytest.mark.parametrize("source", ["sock_diag", "table"])
async def test_only_trusted_processes_are_served_and_unknown_sockets_fail_closed(tmp_path: Path, source: str) -> None:
    from bot.sandbox_peers import SandboxPeers

    peers = SandboxPeers()
    peers._needs_table = source == "table"  # as in a container without sock_diag: /proc/net/tcp, read by the scan
    server = _listener()
    local = server.getsockname()
    release = tmp_path / "release"
    mine = socket.create_connection(local)
    accepted, peer = server.accept()
    try:
        assert await peers.refuses(peer, local) is False and peers.lookups == 0  # nothing runs: no lookup
        end = peers.begin(None)
        try:
            assert await peers.refuses(peer, local) is False  # held by this process (the bot itself)
            assert peers.lookups == 1
            # A peer nobody holds (the port is unused): cannot tell who it was, so refused.
            assert await peers.refuses(("127.0.0.1", 1), local) is True
            # A child of the bot holding the client socket is treated as a command's process.
            child = _holder(local, release, detach=False)
            conn, child_peer = await _accept(server)
            assert await peers.refuses(child_peer, local) is True
            child.kill()
            child.wait()
            # The same kind of client, detached from the bot (like a browser): served.
            _holder(local, release, detach=True).wait(5)
            conn2, orphan_peer = await _accept(server)
            assert await peers.refuses(orphan_peer, local) is False
            conn.close()
            conn2.close()
            # A client that already closed its socket (orphaned, inode 0): refused.
            gone = socket.create_connection(local)
            accepted_gone, gone_peer = server.accept()
            gone.close()
            assert await peers.refuses(gone_peer, local) is True
            accepted_gone.close()
        finally:
            end()
        peers.grace_s = 0
        assert await peers.refuses(("127.0.0.1", 1), local) is False  # nothing runs any more: never refused
    finally:
        release.touch()
        mine.close()
        accepted.close()
        server.close()


async def test_a_sandboxed_process_is_refused_whatever_its_ancestry(tmp_path: Path) -> None:
    """The kill race: while a call is killed, its sandbox's processes are reparented to the host's init and
    no longer descend from the bot, yet they still hold sockets and their requests are still queued. A
    process in another PID namespace is never trusted, whoever its parent is."""
    from bot.sandbox import Bubblewrap, probe
    from bot.sandbox_peers import SandboxPeers

    sandbox = probe("bwrap").sandbox
    if not isinstance(sandbox, Bubblewrap):
        if REQUIRED:
            raise AssertionError("bubblewrap is required here")
        pytest.skip("bubblewrap is missing or cannot run here")
    work = tmp_path / "work"
    work.mkdir()
    server = _listener()
    local = server.getsockname()
    peers = SandboxPeers()
    end = peers.begin(None)
    try:
        # Started in a sandbox, then orphaned: its chain of parents ends at the host's init.
        prefix = sandbox.argv([], work)
        _holder(local, Path("/work/release"), detach=True, prefix=prefix, python="python3", cwd=work).wait(5)
        conn, sandboxed = await _accept(server)
        # The same program outside any sandbox, orphaned the same way: a local user's client.
        _holder(local, work / "release", detach=True).wait(5)
        conn2, outside = await _accept(server)
        assert await peers.refuses(sandboxed, local) is True
        assert await peers.refuses(outside, local) is False
        conn.close()
        conn2.close()
    finally:
        end()
        (work / "release").touch()
        server.close()


async def test_another_users_socket_is_served(tmp_path: Path) -> None:
    """Commands run as the bot's user: a socket of another user is never a command's (nothing is read)."""
    from bot.sandbox_peers import SandboxPeers

    python = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
    if os.geteuid() != 0 or python is None:
        pytest.skip("needs root (to start a process as another user) and a system python3")
    server = _listener()
    local = server.getsockname()
    peers = SandboxPeers()
    end = peers.begin(None)
    child = _holder(local, tmp_path / "release", detach=False, python=python, user=65534, group=65534)
    try:
        conn, peer = await _accept(server)
        scans = peers.scans
        assert await peers.refuses(peer, local) is False
        assert peers.scans == scans
        conn.close()
    finally:
        end()
        child.kill()  # it cannot see our files
        child.wait(5)
        server.close()


async def _get(port: int, path: str = "/healthz") -> int:
    """A plain HTTP/1.1 request on a new connection, without the default executor (no DNS lookup)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        return int((await reader.readline()).split()[1])
    finally:
        writer.close()


async def test_lookups_share_scans_on_a_thread_of_their_own(gateway: GatewayClient) -> None:
    """Many connections at once cost a few shared scans, and a busy default executor (Slack, DNS, files)
    never delays them: they do not wait for it, nor fill it."""
    peers = gateway.app.sandbox_peers
    assert peers is not None
    port = gateway.app.bound_port
    end = peers.begin(None)
    loop = asyncio.get_running_loop()
    gate = threading.Event()
    busy = [loop.run_in_executor(None, gate.wait, 10) for _ in range(64)]  # every default worker blocked
    try:
        started = time.monotonic()
        async with asyncio.timeout(5):
            statuses = await asyncio.gather(*(_get(port) for _ in range(100)))
        elapsed = time.monotonic() - started
    finally:
        gate.set()
        await asyncio.gather(*busy)
        end()
    assert statuses == [200] * 100  # this process is the bot: its own clients are trusted
    assert peers.lookups == 100
    assert peers.scans <= 10, peers.scans
    assert elapsed < 2, elapsed


async def test_a_recent_scan_answers_and_a_newer_socket_gets_a_new_scan(tmp_path: Path) -> None:
    from bot.sandbox_peers import SandboxPeers

    peers = SandboxPeers(fresh_s=60)
    server = _listener()
    local = server.getsockname()
    release = tmp_path / "release"
    end = peers.begin(None)
    try:
        first = socket.create_connection(local)
        _, first_peer = server.accept()
        assert await peers.refuses(first_peer, local) is False and peers.scans == 1
        assert await peers.refuses(first_peer, local) is False and peers.scans == 1  # found by that scan
        # A socket the last scan did not see (it did not exist yet): a new scan, not a refusal.
        second = socket.create_connection(local)
        _, second_peer = server.accept()
        assert await peers.refuses(second_peer, local) is False and peers.scans == 2
        # Held by a command's process: every lookup of it scans again (a connection made after the scan),
        # and the answer stays no.
        child = _holder(local, release, detach=False)
        _, child_peer = await _accept(server)
        assert await peers.refuses(child_peer, local) is True and peers.scans == 3
        first.close()
        second.close()
    finally:
        end()
        release.touch()
        server.close()
    child.wait(5)


async def test_a_command_reaching_this_machines_other_address_is_traced_too(tmp_path: Path) -> None:
    """Not only loopback: a proxy trusted by address (BOT_TRUSTED_PROXIES) may be this machine's LAN
    address, and a command can connect from it as well."""
    from bot.sandbox_peers import SandboxPeers

    outside = _outside_address()
    if outside is None:
        pytest.skip("this machine has no non-loopback address")
    peers = SandboxPeers()
    server = socket.socket()
    server.bind(("0.0.0.0", 0))
    server.listen()
    address = (outside, server.getsockname()[1])
    end = peers.begin(None)
    try:
        child = _holder(address, tmp_path / "release", detach=False)
        conn, child_peer = await _accept(server)
        assert child_peer[0] == outside
        assert await peers.refuses(child_peer, conn.getsockname()) is True
        mine = socket.create_connection(address)
        conn2, my_peer = server.accept()
        assert await peers.refuses(my_peer, conn2.getsockname()) is False
        for s in (conn, conn2, mine):
            s.close()
    finally:
        end()
        (tmp_path / "release").touch()
        server.close()
    child.wait(5)


@pytest.mark.parametrize("family", ["ipv4", "ipv4-on-dual-stack", "ipv6"])
def test_the_kernel_query_and_the_proc_table_agree(family: str) -> None:
    """sock_diag is asked first; /proc/net/tcp* is the fallback. Both find the same client socket."""
    from bot.sandbox_peers import _address, _diag, _table

    server = socket.socket(socket.AF_INET if family == "ipv4" else socket.AF_INET6)
    try:
        server.bind(("127.0.0.1" if family == "ipv4" else "::", 0))
    except OSError:
        pytest.skip("no IPv6 here")
    server.listen()
    target = {"ipv4": "127.0.0.1", "ipv4-on-dual-stack": "127.0.0.1", "ipv6": "::1"}[family]
    try:
        client = socket.create_connection((target, server.getsockname()[1]))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    accepted, peer = server.accept()
    local = accepted.getsockname()
    ends = (_address(peer[0]), peer[1], _address(local[0]), local[1])
    ports = {local[1]}  # the listener's: the table the scan reads holds both ends of its connections
    try:
        found = _diag(*ends)
        assert found is not None and found[1] != 0
        assert found == _table(ports).get(ends)
        back = (ends[2], ends[3], ends[0], ends[1])
        assert _diag(*back) == _table(ports).get(back) != found  # our end: another socket
        assert _diag(ends[0], 1, ends[2], ends[3]) is None is _table(ports).get((ends[0], 1, ends[2], ends[3]))
        client.close()
        gone = _diag(*ends)
        assert gone == _table(ports).get(ends) and gone is not None and gone[1] == 0  # closed: no inode any more
    finally:
        client.close()
        accepted.close()
        server.close()


async def test_a_socket_hidden_by_binding_to_a_device_is_not_taken_for_another_machine() -> None:
    """A client bound to a device (no privilege needed) is missed by the socket look-up; connecting
    to this machine's own non-loopback address, it must not read as "another machine" while a
    call runs."""
    from bot.sandbox_peers import SandboxPeers

    outside = _outside_address()
    if outside is None:
        pytest.skip("this machine has no non-loopback address")
    server = socket.socket()
    server.bind(("0.0.0.0", 0))
    server.listen()
    port = server.getsockname()[1]
    client = None
    for _index, device in socket.if_nameindex():
        if device == "lo":
            continue
        candidate = socket.socket()
        candidate.settimeout(1)
        try:
            candidate.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, device.encode())
            candidate.connect((outside, port))
        except OSError:
            candidate.close()
            continue
        client = candidate
        break
    if client is None:
        server.close()
        pytest.skip("no device can reach this machine's own address here")
    accepted, peer = server.accept()
    peers = SandboxPeers()
    end = peers.begin(None)
    try:
        assert await peers.refuses(peer, (outside, port)) is True
    finally:
        end()
        for s in (client, accepted, server):
            s.close()
