"""Where ``shell_run`` commands run (SPEC §16): a bubblewrap sandbox, or (``SHELL_SANDBOX=none``) the host.

In the sandbox a command sees the system read-only, its agent's work folder read-write (as ``/work``), the
skills folder read-only (as ``/skills``: a skill's scripts can be run, never changed), an empty ``/tmp``, its own
``/proc`` (own PID, IPC and UTS namespaces), and no part of BOT_HOME besides those folders: not the bot's
environment, database or keys. Its HOME is never the work folder, which unasked commands
write to: a call a person approved gets its agent's own kept HOME (``kept_home``: ``$BOT_HOME/homes/<agent>``,
mounted only for such calls), a call that runs unasked (an allow rule, a grant) a new, empty one
(``fresh_home``). So no dotfile one kind of call left (``.gitconfig``, ``.kube/config``, ``.npmrc``)
configures the other. Nothing else of the bot's environment reaches a command (no ``KUBECONFIG``,
``XDG_CONFIG_HOME``…), in either mode.

Killing the namespace's first process kills everything the command started, however it detached, so nothing
outlives the call; and once that first process has exited, the kernel has already reaped every other process
of the namespace.

Without a sandbox the same kill is best effort: the command's process group, then every process
that still carries the call's marker in its environment. A process that clears or rewrites its
environment (``env -i``) and leaves the group escapes it.

With the network shared a command can reach the bot's own server at 127.0.0.1; while its call runs
(and until all its processes are gone, and a few seconds more), bot.sandbox_peers refuses its processes
there.

Commands run with umask 077: what they create in the work folder is the bot user's alone (0600, 0700).
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import logging
import os
import secrets
import select
import shutil
import signal
import subprocess
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bot.sandbox_peers import SandboxPeers

log = logging.getLogger(__name__)

WORK = "/work"  # where the work folder appears inside the sandbox
SKILLS = "/skills"  # where SKILLS_DIR appears inside the sandbox, read-only (a skill's scripts can be run)
CALL_HOME = "/home/sandbox"  # inside the sandbox: a call's HOME (its agent's kept one, or a tmpfs of its own)
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
_GONE_WAIT_S = 1.0  # after the kill: how long the end of a call may wait for a process stuck in the kernel
_INFO_WAIT_S = 2.0  # for bwrap to say which process is its namespace's first (it does at once)
_UMASK = 0o077
_lingering: set[asyncio.Task[None]] = set()  # calls whose end waits for their last process


@dataclass
class Started:
    """A running command: its process, and its output (stdout and stderr) until ``close``."""

    proc: asyncio.subprocess.Process
    output: asyncio.StreamReader
    pipe: asyncio.ReadTransport
    env: dict[str, str]
    ended: Callable[[], None] = lambda: None  # tells SandboxPeers, once every process of the call is dead
    init: int | None = None  # a pidfd for the sandbox's first process (bwrap), while it may be alive

    def close(self) -> None:
        """Stop reading: whoever still holds the pipe's other end gets EPIPE, nobody waits on it."""
        self.pipe.close()

    def release(self) -> None:
        """After the kill: tell SandboxPeers the call is over once its processes are gone."""
        init, self.init = self.init, None
        _release(init, self.ended)


@dataclass(frozen=True)
class Home:
    """The HOME one call gets: ``inside``, its path as the command sees it; ``kept``, the host folder mounted there
    (the agent's own, kept between the calls people approved), or None for a new, empty one."""

    inside: str
    kept: Path | None = None


