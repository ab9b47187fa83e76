"""Real ``bot run`` processes without paying the bot's imports for each one.

A test worker's ``BotProcess`` asks this zygote (one per worker, started at its first use) for a process: the zygote
has already imported what ``bot run`` imports, forks, and the child becomes ``python -m bot run`` in the test's
directory and environment, its output on the test's pipe. It is a real process of its own: SIGKILL stops it as it
stops any other, nothing is shared with the test worker, and nothing of it outlives a kill. Only the imports are
shared, made before any test's environment exists (the bot reads nothing of its environment at import).

Protocol, over a Unix socket pair: the worker sends one JSON line (argv, cwd, env) with three descriptors (the
child's stdin, its stdout/stderr, and a status socket); the zygote answers the child's pid as a line, and writes the
child's exit code (``-N`` for a signal) on the status socket when it ends.
"""

from __future__ import annotations

import array
import io
import json
import os
import runpy
import select
import signal
import socket
import sys

WARM = ("bot.cli", "bot.app", "bot.providers.openai_compat", "bot.providers.demo", "channels.slack.plugin",
        "channels.slack.adapter", "channels.web.plugin", "slack_bolt.app.async_app", "aiosqlite", "sqlite3")


def _receive(control: socket.socket) -> tuple[dict[str, object], list[int]] | None:
    fds = array.array("i")
    data, ancillary, _flags, _address = control.recvmsg(65536, socket.CMSG_LEN(3 * fds.itemsize))
    if not data:
        return None
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - (len(payload) % fds.itemsize)])
    return json.loads(data), list(fds)


def _become_bot(request: dict[str, object], stdin: int, output: int) -> None:
    """In the forked child: the test's streams, directory, environment and arguments, then ``python -m bot``."""
    os.dup2(stdin, 0)
    os.dup2(output, 1)
    os.dup2(output, 2)
    for fd in {stdin, output} - {0, 1, 2}:  # only on 0, 1 and 2, as an exec'd process has them
        os.close(fd)
    os.chdir(str(request["cwd"]))
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in dict(request["env"]).items()})  # type: ignore[call-overload]
    # As a fresh interpreter on pipes: stdout block-buffered, stderr line-buffered.
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)))
    sys.stderr = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)), line_buffering=True,
                                  errors="backslashreplace")
    sys.argv = ["-m", *[str(a) for a in list(request["argv"])]]  # type: ignore[call-overload]
    code: int | str | None = 0
    try:
        runpy.run_module("bot", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    if isinstance(code, str):
        os.write(2, (code + "\n").encode())
        code = 1
    os._exit(code or 0)


def serve(control: socket.socket) -> None:
    statuses: dict[int, socket.socket] = {}
    while True:
        readable, _, _ = select.select([control], [], [], 0.05)
        if readable:
            received = _receive(control)
            if received is None:  # the worker is gone: so are we (children already killed by it, or left to end)
                return
            request, fds = received
            stdin, output, status = fds
            pid = os.fork()
            if pid == 0:
                control.close()
                for other in statuses.values():
                    other.close()
                os.close(status)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                _become_bot(request, stdin, output)
            os.close(stdin)
            os.close(output)
            statuses[pid] = socket.socket(fileno=status)
            control.sendall(f"{pid}\n".encode())
        while statuses:
            try:
                pid, wait_status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            status_socket = statuses.pop(pid, None)
            if status_socket is not None:
                try:
                    status_socket.sendall(f"{os.waitstatus_to_exitcode(wait_status)}\n".encode())
                except OSError:
                    pass
                status_socket.close()


def main() -> None:
    for name in WARM:
        __import__(name)
    control = socket.socket(fileno=int(sys.argv[1]))
    control.sendall(b"ready\n")
    serve(control)


if __name__ == "__main__":
    main()
