"""Run a ``bot`` command inside the test process, seeing what its own process would see.

A ``python -m bot ...`` subprocess spends over a second of CPU importing the project; the suite runs
dozens of commands, so by default they run here instead: ``bot.cli.main`` on a thread of its own (the
command makes its own event loop with ``asyncio.run``, and the test's loop keeps serving the fake
Slack, model and OAuth servers the command talks to), with, for the command's duration:

- ``os.environ`` replaced by the environment the process would get, and the working directory changed;
- ``sys.stdin`` (given bytes, else empty: not a terminal, as /dev/null), ``sys.stdout`` and
  ``sys.stderr`` its own, buffered as the interpreter buffers them on pipes (the test's thread keeps
  writing where it wrote before);
- logging as a fresh interpreter has it: no handler on the root logger, level WARNING (a warning
  reaches stderr through logging's last resort, as it would in the process), restored afterwards;
- warnings (the interpreter's default filters), exceptions ignored in ``__del__`` and uncaught in threads
  printed on stderr, not collected into pytest's report;
- the exit code as the interpreter makes it: ``main``'s return or ``SystemExit``, and for any other
  exception the traceback on stderr and code 1.

What cannot be faithful here stays a real process (``process=True`` in ``run_command``): ``bot run``
(signal handlers, a lock held for the process's life, ``gc.freeze``), and any test of the
interpreter's own start (``sitecustomize``, what ``python -m bot`` imports).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import io
import logging
import os
import sys
import threading
import traceback
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

# A command's own state (environment, directory, streams) is the process's: one command at a time.
_ONE_AT_A_TIME = threading.Lock()


@dataclass(frozen=True)
class Finished:
    code: int
    out: str
    err: str  # "" when stderr was merged into ``out`` (as ``stderr=STDOUT``)


class _Pipe(io.RawIOBase):
    """The read end of the process's stdout (or stderr) pipe: every byte that reached it, in order."""

    def __init__(self) -> None:
        self.received = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.received += data
        return len(data)

    def text(self) -> str:
        return self.received.decode()


# As the interpreter opens them on pipes: stdout block-buffered (the pipe's st_blksize, 4096 on Linux), stderr
# line-buffered and written through. So with both on one pipe, stdout's text arrives when flushed or at exit,
# after the stderr lines written meanwhile, as in the subprocess. PYTHONUNBUFFERED (python -u) writes both through.
def _stdout(pipe: _Pipe, unbuffered: bool) -> TextIO:
    if unbuffered:
        return io.TextIOWrapper(pipe, encoding="utf-8", write_through=True)  # type: ignore[type-var]
    return io.TextIOWrapper(io.BufferedWriter(pipe, buffer_size=4096), encoding="utf-8")


def _stderr(pipe: _Pipe, unbuffered: bool) -> TextIO:
    if unbuffered:
        return io.TextIOWrapper(pipe, encoding="utf-8", errors="backslashreplace",  # type: ignore[type-var]
                                write_through=True)
    return io.TextIOWrapper(io.BufferedWriter(pipe), encoding="utf-8", errors="backslashreplace",
                            line_buffering=True, write_through=True)


class _ThreadStream(io.TextIOBase):
    """``sys.stdout`` or ``sys.stderr`` while a command runs: what the test's own thread writes (its event
    loop, the fake servers) goes where it went before; every other thread is the command's."""

    def __init__(self, command: TextIO, test: TextIO, test_thread: threading.Thread) -> None:
        self._command = command
        self._test = test
        self._test_thread = test_thread

    def _target(self) -> TextIO:
        return self._test if threading.current_thread() is self._test_thread else self._command

    def write(self, text: str) -> int:
        return self._target().write(text)

    def flush(self) -> None:
        self._target().flush()

    def isatty(self) -> bool:
        return False  # a pipe

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"


@contextlib.contextmanager
def _fresh_logging() -> Iterator[None]:
    """Logging as an interpreter that configured nothing: the root logger has no handler (pytest's are set
    aside, so the command's records are not caught here) and level WARNING. Everything is put back."""
    root = logging.getLogger()
    loggers = [logger for logger in logging.Logger.manager.loggerDict.values() if isinstance(logger, logging.Logger)]
    saved = [(logger, logger.level, logger.handlers[:], logger.propagate, logger.disabled)
             for logger in [root, *loggers]]
    disabled = logging.root.manager.disable
    root.handlers[:] = []
    root.setLevel(logging.WARNING)
    logging.disable(logging.NOTSET)
    try:
        yield
    finally:
        for logger, level, handlers, propagate, was_disabled in saved:
            logger.setLevel(level)
            logger.handlers[:] = handlers
            logger.propagate = propagate
            logger.disabled = was_disabled
        logging.disable(disabled)


