"""Where ``shell_run`` commands run (SPEC §16): a bubblewrap sandbox, or (``SHELL_SANDBOX=none``) the host.

In the sandbox a command sees the system read-only, its work folder read-write (as ``/work``, its home),
an empty ``/tmp``, its own ``/proc`` (own PID, IPC and UTS namespaces), and no part of BOT_HOME besides
``work``: not the bot's environment, database or keys. Killing the namespace's first process kills
everything the command started, however it detached, so nothing outlives the call.

Without a sandbox the same kill is best effort: the command's process group, then every process
that still carries the call's marker in its environment. A process that clears or rewrites its
environment (``env -i``) and leaves the group escapes it.

With the network shared a command can reach the bot's own server at 127.0.0.1; while its call runs,
bot.sandbox_peers refuses its processes there.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import logging
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bot.sandbox_peers import SandboxPeers

log = logging.getLogger(__name__)

WORK = "/work"  # where the work folder appears inside the sandbox
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
FIX = ("install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap) where unprivileged user namespaces "
       "are allowed, or set SHELL_SANDBOX=none to run commands unsandboxed (accepting that an approved "
       "command can read everything the bot's user can)")
# What a command may read of /etc: enough for users, DNS, TLS, locales and common tools; never the
# whole of it (it may hold the bot's environment file, host keys, shadow passwords).
_ETC = ("passwd", "group", "hosts", "host.conf", "resolv.conf", "nsswitch.conf", "gai.conf", "services",
        "protocols", "networks", "localtime", "timezone", "ssl/certs", "ssl/openssl.cnf", "ca-certificates",
        "ca-certificates.conf", "pki/tls/certs", "pki/ca-trust", "crypto-policies", "alternatives", "ld.so.cache",
        "ld.so.conf", "ld.so.conf.d", "os-release", "debian_version", "lsb-release", "mime.types", "magic",
        "magic.mime", "locale.alias", "locale.conf", "profile", "bash.bashrc", "inputrc", "shells", "gitconfig",
        "wgetrc", "terminfo", "fonts", "xdg", "perl", "python3*", "java*", "mailcap", "manpath.config")
_SYSTEM_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
_MARKER = "BOT_SHELL_RUN"  # unsandboxed only: finds a call's stragglers by their environment
_KILL_WAIT_S = 0.5


@dataclass
class Started:
    """A running command: its process, and its output (stdout and stderr) until ``close``."""

    proc: asyncio.subprocess.Process
    output: asyncio.StreamReader
    pipe: asyncio.ReadTransport
    env: dict[str, str]
    ended: Callable[[], None] = lambda: None  # tells SandboxPeers, once every process of the call is dead

    def close(self) -> None:
        """Stop reading: whoever still holds the pipe's other end gets EPIPE, nobody waits on it."""
        self.pipe.close()


class Sandbox(ABC):
    """Starts a command with its work folder and environment; kills it and everything it started."""

    name: str
    network = True  # commands share the host's network, so they can reach the bot's own server
    peers: SandboxPeers | None = None  # told which calls run: their processes are refused that server

    @abstractmethod
    def environment(self, workdir: Path) -> dict[str, str]:
        """The whole environment a command gets, before the credentials the call names."""

    @abstractmethod
    def inside(self, workdir: Path) -> str:
        """The work folder's path as the command sees it."""

    @abstractmethod
    def argv(self, command: Sequence[str], workdir: Path) -> list[str]:
        """What to execute on the host for ``command``."""

    @abstractmethod
    def _kill_all(self, proc: asyncio.subprocess.Process, env: Mapping[str, str]) -> None: ...

    async def spawn(self, command: Sequence[str], workdir: Path, env: Mapping[str, str]) -> Started:
        # Output goes to a pipe of our own, not asyncio's: its wait() would also wait for every process
        # holding the pipe (a background child), and we want the command's own exit.
        read_fd, write_fd = os.pipe()
        ended = self._begin(env)  # before the fork: the command may connect to us at once
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.argv(command, workdir), cwd=workdir, env=dict(env), stdin=asyncio.subprocess.DEVNULL,
                stdout=write_fd, stderr=write_fd, start_new_session=True,
            )
        except BaseException:
            os.close(read_fd)
            ended()
            raise
        finally:
            os.close(write_fd)
        output = asyncio.StreamReader(limit=2**20)
        try:
            pipe, _ = await asyncio.get_running_loop().connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(output), os.fdopen(read_fd, "rb", buffering=0))
        except BaseException:  # cancelled right after the start: the command must not run on unseen
            self._kill_all(proc, env)
            ended()
            raise
        return Started(proc, output, pipe, dict(env), ended)

    def _begin(self, env: Mapping[str, str]) -> Callable[[], None]:
        if self.peers is None or not self.network:
            return lambda: None
        return self.peers.begin(f"{_MARKER}={env[_MARKER]}" if _MARKER in env else None)

    async def kill(self, started: Started) -> None:
        """Kill the command and everything it started (also after it exited: its background children)."""
        self._kill_all(started.proc, started.env)  # synchronous first: a second cancellation cannot skip it
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(started.proc.wait(), _KILL_WAIT_S)