class Sandbox(ABC):
    """Starts a command with its work folder and environment; kills it and everything it started."""

    name: str
    network = True  # commands share the host's network, so they can reach the bot's own server
    peers: SandboxPeers | None = None  # told which calls run: their processes are refused that server
    reports_init = False  # bwrap tells which process is its namespace's first (--info-fd)

    def __init__(self, *, peers: SandboxPeers | None = None) -> None:
        self.peers = peers

    @abstractmethod
    def environment(self, workdir: Path, *, home: Home | None = None) -> dict[str, str]:
        """The whole environment a command gets, before the credentials the call names. ``home``: the call's own
        (``kept_home`` or ``fresh_home``); None (an MCP server): its work folder."""

    @abstractmethod
    def inside(self, workdir: Path) -> str:
        """The work folder's path as the command sees it."""

    @abstractmethod
    def argv(self, command: Sequence[str], workdir: Path, *, info_fd: int | None = None,
             home: Home | None = None) -> list[str]:
        """What to execute on the host for ``command`` (``info_fd``: where bwrap reports its first process;
        ``home``: the call's HOME, if it has one of its own)."""

    @abstractmethod
    def fresh_home(self) -> contextlib.AbstractAsyncContextManager[Home]:
        """A new, empty HOME for one call, gone once the call has ended."""

    @abstractmethod
    def kept_home(self, folder: Path) -> Home:
        """``folder`` (the agent's kept HOME on the host) as a call's HOME."""

    @abstractmethod
    def _kill_all(self, proc: asyncio.subprocess.Process, env: Mapping[str, str], init: int | None) -> None: ...

    async def spawn(self, command: Sequence[str], workdir: Path, env: Mapping[str, str], *,
                    home: Home | None = None) -> Started:
        # Output goes to a pipe of our own, not asyncio's: its wait() would also wait for every process
        # holding the pipe (a background child), and we want the command's own exit.
        read_fd, write_fd = os.pipe()
        info_read, info_write = os.pipe() if self.reports_init else (-1, -1)
        ended = self._begin(env)  # before the fork: the command may connect to us at once
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.argv(command, workdir, info_fd=info_write if info_write >= 0 else None, home=home), cwd=workdir,
                env=dict(env), stdin=asyncio.subprocess.DEVNULL, stdout=write_fd, stderr=write_fd,
                start_new_session=True, umask=_UMASK, pass_fds=(info_write,) if info_write >= 0 else (),
            )
        except BaseException:
            os.close(read_fd)
            if info_read >= 0:
                os.close(info_read)
            ended()
            raise
        finally:
            os.close(write_fd)
            if info_write >= 0:
                os.close(info_write)
        output = asyncio.StreamReader(limit=2**20)
        init: int | None = None
        try:
            if info_read >= 0:
                init = await _first_process(info_read)
            reading = os.fdopen(read_fd, "rb", buffering=0)
            read_fd = -1  # the file owns it now
            pipe, _ = await asyncio.get_running_loop().connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(output), reading)
        except BaseException:  # cancelled right after the start: the command must not run on unseen
            self._kill_all(proc, env, init)
            if read_fd >= 0:
                os.close(read_fd)
            _release(init, ended)
            raise
        return Started(proc, output, pipe, dict(env), ended, init)

    def traced(self, env: Mapping[str, str]) -> Callable[[], None]:
        """A long-lived process started with ``env`` (an MCP server) is traced like a running command until
        the returned function is called."""
        return self._begin(env)

    def _begin(self, env: Mapping[str, str]) -> Callable[[], None]:
        if self.peers is None or not self.network:
            return lambda: None
        return self.peers.begin(f"{_MARKER}={env[_MARKER]}" if _MARKER in env else None)

    async def kill(self, started: Started) -> None:
        """Kill the command and everything it started (also after it exited: its background children)."""
        # Synchronous first: a second cancellation cannot skip it.
        self._kill_all(started.proc, started.env, started.init)
        deadline = time.monotonic() + _KILL_WAIT_S
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(started.proc.wait(), _KILL_WAIT_S)
        if started.init is not None:
            await _exit_of(started.init, deadline - time.monotonic())


