"""Refuse the bot's own listener to the processes ``shell_run`` started.

With SHELL_NETWORK=true a command shares the host's network: it can reach ``127.0.0.1:PORT`` and be
"this machine" there (the web chat without a token, ``/metrics``, the credential link, a trusted proxy
on this host). So while a call runs, each new connection from an address of this machine is traced to
the process holding its client socket (the kernel's sock_diag, or ``/proc/net/tcp*``, gives the socket's
inode; ``/proc/<pid>/fd`` its holder). A holder that descends from the bot is a command's process: the
bot starts no other processes, and however a command detaches, inside the sandbox it stays under the
sandbox's init. With SHELL_SANDBOX=none a process that detached is recognised by the call's marker in
its environment; one that also cleared its environment is not (best effort, like the kill). When the
holder cannot be found (the process is gone, its fds are unreadable), the connection is refused while a
call runs. A socket of another user is never a command's.

While no call runs (nor ran in the last few seconds: a request a command sent may still be on its way)
nothing is read. A connection's verdict is kept for its lifetime: a keep-alive browser is traced once.
Known limit: replicas sharing one host and network namespace do not see each other's calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import itertools
import logging
import os
import socket
import struct
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware

log = logging.getLogger(__name__)

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Socket = tuple[tuple[Address, int], tuple[Address, int], int, int]  # local, remote, uid, inode
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
GRACE_S = 5.0
_PROC = "/proc"
# sock_diag (linux/sock_diag.h, linux/inet_diag.h, linux/netlink.h)
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 1
_NLMSG_ERROR = 2
_NO_COOKIE = 0xFFFFFFFF
_REFUSED = ("Refused: this connection comes from a process started by shell_run. Commands may not use "
            "the bot's own server.")


class SandboxPeers:
    """The running ``shell_run`` calls, and whether a TCP peer is one of their processes."""

    def __init__(self, *, grace_s: float = GRACE_S) -> None:
        self.grace_s = grace_s
        self.lookups = 0  # times /proc was consulted: none while no call runs
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # the lookup runs in a worker thread
        self._running: dict[int, bytes | None] = {}  # call -> its environment marker (unsandboxed)
        self._ended: list[tuple[float, bytes | None]] = []  # (monotonic end, marker), pruned at each end
        self._verdicts: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()

    # -- the calls ---------------------------------------------------------------------------

    def begin(self, marker: str | None) -> Callable[[], None]:
        """A call is about to start its command (before the fork: it may connect at once). ``marker`` is
        the ``NAME=value`` its processes carry in their environment, if any. Returns what to call once
        every process of the call is dead; calling it twice is harmless."""
        with self._lock:
            call = next(self._ids)
            self._running[call] = marker.encode() if marker else None

        def end() -> None:
            with self._lock:
                if call in self._running:
                    now = time.monotonic()
                    self._ended = [(at, m) for at, m in self._ended if now - at < self.grace_s]
                    self._ended.append((now, self._running.pop(call)))

        return end

    @property
    def active(self) -> bool:
        """A call runs, or ended so recently that what its processes sent may still be unanswered."""
        with self._lock:
            now = time.monotonic()
            return bool(self._running) or any(now - at < self.grace_s for at, _ in self._ended)

    def _markers(self) -> list[bytes]:
        with self._lock:
            return [m for m in (*self._running.values(), *(m for _, m in self._ended)) if m]

    # -- the check ---------------------------------------------------------------------------

    def middleware(self) -> Middleware:
        """For the whole server: every route that trusts "this machine" (or a proxy on it) is covered."""

        @web.middleware
        async def refuse_commands(request: web.Request, handler: Handler) -> web.StreamResponse:
            if self.active and await self._from_command(request):
                if request.path.startswith("/api/"):
                    return web.json_response({"error": _REFUSED}, status=403)
                return web.Response(status=403, text=_REFUSED)
            return await handler(request)

        return refuse_commands

    async def _from_command(self, request: web.Request) -> bool:
        transport = request.transport
        if transport is None:
            return True  # the connection is gone: nothing to serve, and nobody to trace
        with contextlib.suppress(TypeError):  # a transport without weak references is traced each time
            if (known := self._verdicts.get(transport)) is not None:
                return known
        peer = transport.get_extra_info("peername")
        verdict = await asyncio.to_thread(self.refuses, peer, transport.get_extra_info("sockname"))
        with contextlib.suppress(TypeError):
            self._verdicts[transport] = verdict
        if verdict:
            log.warning("refused %s %s from %s: a shell_run command's process, or one that could not be traced "
                        "while a command runs", request.method, request.path, peer)
        return verdict

    def refuses(self, peer: Any, local: Any) -> bool:
        """Whether the TCP client ``peer`` of our socket ``local`` may be a running command's process."""
        if not self.active:
            return False
        if not (isinstance(peer, tuple) and isinstance(local, tuple) and len(peer) >= 2 and len(local) >= 2):
            return False  # not TCP (a Unix socket): no command can reach it
        with self._lock:
            self.lookups += 1
        try:
            return self._refuses(_address(peer[0]), int(peer[1]), _address(local[0]), int(local[1]))
        except (OSError, ValueError):
            return True  # cannot decide while a call runs: refuse

    def _refuses(self, peer: Address, peer_port: int, local: Address, local_port: int) -> bool:
        client = _lookup(peer, peer_port, local, local_port)
        if client is None:
            # Both ends of a connection from this machine are in our network namespace. Only our end:
            # the client is another machine. Neither: the connection is already gone.
            return peer.is_loopback or _lookup(local, local_port, peer, peer_port) is None
        uid, inode = client
        if inode == 0:
            return True  # closed by its process (or the process exited): cannot tell whose it was
        if uid != os.geteuid():
            return False  # a command's sockets are always the bot user's
        holder = _holder(inode)
        return holder is None or self._is_command(holder)

    def _is_command(self, pid: int) -> bool:
        if _descends_from(pid, os.getpid()):
            return True
        if markers := self._markers():
            with contextlib.suppress(OSError):
                environ = _read(f"{_PROC}/{pid}/environ").split(b"\0")
                return any(m in environ for m in markers)
        return False


