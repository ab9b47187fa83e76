"""One `bot run` per SQLite database: an exclusive lock, taken before anything reads the database.

A second process on the same SQLite file would recover the first one's live work as if its process
had died (mark its running turn interrupted, finish it a second time), so it must stop before it
reads anything. The lock is ``flock`` on the database file itself: flock belongs to the file (its
inode), so another BOT_HOME, a symlink or a hard link reaching the same file meets it too, and it is
separate from the POSIX locks SQLite takes on that file (Linux). ``BOT_HOME/bot.lock`` (and
``<database>.lock`` beside a database kept outside BOT_HOME) are locked as well and say which process
holds them. All are held for the process's life: the kernel drops them when the process ends however
it ends, so a file left by a killed process blocks nothing. The lock files are never deleted
(deleting one would let a third process lock a new file while the second still holds the old one).
The database's descriptor is closed only after SQLite's connections are: closing a descriptor of a
file drops every POSIX lock the process holds on it, SQLite's included.
Operator commands (`bot approvals`, `bot schedules`, `bot doctor`) take no lock: they work beside a
running bot. PostgreSQL takes none either: replicas share it, and leases govern them.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from pathlib import Path

from sqlalchemy.engine import make_url

from bot.errors import Failed
from bot.home import sqlite_path
from bot.settings import Settings

LOCK_FILE = "bot.lock"


class RunLock:
    """The open, locked files; closing them (or the process ending) releases the lock."""

    def __init__(self, fds: list[int]) -> None:
        self._fds = fds

    def release(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []


def lock_paths(settings: Settings) -> list[Path]:
    """Where `bot run` locks: nothing on PostgreSQL."""
    if make_url(settings.resolved_database_url).get_backend_name() != "sqlite":
        return []
    home = settings.bot_home.resolve()
    paths = [home / LOCK_FILE]
    database = sqlite_path(settings)
    if database is not None and home not in database.parents:
        paths.append(database.with_name(database.name + ".lock"))
    return paths


def take_run_lock(settings: Settings) -> RunLock:
    """Lock every path of ``lock_paths`` and the SQLite file, or raise Failed naming the holder."""
    fds: list[int] = []
    try:
        for path in lock_paths(settings):
            fds.append(_lock(path))
        database = sqlite_path(settings)
        if database is not None:
            fds.append(_lock_database(database))
    except BaseException:
        RunLock(fds).release()
        raise
    return RunLock(fds)


def _lock(path: Path) -> int:
    # No O_TRUNC before the lock is ours (the holder's pid is in it).
    fd = _open(path, os.O_RDWR, "lock file", "(the bot creates its own lock file there)")
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1 or info.st_uid != os.getuid():
            raise Failed(f"{path} is not a plain file of this user's (a link, a device or another "
                                "user's file); remove it and start again")
        if not _flock(fd):
            raise Failed(_held(path, _read_holder(path)))
        if stat.S_IMODE(info.st_mode) != 0o600:
            os.fchmod(fd, 0o600)
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}, started {time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n".encode())
    except BaseException:
        os.close(fd)
        raise
    return fd


def _lock_database(path: Path) -> int:
    """flock on the SQLite file itself (read-only: nothing is written through it)."""
    fd = _open(path, os.O_RDONLY, "database", "(or point DATABASE_URL at the file itself)")
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            raise Failed(f"the database {path} is not a plain file of this user's (a device, a FIFO or "
                         "another user's file); point DATABASE_URL at this user's own SQLite file")
        if not _flock(fd):
            raise Failed(_held(path, _flock_holder(info)))
        if info.st_nlink != 1:  # checked once the lock is ours: a live bot behind the link is named above
            raise Failed(f"the database {path} has {info.st_nlink} names (hard links): SQLite keeps its -wal "
                         "file beside the name it opens, so two names corrupt it. Remove the other links "
                         f"(`find / -xdev -samefile {path}` lists them) and start again")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open(path: Path, mode: int, what: str, hint: str) -> int:
    # No following a symlink, and O_NONBLOCK so that a FIFO planted at the path cannot hang the start.
    try:
        return os.open(path, mode | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Failed(f"{path} is a symbolic link; the bot does not write through one. Remove it "
                         f"{hint}") from None
        raise Failed(f"cannot open the {what} {path}: {exc.strerror or exc}") from None


def _flock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _held(path: Path, holder: str) -> str:
    pid = holder.split(",")[0].removeprefix("pid ").strip() if holder.startswith("pid ") else ""
    stop = f"stop it first (kill -TERM {pid})" if pid.isdigit() else "stop it first"
    return (f"another `bot run` is already running on this SQLite database ({holder or 'pid unknown'}; it holds "
            f"{path}); {stop}, or give this one its own BOT_HOME and DATABASE_URL. `bot approvals`, "
            "`bot schedules` and `bot doctor` work beside it")


def _flock_holder(info: os.stat_result) -> str:
    """``pid N`` of whoever holds a flock on that file, from /proc/locks (Linux), or ""."""
    # A line: "3: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF" (device major:minor in hex, inode).
    file = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return ""
    for fields in (line.split() for line in lines):
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == file and fields[4].isdigit():
            return f"pid {fields[4]}"
    return ""


def _read_holder(path: Path) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return ""
    try:
        text = os.read(fd, 200).decode(errors="replace").strip()
        return text.splitlines()[0] if text else ""
    finally:
        os.close(fd)
