"""Reading a file inside one skill's folder, and nothing outside it (SPEC §17 skills).

Whoever writes the skills folder may be careless or hostile: a name with ``..``, an absolute path, a link that
leads out (to the bot's keys, ``/etc/shadow``), a FIFO that would block the bot forever, a device, a file of
gigabytes. So a path is a few plain components; the file's real path must lie inside the skill folder's real
path, which must lie inside the skills folder's; and it is then opened one component at a time from the skills
folder with ``O_NOFOLLOW``, so a link put in place between the check and the open is refused, not followed. Only
a regular file is opened (``O_NONBLOCK``: a FIFO swapped in at the last moment never blocks), the opened file
must be the one checked, and no more than the cap is read, whatever its size says.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

MAX_PATH_CHARS = 512
MAX_DEPTH = 8
MAX_LISTED_ENTRIES = 1_000  # names looked at when a skill's files are listed (core.skill_access, at each read)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class UnreadableFile(ValueError):
    """Why a skill's file is not returned, in words for the model and the operator."""


def relative_parts(file: str) -> list[str]:
    """The plain components of a path inside a skill's folder (``scripts/restart.sh``); refused: empty, absolute,
    ``.`` or ``..``, hidden names (``.git``), backslashes and control characters, too long or too deep."""
    if not file or len(file) > MAX_PATH_CHARS:
        raise UnreadableFile(f"a file is named by a relative path of 1 to {MAX_PATH_CHARS} characters")
    if file.startswith("/"):
        raise UnreadableFile("an absolute path is refused: name a file inside the skill's folder, e.g. "
                             "scripts/run.sh")
    if "\\" in file or any(ord(ch) < 32 or ord(ch) == 127 for ch in file):
        raise UnreadableFile("the path holds a backslash or a control character")
    parts = file.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise UnreadableFile("the path may not hold '..', '.' or empty parts: name a file inside the skill's "
                             "folder")
    if any(part.startswith(".") for part in parts):
        raise UnreadableFile("hidden files and folders (names starting with '.') are not part of a skill")
    if len(parts) > MAX_DEPTH:
        raise UnreadableFile(f"the path is more than {MAX_DEPTH} folders deep")
    return parts


