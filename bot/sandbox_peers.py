"""Refuse the bot's own listener to the processes ``shell_run`` started.

With SHELL_NETWORK=true a command shares the host's network: it can reach ``127.0.0.1:PORT`` and be
"this machine" there (the web chat without a token, ``/metrics``, the credential link, a trusted proxy
on this host). So while a call runs, each new connection from an address of this machine is traced to
its client socket (the kernel's sock_diag, or ``/proc/net/tcp*``, gives the socket's inode and owner).

A socket of another user is never a command's: commands run as the bot's user. A socket of the bot's
user is served only when a TRUSTED process holds it: one in the bot's own PID namespace that does not
descend from the bot (the bot itself counts) and, with SHELL_SANDBOX=none, does not carry a call's
marker in its environment. Anything else is refused, including a socket nobody can be found holding
(fail closed). A sandboxed process is in another PID namespace from its first instruction to its
death, so however its ancestry changes while it is killed (its parents die, it is reparented to the
host's init) it is never trusted. Without a sandbox, a command's process that detached from the bot
and cleared its environment is trusted (best effort, like the kill).

A command's processes are never read (not their file descriptors: a command may hold a million of
them). The trusted processes' sockets are listed by one scan, on a thread of its own: every lookup
waiting meanwhile shares the next scan, and a scan that just ran answers for the sockets it found.
So a flood of connections costs one scan every few tens of milliseconds, not one per connection.

While no call runs (nor ran in the last few seconds: a request a command sent may still be on its way)
nothing is read. A connection's verdict is kept for its lifetime: a keep-alive browser is traced once.
Known limits: replicas sharing one host and network namespace do not see each other's calls; a command
that hands its socket to a trusted process (a local proxy, fd passing over a Unix socket) is not seen.
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
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware

from bot.egress import is_this_machine

log = logging.getLogger(__name__)

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Endpoints = tuple[Address, int, Address, int]  # source, source port, destination, destination port
Table = dict[Endpoints, tuple[int, int]]  # -> (uid, inode)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
GRACE_S = 5.0
FRESH_S = 0.25  # a scan this recent answers "trusted" for the sockets it found, without a new scan
GAP_S = 0.03  # between two scans: a flood of connections cannot keep a core busy
_PROC = "/proc"
_PF_EXITING = 0x4  # include/linux/sched.h: its memory (so its environment) may already be gone
# sock_diag (linux/sock_diag.h, linux/inet_diag.h, linux/netlink.h)
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 1
_NLMSG_ERROR = 2
_NO_COOKIE = 0xFFFFFFFF
_REFUSED = ("Refused: this connection comes from a process started by shell_run. Commands may not use "
            "the bot's own server.")


@dataclass(frozen=True)
class Snapshot:
    """One scan: the sockets trusted processes held, and (without sock_diag) the TCP table."""

    started: float  # time.monotonic() when it began: it saw every socket that existed before
    trusted: frozenset[int]  # socket inodes
    table: Table | None = None


@dataclass
class _Pending:
    since: float  # it begins at or after this time
    table: bool
    task: asyncio.Task[Snapshot]


class SandboxPeers:
    """The running ``shell_run`` calls, and whether a TCP peer may be one of their processes."""

    def __init__(self, *, grace_s: float = GRACE_S, fresh_s: float = FRESH_S, gap_s: float = GAP_S) -> None:
        self.grace_s = grace_s
        self.fresh_s = fresh_s
        self.gap_s = gap_s
        self.lookups = 0  # connections traced: none while no call runs
        self.scans = 0  # scans of the trusted processes
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # the scan reads the markers from its thread
        self._running: dict[int, bytes | None] = {}  # call -> its environment marker (unsandboxed)
        self._ended: list[tuple[float, bytes | None]] = []  # (monotonic end, marker), pruned at each end
        self._verdicts: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
        self._last: Snapshot | None = None
        self._pending: _Pending | None = None
        self._next_scan = 0.0
        self._needs_table = False  # sock_diag failed here once: scans also read the TCP table
        self._ports: set[int] = set()  # our listeners' ports: the part of that table lookups need
        self._executor: ThreadPoolExecutor | None = None  # its own thread: never the default pool's
        self._logged = 0.0

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

    def _listeners(self) -> set[int]:
        with self._lock:
            return set(self._ports)

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
        verdict = await self.refuses(peer, transport.get_extra_info("sockname"))
        with contextlib.suppress(TypeError):
            self._verdicts[transport] = verdict
        if verdict and time.monotonic() - self._logged > 1:  # a flood logs once a second, not per connection
            self._logged = time.monotonic()
            log.warning("refused %s %s from %s: a shell_run command's process, or one that could not be traced "
                        "while a command runs", request.method, _first_segment(request.path), peer)
        return verdict

    async def refuses(self, peer: Any, local: Any) -> bool:
        """Whether the TCP client ``peer`` of our socket ``local`` may be a running command's process."""
        if not self.active:
            return False
        if not (isinstance(peer, tuple) and isinstance(local, tuple) and len(peer) >= 2 and len(local) >= 2):
            return False  # not TCP (a Unix socket): no command can reach it
        self.lookups += 1
        try:
            return await self._refuses(_address(peer[0]), int(peer[1]), _address(local[0]), int(local[1]))
        except (OSError, ValueError):
            return True  # cannot decide while a call runs: refuse
        except Exception:
            if time.monotonic() - self._logged > 1:
                self._logged = time.monotonic()
                log.exception("could not trace a connection while a command runs: refused")
            return True

    async def _refuses(self, peer: Address, peer_port: int, local: Address, local_port: int) -> bool:
        with self._lock:
            self._ports.add(local_port)
        since = time.monotonic()  # after the accept: the client's socket, and its holder's fd, exist already
        client = await self._socket((peer, peer_port, local, local_port), since)
        if client is None:
            # Both ends of a connection from this machine are in our network namespace. Only our end:
            # the client is another machine. Neither: the connection is already gone. A peer at one
            # of this machine's own addresses is never "another machine" (a socket bound to a device
            # can hide from the look-up).
            if peer.is_loopback or is_this_machine(peer):
                return True
            return await self._socket((local, local_port, peer, peer_port), since) is None
        uid, inode = client
        if inode == 0:
            return True  # closed by its process (or the process exited): cannot tell whose it was
        if uid != os.geteuid():
            return False  # a command's sockets are always the bot user's
        last = self._last
        if last is not None and time.monotonic() - last.started < self.fresh_s and inode in last.trusted:
            return False
        return inode not in (await self._snapshot(since)).trusted

    async def _socket(self, ends: Endpoints, since: float) -> tuple[int, int] | None:
        """(uid, inode) of the TCP socket in our network namespace from ``src:sport`` to ``dst:dport``."""
        if not self._needs_table:
            try:
                return _diag(*ends)  # one netlink round trip, answered within the send: no thread needed
            except OSError:  # no sock_diag here (a restricted container): the table, read by the scan
                self._needs_table = True
        table = (await self._snapshot(since)).table
        if table is None:
            raise OSError(errno.EPROTO, "no TCP table in the scan")
        return table.get(ends)

    async def _snapshot(self, since: float) -> Snapshot:
        """The first scan that begins at or after ``since``: one scan serves every lookup waiting for it."""
        while True:
            table = self._needs_table
            last = self._last
            if last is not None and last.started >= since and (last.table is not None or not table):
                return last
            pending = self._pending
            if pending is None:
                pending = self._pending = self._start(table)
            elif pending.since < since or (table and not pending.table):  # it may miss our socket: the next
                with contextlib.suppress(Exception):
                    await asyncio.shield(pending.task)
                continue
            return await asyncio.shield(pending.task)

    def _start(self, table: bool) -> _Pending:
        since = max(time.monotonic(), self._next_scan)  # it will not begin earlier: lookups until then join it

        async def scan() -> Snapshot:
            try:
                if (wait := self._next_scan - time.monotonic()) > 0:
                    await asyncio.sleep(wait)
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(1, thread_name_prefix="sandbox-peers")
                found = await asyncio.get_running_loop().run_in_executor(
                    self._executor, _scan, self._markers, self._listeners if table else None)
            finally:
                self._pending = None
                self._next_scan = time.monotonic() + self.gap_s
            self.scans += 1
            self._last = found
            return found

        return _Pending(since, table, asyncio.get_running_loop().create_task(scan()))