class Bubblewrap(Sandbox):
    name = "bwrap"

    def __init__(self, bwrap: str, *, network: bool, user_flags: Sequence[str] = ()) -> None:
        self.bwrap = bwrap
        self.network = network
        self.user_flags = tuple(user_flags)  # the user-namespace flags the probe found working

    def inside(self, workdir: Path) -> str:
        return WORK

    def environment(self, workdir: Path) -> dict[str, str]:
        return {"PATH": SANDBOX_PATH, "HOME": WORK, "LANG": os.environ.get("LANG") or "C.UTF-8"}

    def argv(self, command: Sequence[str], workdir: Path) -> list[str]:
        args = [self.bwrap, *self.user_flags, "--unshare-pid", "--unshare-ipc", "--unshare-uts",
                "--unshare-cgroup-try", "--hostname", "sandbox", "--die-with-parent", "--new-session",
                "--cap-drop", "ALL"]
        if not self.network:
            args.append("--unshare-net")
        args += ["--ro-bind", "/usr", "/usr"]
        for name in _SYSTEM_DIRS:  # merged /usr: /bin → usr/bin is a symlink to recreate, not a mount
            path = Path("/", name)
            if path.is_symlink():
                args += ["--symlink", os.readlink(path), str(path)]
            elif path.is_dir():
                args += ["--ro-bind", str(path), str(path)]
        for pattern in _ETC:
            for entry in sorted(glob.glob(f"/etc/{pattern}")):
                args += ["--ro-bind-try", entry, entry]
        bound = ["/usr", "/etc", *(f"/{n}" for n in _SYSTEM_DIRS)]
        home = workdir.resolve().parent
        if any(home.is_relative_to(b) for b in bound):  # BOT_HOME inside a system directory: hide it
            args += ["--tmpfs", str(home)]
        args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/var/tmp",
                 "--bind", str(workdir.resolve()), WORK, "--chdir", WORK, "--remount-ro", "/", *command]
        return args

    def _kill_all(self, proc: asyncio.subprocess.Process, env: Mapping[str, str]) -> None:
        # The namespace's first process: when it dies the kernel kills every process in the namespace.
        # bwrap's --die-with-parent does the same once bwrap itself is killed; this does not rely on it.
        for child in _children(proc.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(child, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


class Unsandboxed(Sandbox):
    """SHELL_SANDBOX=none: the command runs on the host as the bot's user, in the work folder."""

    name = "none"

    def inside(self, workdir: Path) -> str:
        return str(workdir)

    def environment(self, workdir: Path) -> dict[str, str]:
        env = {"PATH": os.environ.get("PATH") or SANDBOX_PATH, "HOME": str(workdir),
               "LANG": os.environ.get("LANG") or "C.UTF-8"}
        env[_MARKER] = secrets.token_hex(12)
        return env

    def argv(self, command: Sequence[str], workdir: Path) -> list[str]:
        return list(command)

    def _kill_all(self, proc: asyncio.subprocess.Process, env: Mapping[str, str]) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        self._kill_marked(env)

    async def kill(self, started: Started) -> None:
        await super().kill(started)
        # A straggler may be forking, or in the middle of an exec (its environment unreadable for a
        # moment), while we look: look again until two looks in a row find nobody.
        quiet = 0
        for _ in range(10):
            await asyncio.sleep(0.02)
            quiet = 0 if self._kill_marked(started.env) else quiet + 1
            if quiet == 2:
                return

    @staticmethod
    def _kill_marked(env: Mapping[str, str]) -> int:
        marker = f"{_MARKER}={env[_MARKER]}".encode()
        found = [pid for pid in _pids() if marker in _environ(pid)]
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        return len(found)


@dataclass(frozen=True)
class Probe:
    """What SHELL_SANDBOX gave at start: a sandbox to run commands in, or why shell_run is off."""

    mode: str  # "bwrap" or "none", as configured
    sandbox: Sandbox | None
    problem: str = ""  # why bubblewrap cannot be used
    version: str = ""

    @property
    def summary(self) -> str:
        """One line for the start-up log and `bot doctor`."""
        if isinstance(self.sandbox, Bubblewrap):
            user = "user namespace, " if self.sandbox.user_flags else ""
            net = "network shared" if self.sandbox.network else "no network (SHELL_NETWORK=false)"
            return (f"bubblewrap {self.version} ({self.sandbox.bwrap}): shell_run runs with its own PID, IPC and "
                    f"UTS namespaces, {user}read-only system, only {WORK} writable, {net}")
        if self.sandbox is not None:
            return ("SHELL_SANDBOX=none: shell_run commands run unsandboxed on the host as the bot's user "
                    "(they can read its settings, database and keys)")
        return f"shell_run is off: {self.problem}"

    @property
    def fix(self) -> str:
        if self.sandbox is None:
            return FIX
        if self.mode == "none":
            return "install bubblewrap and remove SHELL_SANDBOX=none"
        return ""

    def log(self) -> None:
        if isinstance(self.sandbox, Bubblewrap):
            log.info("%s", self.summary)
        else:
            log.warning("%s; to fix: %s", self.summary, self.fix)


def probe(mode: str, *, network: bool = True) -> Probe:
    """Find a working sandbox once, at start, by running a trivial command in it."""
    if mode == "none":
        return Probe(mode, Unsandboxed())
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return Probe(mode, None, "bubblewrap is not installed (no bwrap on PATH)")
    uid = str(os.getuid() or 65534)  # root maps to nobody: no uid 0 inside
    gid = str(os.getgid() or 65534)
    candidates = [("--unshare-user", "--disable-userns", "--uid", uid, "--gid", gid),  # no nested namespaces
                  ("--unshare-user", "--uid", uid, "--gid", gid),  # bubblewrap before 0.8
                  ()]  # root (or a setuid bwrap) where user namespaces are refused
    errors: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bot-sandbox-probe-") as scratch:
        for flags in candidates:
            sandbox = Bubblewrap(bwrap, network=network, user_flags=flags)
            try:
                done = subprocess.run(sandbox.argv(["/bin/sh", "-c", "exit 0"], Path(scratch)), capture_output=True,
                                      text=True, timeout=10, env=sandbox.environment(Path(scratch)), check=False)
            except (OSError, subprocess.TimeoutExpired) as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
                continue
            if done.returncode == 0:
                return Probe(mode, sandbox, version=_version(bwrap))
            errors.append((done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1])
    return Probe(mode, None, f"bubblewrap cannot create its namespaces here ({errors[0]})")


def _version(bwrap: str) -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        return subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=5,
                              check=False).stdout.strip().removeprefix("bubblewrap ")
    return ""


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def _pids() -> list[int]:
    me = os.getpid()
    return [int(e) for e in os.listdir("/proc") if e.isdigit() and int(e) != me]


def _environ(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""