def inside(path: str, folder: str) -> bool:
    """Whether the real path ``path`` is ``folder`` or below it."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def read_inside(root: Path, folder: str, parts: list[str], *, max_bytes: int) -> bytes:
    """The bytes of ``root/folder/<parts>``: at most ``max_bytes``, only a regular file whose real path is inside
    the real ``root/folder``, itself inside the real ``root``. Raises UnreadableFile saying why not."""
    shown = "/".join(parts)
    real_root = os.path.realpath(root)
    base = os.path.realpath(os.path.join(real_root, folder))
    if not inside(base, real_root) or base == real_root:
        raise UnreadableFile(f"the skill's folder {folder} is a link that leads outside the skills folder")
    target = os.path.realpath(os.path.join(base, *parts))
    if not inside(target, base) or target == base:
        raise UnreadableFile(f"{shown} leads outside the skill's folder (a link): refused")
    # Walked again from the skills folder without following any link: what is opened is what was checked.
    steps = os.path.relpath(target, real_root).split(os.sep)
    try:
        root_fd = os.open(real_root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise UnreadableFile(f"the skills folder cannot be opened: {exc.strerror or exc}") from None
    with _closing(root_fd) as dir_fd:
        with _walk(dir_fd, steps[:-1], shown) as last_dir:
            return _read_regular(last_dir, steps[-1], shown, max_bytes)


@contextlib.contextmanager
def _closing(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def _walk(dir_fd: int, names: list[str], shown: str) -> Iterator[int]:
    """The folder ``names`` below ``dir_fd``, each step opened without following a link."""
    opened: list[int] = []
    current = dir_fd
    try:
        for name in names:
            try:
                current = os.open(name, _DIR_FLAGS, dir_fd=current)
            except OSError as exc:
                raise UnreadableFile(_why(exc, shown)) from None
            opened.append(current)
        yield current
    finally:
        for fd in reversed(opened):
            os.close(fd)


def _read_regular(dir_fd: int, name: str, shown: str, max_bytes: int) -> bytes:
    try:
        seen = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError as exc:
        raise UnreadableFile(_why(exc, shown)) from None
    _check_kind(seen, shown, max_bytes)
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        raise UnreadableFile(_why(exc, shown)) from None
    with _closing(fd):
        opened = os.fstat(fd)
        _check_kind(opened, shown, max_bytes)
        if (opened.st_dev, opened.st_ino) != (seen.st_dev, seen.st_ino):
            raise UnreadableFile(f"{shown} changed while it was opened: try again")
        os.set_blocking(fd, True)
        data = bytearray()
        while len(data) <= max_bytes:  # one byte past the cap says it is too large, whatever st_size said
            chunk = os.read(fd, max_bytes + 1 - len(data))
            if not chunk:
                break
            data += chunk
    if len(data) > max_bytes:
        raise UnreadableFile(f"{shown} is larger than {max_bytes:,} bytes: refused")
    return bytes(data)


def _check_kind(info: os.stat_result, shown: str, max_bytes: int) -> None:
    if stat.S_ISLNK(info.st_mode):
        raise UnreadableFile(f"{shown} is a link: skill files are read only as plain files")
    if stat.S_ISDIR(info.st_mode):
        raise UnreadableFile(f"{shown} is a folder: name a file in it")
    if not stat.S_ISREG(info.st_mode):
        raise UnreadableFile(f"{shown} is not a plain file (a FIFO, a socket or a device): refused")
    if info.st_size > max_bytes:
        raise UnreadableFile(f"{shown} is {info.st_size:,} bytes, more than the {max_bytes:,} a skill file may be")


def _why(exc: OSError, shown: str) -> str:
    if exc.errno == errno.ENOENT:
        return f"there is no file {shown} in the skill's folder"
    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        return f"{shown} goes through a link or a file where a folder should be: refused"
    return f"{shown} cannot be read: {exc.strerror or exc}"


def decode_text(data: bytes, shown: str) -> str:
    """``data`` as text: UTF-8 (a byte-order mark dropped) without NUL bytes, else refused as binary."""
    if b"\x00" in data:
        raise UnreadableFile(f"{shown} is not text (it holds NUL bytes): only text files are returned")
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError:
        raise UnreadableFile(f"{shown} is not UTF-8 text: only text files are returned") from None


def listing(root: Path, folder: str, *, limit: int = 100, depth: int = 4,
            max_entries: int = MAX_LISTED_ENTRIES) -> tuple[list[str], bool]:
    """The plain files in a skill's folder other than SKILL.md, sorted, at most ``limit`` (and whether more were left
    out), walked without following links. Hidden ones, links, and names skill_read would refuse are left out. No
    more than ``max_entries`` names are looked at, whatever they are: a folder of a million empty folders is not
    walked to its end at each read (that is "more" too)."""
    real_root = os.path.realpath(root)
    base = os.path.realpath(os.path.join(real_root, folder))
    if not inside(base, real_root) or base == real_root:
        return [], False
    try:
        fd = os.open(base, _DIR_FLAGS)
    except OSError:
        return [], False
    found: list[str] = []
    with _closing(fd):
        more = _files_below(fd, "", depth, limit, [max_entries], found)
    return sorted(found), more


def _files_below(dir_fd: int, prefix: str, depth: int, limit: int, budget: list[int], found: list[str]) -> bool:
    """Adds the listable files below ``dir_fd`` (``prefix`` names it) to ``found``, files first, folders ``depth``
    deep; whether it stopped early (``limit`` files found, or ``budget[0]`` names looked at)."""
    files: list[str] = []
    folders: list[str] = []
    stopped = False
    try:
        with os.scandir(dir_fd) as entries:
            for entry in entries:
                if budget[0] <= 0:
                    stopped = True
                    break
                budget[0] -= 1
                if entry.name.startswith("."):
                    continue
                if entry.is_dir(follow_symlinks=False):
                    folders.append(entry.name)
                elif entry.is_file(follow_symlinks=False) and not (prefix == "" and entry.name == "SKILL.md"):
                    files.append(entry.name)
    except OSError:
        return False
    for name in sorted(files):
        if not _listable(prefix + name):
            continue
        if len(found) >= limit:
            return True
        found.append(prefix + name)
    if stopped:
        return True
    for name in sorted(folders) if depth > 0 else []:
        try:
            sub = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
        except OSError:
            continue
        with _closing(sub):
            if _files_below(sub, f"{prefix}{name}/", depth - 1, limit, budget, found):
                return True
    return False


def _listable(path: str) -> bool:
    """Whether skill_read would take ``path`` (no control characters, backslashes…): only such names are listed."""
    try:
        relative_parts(path)
    except UnreadableFile:
        return False
    return True