def _scan(markers: Callable[[], list[bytes]], ports: Callable[[], set[int]] | None) -> Snapshot:
    started = time.monotonic()
    wanted = markers()  # read now: a call begun before the scan has its marker in it
    found = _table(ports()) if ports is not None else None
    return Snapshot(started, frozenset(_trusted_sockets(wanted)), found)


def _trusted_sockets(markers: list[bytes]) -> set[int]:
    """The socket inodes held by trusted processes. Each process is read through an open ``/proc/<pid>``:
    if it dies meanwhile, a new process given the same pid cannot be read in its place."""
    me = os.getpid()
    own = os.readlink(f"{_PROC}/self/ns/pid")
    parents: dict[int, tuple[int, int]] = {}  # pid -> (parent, start time), in our namespace
    ours: dict[int, int] = {}  # pid -> its open /proc/<pid>
    try:
        for pid in _pids():
            with contextlib.suppress(OSError, ValueError, IndexError):
                fd = os.open(f"{_PROC}/{pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                try:
                    try:
                        same = os.readlink("ns/pid", dir_fd=fd) == own
                    except OSError:  # another user's: never trusted, but it may link the bot to a descendant
                        same = None
                    if same is False:
                        continue  # another PID namespace (a sandbox): nothing more is read
                    parent, start, flags = _stat(fd)
                    parents[pid] = (parent, start)
                    if same and not flags & _PF_EXITING:
                        ours[pid], fd = fd, -1
                finally:
                    if fd >= 0:
                        os.close(fd)
        found: set[int] = set()
        descends: dict[int, bool] = {}
        for pid, fd in ours.items():
            if _descends(pid, me, parents, descends):
                continue  # a command's process (or the sandbox's launcher), never read
            with contextlib.suppress(OSError, ValueError, IndexError):
                if markers and any(m in _read_at(fd, "environ").split(b"\0") for m in markers):
                    continue
                if _stat(fd)[2] & _PF_EXITING:  # after the environment: an empty one may mean it was gone
                    continue
                found.update(_sockets_of(fd))
        return found
    finally:
        for fd in ours.values():
            os.close(fd)


def _descends(pid: int, ancestor: int, parents: dict[int, tuple[int, int]], known: dict[int, bool]) -> bool:
    """Whether ``pid`` is a (strict) descendant of ``ancestor``. A parent younger than its child (a
    recycled pid) makes this say yes: that is the safe side."""
    chain: list[int] = []
    current = pid
    verdict = False
    while len(chain) < 4096:
        if current in known:
            verdict = known[current]
            break
        chain.append(current)
        parent, started = parents[current]
        if parent == ancestor:
            verdict = True
            break
        if parent <= 0:
            break  # the namespace's first process
        if parent not in parents:
            break  # hidden from us (hidepid), or exited during the scan (then its child is reparented)
        if parents[parent][1] > started:
            verdict = True
            break
        current = parent
    for seen in chain:
        known[seen] = verdict
    return verdict


def _sockets_of(proc: int) -> Iterable[int]:
    fds = os.open("fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=proc)
    try:
        for name in os.listdir(fds):
            with contextlib.suppress(OSError):
                target = os.readlink(name, dir_fd=fds)
                if target.startswith("socket:["):
                    yield int(target[8:-1])
    finally:
        os.close(fds)


def _stat(proc: int) -> tuple[int, int, int]:
    """(parent pid, start time, flags) from stat; the name in parentheses may hold spaces."""
    fields = _read_at(proc, "stat").rsplit(b")", 1)[1].split()
    return int(fields[1]), int(fields[19]), int(fields[6])


def _read_at(directory: int, name: str) -> bytes:
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=directory)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _address(text: Any) -> Address:
    address = ipaddress.ip_address(str(text).split("%", 1)[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped  # a dual-stack listener sees 127.0.0.1 as ::ffff:127.0.0.1
    return address


def _diag(src: Address, sport: int, dst: Address, dport: int) -> tuple[int, int] | None:
    """(uid, inode) of the TCP socket in our network namespace from ``src:sport`` to ``dst:dport``, asked
    of the kernel for exactly this socket (sock_diag). An IPv4 lookup also finds an IPv6 socket using a
    v4-mapped address. The kernel answers while it handles the send, so the socket never blocks."""
    family = socket.AF_INET if src.version == 4 else socket.AF_INET6
    sockid = (struct.pack("!HH", sport, dport) + src.packed.ljust(16, b"\0") + dst.packed.ljust(16, b"\0")
              + struct.pack("=III", 0, _NO_COOKIE, _NO_COOKIE))
    request = struct.pack("=BBBxI", family, socket.IPPROTO_TCP, 0, 0xFFFFFFFF) + sockid
    header = struct.pack("=IHHII", 16 + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as nl:
        nl.setblocking(False)
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


def _table(ports: set[int]) -> Table:
    """The TCP sockets in our network namespace with an end on one of ``ports``, from ``/proc/net/tcp*``:
    (source, destination) -> (uid, inode). Compared as text first: a busy host has many sockets."""
    suffixes = tuple(f":{port:04X}" for port in ports)
    found: Table = {}
    for name in ("tcp", "tcp6"):
        try:
            lines = _read(f"{_PROC}/net/{name}").decode().splitlines()[1:]
        except FileNotFoundError:  # no IPv6 in this kernel
            continue
        for line in lines:
            fields = line.split()
            if not (fields[1].endswith(suffixes) or fields[2].endswith(suffixes)):
                continue
            (src, sport), (dst, dport) = _endpoint(fields[1]), _endpoint(fields[2])
            if found.get((src, sport, dst, dport), (0, 0))[1] == 0:  # a live socket, not its TIME_WAIT ghost
                found[src, sport, dst, dport] = int(fields[7]), int(fields[9])
    return found


def _endpoint(text: str) -> tuple[Address, int]:
    # The kernel prints each 32-bit word of the address in host byte order.
    hex_address, hex_port = text.split(":")
    words = [int(hex_address[i:i + 8], 16) for i in range(0, len(hex_address), 8)]
    packed = struct.pack(f"={len(words)}I", *words)
    return _address(ipaddress.ip_address(packed)), int(hex_port, 16)


def _pids() -> list[int]:
    return [int(e) for e in os.listdir(_PROC) if e.isdigit()]


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _first_segment(path: str) -> str:
    """What a log line shows of a path: its first segment only, since later ones may be a one-time link's token
    (``/credentials/<token>``, ``/passkeys/step-up/<token>``)."""
    first, _, rest = path.lstrip("/").partition("/")
    return f"/{first}/…" if rest else f"/{first}"