class Bubblewrap(Sandbox):
    name = "bwrap"
    reports_init = True

    def __init__(self, bwrap: str, *, network: bool, user_flags: Sequence[str] = (), hide: Sequence[Path] = (),
                 peers: SandboxPeers | None = None, skills: Path | None = None) -> None:
        super().__init__(peers=peers)
        self.skills = skills  # SKILLS_DIR: mounted read-only at /skills (when it exists and hides nothing private)
        self.bwrap = bwrap
        self.network = network
        self.user_flags = tuple(user_flags)  # the user-namespace flags the probe found working
        # The bot's own files (BOT_HOME, the database, .env) by the paths settings name them: hidden wherever they
        # sit under a system folder the sandbox shows, whatever links lead from or to them.
        self.hide = tuple(hide)

    def inside(self, workdir: Path) -> str:
        return WORK

    def environment(self, workdir: Path, *, home: Home | None = None) -> dict[str, str]:
        return {"PATH": SANDBOX_PATH, "HOME": home.inside if home else WORK,
                "LANG": os.environ.get("LANG") or "C.UTF-8"}

    @contextlib.asynccontextmanager
    async def fresh_home(self) -> AsyncIterator[Home]:
        yield Home(CALL_HOME)  # a tmpfs in the call's own mount namespace (argv): nothing on the host to remove

    def kept_home(self, folder: Path) -> Home:
        return Home(CALL_HOME, folder)

    def argv(self, command: Sequence[str], workdir: Path, *, info_fd: int | None = None,
             home: Home | None = None) -> list[str]:
        args = [self.bwrap, *self.user_flags, "--unshare-pid", "--unshare-ipc", "--unshare-uts",
                "--unshare-cgroup-try", "--hostname", "sandbox", "--die-with-parent", "--new-session",
                "--cap-drop", "ALL"]
        if info_fd is not None:  # closed before the command starts: it cannot write there
            args += ["--info-fd", str(info_fd)]
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
        bound = [Path(p) for p in ("/usr", "/etc", *(f"/{n}" for n in _SYSTEM_DIRS))]
        # The bot's files inside a system directory: hidden whole, by every path that names them (BOT_HOME as set
        # and as resolved; every folder a command runs in is two below it: $BOT_HOME/work/<agent>,
        # $BOT_HOME/mcp/<server>, whose own links may lead anywhere).
        for path in _hidden(bound, (*self.hide, workdir.absolute().parent.parent, workdir.resolve().parent.parent)):
            args += ["--tmpfs", str(path)] if path.is_dir() else ["--ro-bind", "/dev/null", str(path)]
        args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/var/tmp"]
        if home is not None and home.kept is not None:
            args += ["--bind", str(home.kept.resolve()), home.inside]
        elif home is not None:
            args += ["--tmpfs", home.inside]
        if (skills := self._skills_mount()) is not None:
            args += ["--ro-bind-try", skills, SKILLS]
        args += ["--bind", str(workdir.resolve()), WORK, "--chdir", WORK, "--remount-ro", "/", *command]
        return args

    def _skills_mount(self) -> str | None:
        """SKILLS_DIR as resolved now, unless it holds a file the sandbox hides (BOT_HOME, the database, .env): the
        wiring refuses such a SKILLS_DIR at start (bot.home.skills_dir_problem); this holds if it is re-pointed."""
        if self.skills is None:
            return None
        real = self.skills.resolve()
        if any(p.is_relative_to(real) for h in self.hide for p in (h, h.resolve())):
            log.warning("SKILLS_DIR %s holds files shell_run must not see: it is not mounted at %s", real, SKILLS)
            return None
        return str(real)

    def _kill_all(self, proc: asyncio.subprocess.Process, env: Mapping[str, str], init: int | None) -> None:
        # The namespace's first process: when it dies the kernel kills every process in the namespace.
        # bwrap's --die-with-parent does the same once bwrap itself is killed; this does not rely on it.
        if init is not None:  # found wherever it is (bwrap may have exited): the pidfd cannot be recycled
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(init, signal.SIGKILL)
        if proc.returncode is None:  # once bwrap is reaped, its pid may be another process's
            for child in _children(proc.pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(child, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):  # the group's id lives while it has members
            os.killpg(proc.pid, signal.SIGKILL)


class Unsandboxed(Sandbox):
    """SHELL_SANDBOX=none: the command runs on the host as the bot's user, in the work folder."""

    name = "none"

    def inside(self, workdir: Path) -> str:
        return str(workdir)

    def environment(self, workdir: Path, *, home: Home | None = None) -> dict[str, str]:
        # The bot's PATH, but never a relative entry ("." or an empty one): a command would run a program an
        # earlier command left in the work folder under a well-known name.
        path = ":".join(p for p in (os.environ.get("PATH") or "").split(":") if os.path.isabs(p))
        env = {"PATH": path or SANDBOX_PATH, "HOME": home.inside if home else str(workdir),
               "LANG": os.environ.get("LANG") or "C.UTF-8"}
        env[_MARKER] = secrets.token_hex(12)
        return env

    @contextlib.asynccontextmanager
    async def fresh_home(self) -> AsyncIterator[Home]:
        made = tempfile.TemporaryDirectory(prefix="bot-home-", ignore_cleanup_errors=True)  # 0700, a new name
        try:
            yield Home(made.name)
        finally:  # after the kill: a command may have filled it (a cache), so not on the event loop
            await asyncio.to_thread(made.cleanup)

    def kept_home(self, folder: Path) -> Home:
        return Home(str(folder), folder)

    def argv(self, command: Sequence[str], workdir: Path, *, info_fd: int | None = None,
             home: Home | None = None) -> list[str]:
        return list(command)

    def _kill_all(self, proc: asyncio.subprocess.Process, env: Mapping[str, str], init: int | None) -> None:
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


# The user flags that worked for a bubblewrap, and its version, per process: an application built again (tests
# build hundreds) need not start two processes to learn it again. A failure is not kept: it is probed again.
_WORKING: dict[tuple[str, bool, str, str], tuple[tuple[str, ...], str]] = {}


def probe(mode: str, *, network: bool = True, hide: Sequence[Path] = (), peers: SandboxPeers | None = None,
          skills: Path | None = None) -> Probe:
    """Find a working sandbox once, at start, by running a trivial command in it. ``hide``: the bot's own files
    (``bot.home.private_paths``), never shown to a command. ``peers``: told which calls run (the bot's own
    server refuses their processes). ``skills``: SKILLS_DIR, mounted read-only at /skills for every command."""
    if mode == "none":
        return Probe(mode, Unsandboxed(peers=peers))
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return Probe(mode, None, "bubblewrap is not installed (no bwrap on PATH)")
    uid = str(os.getuid() or 65534)  # root maps to nobody: no uid 0 inside
    gid = str(os.getgid() or 65534)
    found = _WORKING.get((bwrap, network, uid, gid))
    if found is not None:  # this process probed this bubblewrap already: the same flags work (or nothing did)
        flags, version = found
        return Probe(mode, Bubblewrap(bwrap, network=network, user_flags=flags, hide=hide, peers=peers,
                                      skills=skills), version=version)
    candidates = [("--unshare-user", "--disable-userns", "--uid", uid, "--gid", gid),  # no nested namespaces
                  ("--unshare-user", "--uid", uid, "--gid", gid),  # bubblewrap before 0.8
                  ()]  # root (or a setuid bwrap) where user namespaces are refused
    errors: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bot-sandbox-probe-") as scratch:
        for flags in candidates:
            sandbox = Bubblewrap(bwrap, network=network, user_flags=flags, hide=hide, peers=peers, skills=skills)
            try:
                done = subprocess.run(sandbox.argv(["/bin/sh", "-c", "exit 0"], Path(scratch)), capture_output=True,
                                      text=True, timeout=10, env=sandbox.environment(Path(scratch)), check=False)
            except (OSError, subprocess.TimeoutExpired) as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
                continue
            if done.returncode == 0:
                version = _version(bwrap)
                _WORKING[(bwrap, network, uid, gid)] = (flags, version)
                return Probe(mode, sandbox, version=version)
            errors.append((done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1])
    return Probe(mode, None, f"bubblewrap cannot create its namespaces here ({errors[0]})")


def _hidden(bound: Sequence[Path], paths: Sequence[Path]) -> list[Path]:
    """Those of ``paths`` that exist strictly below a folder the sandbox shows (a folder once, with nothing
    below it listed again)."""
    found: list[Path] = []
    for path in sorted({p for p in (*paths, *(p.resolve() for p in paths)) if p.is_absolute()}):
        if (any(path.is_relative_to(b) and path != b for b in bound) and path.exists()
                and not any(path.is_relative_to(f) for f in found)):
            found.append(path)
    return found


def _version(bwrap: str) -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        return subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=5,
                              check=False).stdout.strip().removeprefix("bubblewrap ")
    return ""


