"""The one exception root of ``bot``, the other exceptions bot raises, and the exit codes of the ``bot``
command line."""

from __future__ import annotations

from enum import IntEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bot.mcp.challenge import Diagnosis


class Exit(IntEnum):
    """One exit code per kind of outcome (listed in ``bot --help`` and docs/operations.md)."""

    OK = 0
    FAILED = 1  # it could not be done now (database unreachable, port busy), or `bot doctor` found a problem
    USAGE = 2  # bad arguments or invalid settings (argparse uses 2 too)
    NOT_FOUND = 3  # no such request, grant, credential or schedule
    REFUSED = 4  # not allowed, or its state does not allow it (already decided, expired, cancelled)
    INTERRUPTED = 130  # Ctrl-C

# What to do when the database cannot be opened.
DB_HINT = "check DATABASE_URL and that the database server is running (`bot doctor` checks it)"


class BotError(Exception):
    """A problem with a message meant for the operator; by default in settings or wiring (exit 2)."""

    exit_code = Exit.USAGE


class SettingsError(BotError):
    pass


class Failed(BotError):
    """It could not be done now; after fixing the cause, trying again may work."""

    exit_code = Exit.FAILED


class NotFoundError(BotError):
    exit_code = Exit.NOT_FOUND


class Refused(BotError):
    exit_code = Exit.REFUSED


class ServerFailed(Exception):
    """The server could not be reached, or failed the request: ``diagnosis`` says which."""

    def __init__(self, diagnosis: Diagnosis) -> None:
        super().__init__(diagnosis.message)
        self.diagnosis = diagnosis


class EgressRefused(OSError):
    """http_request may not connect there. The message is for the model (and the person reading it)."""
