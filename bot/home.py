"""BOT_HOME is private: directories 0700, files 0600 (the database holds transcripts and sealed
credentials, secret.key opens them). Checked at every start that opens the database.

- BOT_HOME is created 0700; a looser BOT_HOME, work folder, database file (and its -wal, -shm,
  -journal files) or other file at its top level is tightened, with a warning naming the path.
- A BOT_HOME that every user may write to (or with the sticky bit, like /tmp) is refused: the key
  or the database may have been replaced. A secret.key in use that others may read is refused by
  bot.keys: it may already have been copied, so the operator must decide (and rotate).
- The SQLite file is created 0600 before SQLite opens it; SQLite gives its -wal and -shm files the
  database file's mode. The process umask is left alone: what shell_run creates in the work folder
  is behind the 0700 folder anyway.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from sqlalchemy.engine import make_url

from bot.errors import SettingsError
from bot.keys import KEY_FILE
from bot.settings import Settings

log = logging.getLogger(__name__)

WORK_DIR = "work"
SKILLS_DIR = "skills"  # the default SKILLS_DIR (bot.settings.Settings.resolved_skills_dir)
HOMES_DIR = "homes"  # the agents' kept HOMEs, seen only by the shell_run calls people approved (bot.tools.shell)
_SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


def secure_home(settings: Settings) -> None:
    """Create BOT_HOME and the work folder 0700, tighten what is looser; refuse what cannot be trusted."""
    home = settings.bot_home.resolve()
    database = sqlite_path(settings)
    if database is not None:
        _refuse_foreign_database(database)  # before anything is changed (a typo like sqlite:////tmp)
    _make_private_dir(home)
    _refuse_shared(home)
    _make_private_dir(home / WORK_DIR)
    if settings.skills_dir is None:  # the default $BOT_HOME/skills, made so an operator sees where skills go
        _make_private_dir(home / SKILLS_DIR)
    if database is not None:
        _make_private_dir(database.parent)  # only created here if missing; an existing one is left as it is
        _create_private_file(database)
    for path in _private_paths(home, database):
        # A key file in use has a stricter rule: bot.keys refuses a loose one (it may have been copied).
        if path != home / KEY_FILE or settings.bot_secret_keys:
            _tighten(path)


def skills_dir_problem(settings: Settings) -> str | None:
    """Why SKILLS_DIR cannot be used, or None. Mounted for every shell_run command, it must not hold what a command
    must never see (BOT_HOME, the database, ``.env``); and what commands write (the work folders, their kept HOMEs)
    must not become skills, or an unasked command could write the runbook the next turn follows; nor what MCP
    servers write. Inside BOT_HOME only ``$BOT_HOME/skills`` may hold skills."""
    skills = settings.resolved_skills_dir
    real = skills.resolve()
    for hidden in sandbox_hidden(settings):
        for path in {hidden, hidden.resolve()}:
            if path.is_relative_to(skills) or path.is_relative_to(real):
                return (f"SKILLS_DIR {skills} holds {path}, which shell_run commands must never see; point SKILLS_DIR "
                        "at a folder of its own (default $BOT_HOME/skills)")
    home, named = settings.bot_home.resolve(), settings.bot_home.absolute()
    for written in (home / WORK_DIR, home / HOMES_DIR):
        # By the path as named and the real one: $BOT_HOME/work may be a link to a larger disk.
        for path in {written, named / written.name, written.resolve()}:
            if real.is_relative_to(path) or skills.is_relative_to(path):
                return (f"SKILLS_DIR {skills} is inside {written}, which shell_run commands write to: a command "
                        "could write the skills the agent follows; point SKILLS_DIR at a folder only the operator "
                        "writes")
            if path.is_relative_to(real) or path.is_relative_to(skills):
                return (f"SKILLS_DIR {skills} holds {path}, the agents' work folders: every command would see every "
                        "agent's files at /skills; point SKILLS_DIR at a folder of its own")
    # Everything else in BOT_HOME is the bot's too: each MCP server runs and writes in $BOT_HOME/mcp/<name> (its
    # SKILL.md would become a skill the agent follows), and what comes later will be written by someone.
    for inside, own in ((real, home / SKILLS_DIR), (skills, named / SKILLS_DIR)):
        if inside.is_relative_to(own.parent) and not inside.is_relative_to(own):
            return (f"SKILLS_DIR {skills} is inside BOT_HOME, whose folders the bot, its commands and its MCP "
                    f"servers write; inside BOT_HOME only {own} may hold skills")
    return None


def sandbox_hidden(settings: Settings) -> list[Path]:
    """What a ``shell_run`` command must never see, by the paths settings name (bot.sandbox hides those under a
    system folder it shows): BOT_HOME, the SQLite files, and the ``.env`` the settings were read from."""
    database = sqlite_path(settings)
    sqlite = [Path(f"{database}{side}") for side in ("", *_SQLITE_SIDE_FILES)] if database is not None else []
    return [settings.bot_home.absolute(), *sqlite, Path(".env").absolute()]


def sqlite_path(settings: Settings) -> Path | None:
    """The SQLite database file, or None (PostgreSQL, in memory). Settings refuse URI filenames
    (``file:…``, ``?uri=true``): the path here is the one SQLite opens."""
    url = make_url(settings.resolved_database_url)
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return None
    return Path(url.database).resolve()


def _private_paths(home: Path, database: Path | None) -> list[Path]:
    """BOT_HOME, what is at its top level (not what symlinks point to), and the SQLite files."""
    paths = [home, *(p for p in sorted(home.iterdir()) if not p.is_symlink())]
    if database is not None:
        paths += [p for p in (database, *(database.with_name(database.name + s) for s in _SQLITE_SIDE_FILES))
                  if p.exists() and p not in paths]
    return paths


def _refuse_foreign_database(database: Path) -> None:
    """Only this user's plain files are the database (and its side files): a folder, a device, a FIFO or
    another user's file named by DATABASE_URL is refused, never tightened, locked or opened."""
    for path in (database, *(database.with_name(database.name + s) for s in _SQLITE_SIDE_FILES)):
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise SettingsError(f"cannot check the database {path}: {exc.strerror or exc}") from None
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            raise SettingsError(f"the database {path} is not a plain file of this user's (a folder, a device, a "
                                "FIFO, a link or another user's file); point DATABASE_URL at this user's own "
                                "SQLite file")


def _make_private_dir(path: Path) -> None:
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise SettingsError(f"cannot create {path}: {exc.strerror or exc}") from None


def _create_private_file(path: Path) -> None:
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass
    except OSError as exc:
        raise SettingsError(f"cannot create {path}: {exc.strerror or exc}") from None


def _refuse_shared(home: Path) -> None:
    mode = stat.S_IMODE(home.stat().st_mode)
    if mode & (stat.S_IWOTH | stat.S_ISVTX):
        raise SettingsError(f"BOT_HOME {home} is writable by other users (mode {mode:o}): its key or database may "
                            "have been replaced. Use a folder of its own (or check its files, then chmod 700 it)")


def _tighten(path: Path) -> None:
    """Take away every group and other permission, with a warning that names the path."""
    mode = stat.S_IMODE(path.stat().st_mode)
    if not mode & 0o077:
        return
    try:
        path.chmod(mode & 0o700)
    except OSError as exc:
        raise SettingsError(f"{path} is open to other users (mode {mode:o}) and cannot be tightened: "
                            f"{exc.strerror or exc}; run: chmod go= {path}") from None
    log.warning("%s was open to other users (mode %o); it is now %o", path, mode, mode & 0o700)
