"""A ``shell_run`` command shares the host's network (SHELL_NETWORK=true), so it can reach the bot's own
listener at 127.0.0.1. It must not be "this machine" there: while a call runs, a connection whose client
socket belongs to a process the bot started is refused on every route (issue 12, points 2 and 6).

Everything goes over real sockets to the real server; the commands run in the real sandbox.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
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
    work = tmp_path / "home" / "work"
    work.mkdir(exist_ok=True)
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


# -- the lookup itself, on real sockets --------------------------------------------------------------


def _listener() -> socket.socket:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    return server


def test_only_the_bots_descendants_are_refused_and_unknown_sockets_fail_closed(tmp_path: Path) -> None:
    from bot.sandbox_peers import SandboxPeers

    peers = SandboxPeers()
    server = _listener()
    local = server.getsockname()
    mine = socket.create_connection(local)
    accepted, peer = server.accept()
    try:
        assert peers.refuses(peer, local) is False and peers.lookups == 0  # nothing runs: no lookup
        end = peers.begin(None)
        try:
            assert peers.refuses(peer, local) is False  # held by this process (the bot itself)
            assert peers.lookups == 1
            # A peer nobody holds (the port is unused): cannot tell who it was, so refused.
            assert peers.refuses(("127.0.0.1", 1), local) is True
            # A child of the bot holding the client socket is treated as a command's process.
            child = _holder(local, tmp_path, detach=False)
            conn, child_peer = server.accept()
            assert peers.refuses(child_peer, local) is True
            child.kill()
            child.wait()
            # The same kind of client, detached from the bot (like a browser): served.
            _holder(local, tmp_path, detach=True).wait(5)
            conn2, orphan_peer = server.accept()
            assert peers.refuses(orphan_peer, local) is False
            conn.close()
            conn2.close()
            # A client that already closed its socket (orphaned, inode 0): refused.
            gone = socket.create_connection(local)
            accepted_gone, gone_peer = server.accept()
            gone.close()
            assert peers.refuses(gone_peer, local) is True
            accepted_gone.close()
        finally:
            end()
        peers.grace_s = 0
        assert peers.refuses(("127.0.0.1", 1), local) is False  # nothing runs any more: never refused
    finally:
        (tmp_path / "release").touch()
        mine.close()
        accepted.close()
        server.close()


def _holder(address: tuple[str, int], tmp_path: Path, *, detach: bool) -> subprocess.Popen[bytes]:
    """A process holding a connection to ``address`` until ``release`` exists (at most 10 s)."""
    code = (f"import socket, os, time; s = socket.create_connection({address!r}); "
            f"t = time.time() + 10\nwhile time.time() < t and not os.path.exists({str(tmp_path / 'release')!r}): "
            "time.sleep(0.02)")
    if not detach:
        return subprocess.Popen([sys.executable, "-c", code])
    return subprocess.Popen(["/bin/sh", "-c", f"(setsid {sys.executable} -c \"$0\" &)", code])


def test_a_command_reaching_this_machines_other_address_is_traced_too(tmp_path: Path) -> None:
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
        child = _holder(address, tmp_path, detach=False)
        conn, child_peer = server.accept()
        assert child_peer[0] == outside
        assert peers.refuses(child_peer, conn.getsockname()) is True
        mine = socket.create_connection(address)
        conn2, my_peer = server.accept()
        assert peers.refuses(my_peer, conn2.getsockname()) is False
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
    from bot.sandbox_peers import _address, _diag, _from_table

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
    try:
        found = _diag(*ends)
        assert found is not None and found[1] != 0
        assert found == _from_table(*ends)
        back = (ends[2], ends[3], ends[0], ends[1])
        assert _diag(*back) == _from_table(*back) != found  # our end: another socket
        assert _diag(ends[0], 1, ends[2], ends[3]) is None is _from_table(ends[0], 1, ends[2], ends[3])
        client.close()
        gone = _diag(*ends)
        assert gone == _from_table(*ends) and gone is not None and gone[1] == 0  # closed: no inode any more
    finally:
        client.close()
        accepted.close()
        server.close()