def _release(init: int | None, ended: Callable[[], None]) -> None:
    """Call ``ended`` once the sandbox's first process (so every process of it) has exited: at once, or
    (one stuck in the kernel) within ~1 s, so that SandboxPeers' grace begins after their last request."""
    if init is None or _exited(init):
        if init is not None:
            os.close(init)
        ended()
        return

    async def later() -> None:
        try:
            await _exit_of(init, _GONE_WAIT_S)
        finally:
            os.close(init)
            ended()

    task = asyncio.get_running_loop().create_task(later())
    _lingering.add(task)
    task.add_done_callback(_lingering.discard)


async def _first_process(info: int) -> int | None:
    """Read bwrap's ``--info-fd`` report (closes ``info``) and return a pidfd for the namespace's first
    process, once checked to be one (pid 1 of a namespace of its own). None when bwrap failed first, or
    where pidfds are missing (Linux < 5.3): the end of a call then does not wait for that process."""
    reader = asyncio.StreamReader()
    try:
        transport, _ = await asyncio.get_running_loop().connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(info, "rb", buffering=0))
    except BaseException:
        os.close(info)
        raise
    try:
        async with asyncio.timeout(_INFO_WAIT_S):
            report = await reader.read(65536)
            while report and b"}" not in report:
                more = await reader.read(65536)
                if not more:
                    break
                report += more
    except TimeoutError:
        return None
    finally:
        transport.close()
    with contextlib.suppress(ValueError, TypeError, KeyError):
        return _pidfd(int(json.loads(report)["child-pid"]))
    return None


def _pidfd(pid: int) -> int | None:
    try:
        pidfd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None
    with contextlib.suppress(OSError, StopIteration):
        status = Path(f"/proc/{pid}/status").read_text()
        ids = next(line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:"))
        # Still alive after the read: the status was this process's, not a later one's with its pid.
        if len(ids) >= 2 and ids[-1] == "1" and not _exited(pidfd):
            return pidfd
    os.close(pidfd)
    return None


async def _exit_of(pidfd: int, timeout: float) -> None:
    """Wait (at most ``timeout`` s) until the process has exited."""
    if _exited(pidfd) or timeout <= 0:
        return
    loop = asyncio.get_running_loop()
    exited = loop.create_future()
    loop.add_reader(pidfd, lambda: None if exited.done() else exited.set_result(None))
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(exited, timeout)
    finally:
        loop.remove_reader(pidfd)


def _exited(pidfd: int) -> bool:
    """Whether the process has exited (a pidfd turns readable then). For a namespace's first process that
    means the kernel has killed and reaped every other process of the namespace."""
    try:
        return bool(select.select([pidfd], [], [], 0)[0])
    except (OSError, ValueError):
        return True


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
