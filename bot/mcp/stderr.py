"""A stdio MCP server's stderr, kept in ``<BOT_HOME>/mcp/<name>.stderr.log`` without letting it grow without
limit: read through a pipe of ours, the file is rotated to ``.1`` (one kept) when it would pass ``LOG_MAX``
bytes, at each (re)start and while the server runs. Not redacted: it holds what the server prints (0600)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path
from typing import BinaryIO, TextIO

LOG_MAX = 1_000_000  # bytes per file; with the one rotated copy at most twice that per server


class StderrLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: BinaryIO | None = None
        self._size = 0
        self._writer: TextIO | None = None
        self._transport: asyncio.ReadTransport | None = None

    async def open(self) -> TextIO:
        """The write end to hand the process as its stderr (``spawned`` closes our copy of it)."""
        if self.path.exists() and self.path.stat().st_size > LOG_MAX:
            self._rotate()
        self._reopen()
        read_fd, write_fd = os.pipe()
        self._writer = os.fdopen(write_fd, "w", encoding="utf-8", errors="replace")
        reader = os.fdopen(read_fd, "rb", buffering=0)
        try:
            self._transport, _ = await asyncio.get_running_loop().connect_read_pipe(lambda: _Sink(self), reader)
        except BaseException:
            reader.close()
            self.close()
            raise
        return self._writer

    def spawned(self) -> None:
        """The process holds the write end now: ours is closed, so its exit ends the pipe."""
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()

    def write(self, data: bytes) -> None:
        while data and self._file is not None:
            if self._size >= LOG_MAX:
                self._rotate()
                try:
                    self._reopen()
                except OSError:
                    return
            part, data = data[:LOG_MAX - self._size], data[LOG_MAX - self._size:]
            try:
                self._file.write(part)
            except OSError:  # a full disk: what the server printed is lost, not the bot
                return
            self._size += len(part)

    def close(self) -> None:
        self.spawned()
        if self._transport is not None:
            self._transport.close()
            self._transport = None
        if self._file is not None:
            self._file.close()
            self._file = None

    def _rotate(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        with contextlib.suppress(OSError):
            os.replace(self.path, self.path.with_name(self.path.name + ".1"))

    def _reopen(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._file = os.fdopen(fd, "ab", buffering=0)
        self._size = os.fstat(fd).st_size


class _Sink(asyncio.Protocol):
    def __init__(self, log: StderrLog) -> None:
        self.log = log

    def data_received(self, data: bytes) -> None:
        self.log.write(data)