# The interpreter's default warning filters (no -W, no PYTHONWARNINGS, not a debug build), in order.
_DEFAULT_FILTERS: tuple[tuple[str, type[Warning], str], ...] = (
    ("default", DeprecationWarning, "__main__"), ("ignore", DeprecationWarning, ""),
    ("ignore", PendingDeprecationWarning, ""), ("ignore", ImportWarning, ""), ("ignore", ResourceWarning, ""),
)


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: TextIO | None = None, line: str | None = None) -> None:
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


@contextlib.contextmanager
def _fresh_reporting() -> Iterator[None]:
    """Warnings, exceptions in ``__del__`` and in threads printed on stderr as a fresh interpreter does (pytest
    otherwise collects them into its own report, out of the command's output)."""
    hooks = sys.unraisablehook, threading.excepthook
    with warnings.catch_warnings():
        warnings.resetwarnings()
        for action, category, module in _DEFAULT_FILTERS:
            warnings.filterwarnings(action, category=category, module=module, append=True)  # type: ignore[arg-type]
        warnings.showwarning = _show_warning
        sys.unraisablehook, threading.excepthook = sys.__unraisablehook__, threading.__excepthook__
        try:
            yield
        finally:
            sys.unraisablehook, threading.excepthook = hooks


@contextlib.contextmanager
def _as_process(cwd: Path, env: dict[str, str], args: tuple[str, ...], stdin: bytes,
                out: TextIO, err: TextIO, test_thread: threading.Thread) -> Iterator[None]:
    saved_env, saved_cwd, saved_argv = dict(os.environ), os.getcwd(), sys.argv
    saved_streams = sys.stdin, sys.stdout, sys.stderr
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    # As ``python -m bot`` sets it.
    sys.argv = [str(Path(__file__).resolve().parent.parent / "bot" / "__main__.py"), *args]
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8")
    sys.stdout = _ThreadStream(out, saved_streams[1], test_thread)  # type: ignore[assignment]
    sys.stderr = _ThreadStream(err, saved_streams[2], test_thread)  # type: ignore[assignment]
    try:
        with _fresh_logging(), _fresh_reporting():
            yield
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved_streams
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)


def _exit_code(exc: BaseException, err: TextIO) -> int:
    """What the interpreter would exit with."""
    if not isinstance(exc, SystemExit):
        traceback.print_exception(exc, file=err)
        return 1
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=err)
    return 1


def run_main(cwd: Path, env: dict[str, str], args: tuple[str, ...], *, stdin: bytes = b"",
             merge: bool = False, test_thread: threading.Thread | None = None) -> Finished:
    """``python -m bot *args`` in ``cwd`` with exactly ``env``, here; blocks until it ends."""
    from bot.cli import main

    out_pipe = _Pipe()
    err_pipe = out_pipe if merge else _Pipe()
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    out, err = _stdout(out_pipe, unbuffered), _stderr(err_pipe, unbuffered)
    with _ONE_AT_A_TIME:
        # What earlier tests left for the cycle collector must not be finalized during the command (a task of a
        # closed loop would log "Task exception was never retrieved" into its stderr): set aside for its
        # duration. A full collection instead costs a second in a worker holding most of a million objects.
        gc.freeze()
        try:
            with _as_process(cwd, env, args, stdin, out, err, test_thread or threading.main_thread()):
                try:
                    raise SystemExit(main(list(args)))  # bot/__main__.py
                except BaseException as exc:  # whatever the process would die of
                    code = _exit_code(exc, err)
                gc.collect()  # the command's own garbage (only it), finalized with its streams as at the process's end
                out.flush()  # at exit
                err.flush()
        finally:
            gc.unfreeze()
    return Finished(code, out_pipe.text(), "" if merge else err_pipe.text())


async def run_main_async(cwd: Path, env: dict[str, str], args: tuple[str, ...], *, stdin: bytes = b"",
                         merge: bool = False, timeout: float = 30.0) -> Finished:
    """``run_main`` on a thread of its own, while this loop (the test's fake servers) keeps running."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Finished] = loop.create_future()
    test_thread = threading.current_thread()

    def hand_over(finished: Finished | None, exc: BaseException | None) -> None:
        if done.done():  # the test stopped waiting (timeout)
            return
        if exc is not None:
            done.set_exception(exc)
        else:
            done.set_result(finished)  # type: ignore[arg-type]

    def command() -> None:
        try:
            finished = run_main(cwd, env, args, stdin=stdin, merge=merge, test_thread=test_thread)
        except BaseException as exc:
            loop.call_soon_threadsafe(hand_over, None, exc)
        else:
            loop.call_soon_threadsafe(hand_over, finished, None)

    threading.Thread(target=command, name=f"bot {' '.join(args)}", daemon=True).start()
    async with asyncio.timeout(timeout):
        return await asyncio.shield(done)