def _address(text: Any) -> Address:
    address = ipaddress.ip_address(str(text).split("%", 1)[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped  # a dual-stack listener sees 127.0.0.1 as ::ffff:127.0.0.1
    return address


def _lookup(src: Address, sport: int, dst: Address, dport: int) -> tuple[int, int] | None:
    """(uid, inode) of the TCP socket in our network namespace from ``src:sport`` to ``dst:dport``."""
    try:
        return _diag(src, sport, dst, dport)
    except OSError:  # no sock_diag here (a restricted container): read the whole table instead
        return _from_table(src, sport, dst, dport)


def _from_table(src: Address, sport: int, dst: Address, dport: int) -> tuple[int, int] | None:
    for local, remote, uid, inode in _sockets({sport, dport}):
        if local == (src, sport) and remote == (dst, dport):
            return uid, inode
    return None


def _diag(src: Address, sport: int, dst: Address, dport: int) -> tuple[int, int] | None:
    """The same, asked of the kernel for exactly this socket (sock_diag): no table to read. An IPv4
    lookup also finds an IPv6 socket using a v4-mapped address."""
    family = socket.AF_INET if src.version == 4 else socket.AF_INET6
    sockid = (struct.pack("!HH", sport, dport) + src.packed.ljust(16, b"\0") + dst.packed.ljust(16, b"\0")
              + struct.pack("=III", 0, _NO_COOKIE, _NO_COOKIE))
    request = struct.pack("=BBBxI", family, socket.IPPROTO_TCP, 0, 0xFFFFFFFF) + sockid
    header = struct.pack("=IHHII", 16 + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(1)
        nl.sendto(header + request, (0, 0))
        reply = nl.recv(8192)
    length, kind = struct.unpack_from("=IH", reply)
    if kind == _NLMSG_ERROR:
        (error,) = struct.unpack_from("=i", reply, 16)
        if -error == errno.ENOENT:
            return None
        raise OSError(-error, os.strerror(-error))
    if kind != _SOCK_DIAG_BY_FAMILY or length < 16 + 72:
        raise OSError(errno.EPROTO, "unexpected sock_diag reply")
    uid, inode = struct.unpack_from("=II", reply, 16 + 64)
    return uid, inode


def _sockets(ports: set[int]) -> Iterator[Socket]:
    """(local, remote, uid, inode) of the TCP sockets in our network namespace between two of ``ports``
    (compared as text first: a busy host has many sockets, few of them ours)."""
    suffixes = tuple(f":{port:04X}" for port in ports)
    for name in ("tcp", "tcp6"):
        try:
            lines = _read(f"{_PROC}/net/{name}").decode().splitlines()[1:]
        except FileNotFoundError:  # no IPv6 in this kernel
            continue
        for line in lines:
            fields = line.split()
            if fields[1].endswith(suffixes) and fields[2].endswith(suffixes):
                yield _endpoint(fields[1]), _endpoint(fields[2]), int(fields[7]), int(fields[9])


def _endpoint(text: str) -> tuple[Address, int]:
    # The kernel prints each 32-bit word of the address in host byte order.
    hex_address, hex_port = text.split(":")
    words = [int(hex_address[i:i + 8], 16) for i in range(0, len(hex_address), 8)]
    packed = struct.pack(f"={len(words)}I", *words)
    return _address(ipaddress.ip_address(packed)), int(hex_port, 16)


def _holder(inode: int) -> int | None:
    """A process with the socket open, or None. The bot's descendants first: a command that opens
    connection after connection costs one small walk each, not a scan of the whole host."""
    wanted = f"socket:[{inode}]"
    first = _descendants(os.getpid())
    for pid in itertools.chain(first, (p for p in _pids() if p not in first)):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"{_PROC}/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"{_PROC}/{pid}/fd/{fd}") == wanted:
                        return pid
    return None


def _descendants(pid: int) -> dict[int, None]:
    """The processes under ``pid`` (in order, without duplicates); one that forks meanwhile may be missed."""
    found: dict[int, None] = {}
    todo = [pid]
    while todo and len(found) < 65536:
        current = todo.pop()
        with contextlib.suppress(OSError, ValueError):
            for task in os.listdir(f"{_PROC}/{current}/task"):
                with contextlib.suppress(OSError, ValueError):
                    for child in _read(f"{_PROC}/{current}/task/{task}/children").split():
                        if int(child) not in found:
                            found[int(child)] = None
                            todo.append(int(child))
    return found


def _descends_from(pid: int, ancestor: int) -> bool:
    """Whether ``pid`` is a (strict) descendant of ``ancestor``. A parent that exits mid-walk, or a
    recycled pid (a parent cannot start after its child), makes this say yes: refusing is the safe side."""
    if pid == ancestor:
        return False
    seen = 0
    try:
        parent, started = _stat(pid)
        while parent > 1 and seen < 4096:
            if parent == ancestor:
                return True
            grandparent, parent_started = _stat(parent)
            if parent_started > started:
                return True
            parent, started, seen = grandparent, parent_started, seen + 1
    except (OSError, ValueError, IndexError):
        return True
    return parent == ancestor


def _stat(pid: int) -> tuple[int, int]:
    """(parent pid, start time) from /proc/<pid>/stat; the name in parentheses may hold spaces."""
    fields = _read(f"{_PROC}/{pid}/stat").rsplit(b")", 1)[1].split()
    return int(fields[1]), int(fields[19])


def _pids() -> list[int]:
    return [int(e) for e in os.listdir(_PROC) if e.isdigit()]


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()
