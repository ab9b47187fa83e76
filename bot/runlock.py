"""One `bot run` per SQLite database: an exclusive lock, taken before anything reads the database.

A second process on the same SQLite file would recover the first one's live work as if its process
had died (mark its running turn interrupted, finish it a second time), so it must stop before it
reads anything. The lock is ``flock`` on ``BOT_HOME/bot.lock`` (and on ``<database>.lock`` beside a
database kept outside BOT_HOME), held for the process's life: the kernel drops it when the process
ends however it ends, so a file left by a killed process blocks nothing. The file is never deleted
(deleting it would let a third process lock a new file while the second still holds the old one).
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
    """Lock every path of ``lock_paths``, or raise Failed naming the process that holds one."""
    fds: list[int] = []
    try:
        for path in lock_paths(settings):
            fds.append(_lock(path))
    except BaseException:
        RunLock(fds).release()
        raise
    return RunLock(fds)


def _lock(path: Path) -> int:
    # No O_TRUNC before the lock is ours (the holder's pid is in it); no following a symlink, and
    # O_NONBLOCK so that a FIFO planted at the path cannot hang the start.
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Failed(f"{path} is a symbolic link; the bot does not write through one. Remove it "
                                "(the bot creates its own lock file there)") from None
        raise Failed(f"cannot open the lock file {path}: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1 or info.st_uid != os.getuid():
            raise Failed(f"{path} is not a plain file of this user's (a link, a device or another "
                                "user's file); remove it and start again")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Failed(_held(path)) from None
        if stat.S_IMODE(info.st_mode) != 0o600:
            os.fchmod(fd, 0o600)
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}, started {time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n".encode())
    except BaseException:
        os.close(fd)
        raise
    return fd


def _held(path: Path) -> str:
    holder = _read_holder(path)
    pid = holder.split(",")[0].removeprefix("pid ").strip() if holder.startswith("pid ") else ""
    stop = f"stop it first (kill -TERM {pid})" if pid.isdigit() else "stop it first"
    return (f"another `bot run` is already running on this SQLite database ({holder or 'pid unknown'}; it holds "
            f"{path}); {stop}, or give this one its own BOT_HOME and DATABASE_URL. `bot approvals`, "
            "`bot schedules` and `bot doctor` work beside it")


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
