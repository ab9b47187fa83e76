"""The test worker's side of tests/bot_zygote.py: ``bot run`` processes forked from a parent that has already imported
the bot, with the asyncio.subprocess.Process surface BotProcess uses (pid, stdout, send_signal, kill, terminate, wait,
returncode). ``BOT_TEST_FORK=0`` turns it off: every process is then started by exec, as before; so is one whose
environment changes what an interpreter reads as it starts (``PYTHON*``)."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class _Zygote:
    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.bot_zygote", str(theirs.fileno())],
                                     pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     cwd=ROOT)
        theirs.close()
        self.control = ours
        self._buffer = b""
        if self._line() != "ready":
            raise RuntimeError("the bot zygote did not start")

    def _line(self) -> str:
        while b"\n" not in self._buffer:
            piece = self.control.recv(4096)
            if not piece:
                raise RuntimeError("the bot zygote is gone")
            self._buffer += piece
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def spawn(self, argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, int, socket.socket]:
        """A forked ``bot *argv``: its pid, the read end of its output, and the socket its exit code comes on."""
        out_r, out_w = os.pipe()
        status_ours, status_theirs = socket.socketpair()
        stdin = os.open(os.devnull, os.O_RDONLY)
        try:
            request = json.dumps({"argv": argv, "cwd": str(cwd), "env": env}).encode()
            socket.send_fds(self.control, [request], [stdin, out_w, status_theirs.fileno()])
        finally:
            os.close(stdin)
            os.close(out_w)
            status_theirs.close()
        return int(self._line()), out_r, status_ours

    def close(self) -> None:
        self.control.close()
        with contextlib.suppress(Exception):
            self.proc.wait(5)


_zygote: list[_Zygote] = []


def _the_zygote() -> _Zygote | None:
    if os.environ.get("BOT_TEST_FORK", "1") == "0":
        return None
    if not _zygote or _zygote[0].proc.poll() is not None:
        _zygote[:] = [_Zygote()]
        atexit.register(_zygote[0].close)
    return _zygote[0]


class ForkedProcess:
    def __init__(self, pid: int, stdout: asyncio.StreamReader,
                 status: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
        self.pid = pid
        self.stdout = stdout
        self._status, self._status_writer = status  # the writer kept: dropped, it would close the socket
        self.returncode: int | None = None

    async def wait(self) -> int:
        if self.returncode is None:
            line = await self._status.readline()
            self.returncode = int(line) if line.strip() else -signal.SIGKILL
            self._status_writer.close()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


async def forked_bot(argv: list[str], cwd: Path, env: dict[str, str]) -> ForkedProcess | None:
    """``bot *argv`` forked from the zygote, output (stdout and stderr) on ``stdout``; None when forking is off."""
    startup = {k: v for k, v in env.items() if k.startswith("PYTHON")}
    if startup != {k: v for k, v in os.environ.items() if k.startswith("PYTHON")}:
        return None  # what an interpreter reads as it starts (PYTHONPATH, a sitecustomize) differs: exec it
    zygote = _the_zygote()
    if zygote is None:
        return None
    pid, out_r, status_sock = zygote.spawn(argv, cwd, env)
    loop = asyncio.get_running_loop()
    stdout = asyncio.StreamReader(limit=2**20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdout), os.fdopen(out_r, "rb", 0))
    return ForkedProcess(pid, stdout, await asyncio.open_connection(sock=status_sock))
