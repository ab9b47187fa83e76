"""The answer as the model writes it, for channels that show it live: masked before any of it leaves.

A provider that streams calls a ``TextStream`` with each piece of text as it arrives. This one holds the
pieces until the redactor's masks are known to be current, masks them with a ``StreamMasker`` (a secret
split across pieces is still masked: the tail that could be the start of one waits for the next piece),
and hands them on in batches (at most one per ``batch_s``) so that a model writing token by token does
not become hundreds of events. Each model call (the next step, or a retry of a failed call) starts over:
its first text is marked ``restart``. Nothing here is stored: the answer itself is stored with the turn's
end and delivered by the outbox; this is only what a person sees meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from core.redaction import Redactor, StreamMasker

BATCH_S = 0.1

Emit = Callable[[str, bool], None]  # (text, restart)


class AnswerStream:
    """One turn's live text (``core.providers.TextStream``)."""

    def __init__(self, emit: Emit, redactor: Redactor | None, masks_checked: asyncio.Future[None] | None,
                 *, batch_s: float = BATCH_S) -> None:
        self._emit = emit
        self._redactor = redactor
        self._checked = masks_checked  # the redactor's check of its masks, under way when the turn starts
        self._waiting = False  # a callback waits for that check, to send what arrived meanwhile
        self._closed = False
        self._sent_any = False  # some text of the turn went out
        self._batch_s = batch_s
        self._raw: list[str] = []  # not yet masked (the masks may not be current yet)
        self._out: list[str] = []  # masked, waiting for the batch to go
        self._masker: StreamMasker | None = None
        self._restart = True
        self._timer: asyncio.TimerHandle | None = None

    def restart(self) -> None:
        """A new model call begins: what is still held of the last one is dropped."""
        self._raw.clear()
        self._out.clear()
        self._masker = None
        self._restart = True
        self._cancel_timer()

    def __call__(self, text: str) -> None:
        if not text or self._closed:
            return
        self._raw.append(text)
        self._release()

    def _release(self) -> None:
        """Mask what is held and have it sent with the batch, once the masks are known to be current."""
        checked = self._checked
        if checked is not None and not checked.done():
            if not self._waiting:  # held until the check ends (a model may pause for long after this)
                self._waiting = True
                checked.add_done_callback(self._check_ended)
            return
        if checked is not None and (checked.cancelled() or checked.exception() is not None):
            return  # masks of unknown age: nothing goes (the turn fails on the same error)
        self._mask()
        if self._out and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._batch_s, self._send)

    def _check_ended(self, _check: asyncio.Future[None]) -> None:
        self._waiting = False
        if self._raw:
            self._release()

    def finish(self, *, final: bool = False) -> None:
        """The model call ended (the masks were checked by now): everything held goes, masked. ``final``:
        its text is the answer; if nothing of the turn was sent yet, nothing is (the answer comes whole,
        delivered at once: showing it live too would only cost calls)."""
        self._mask()
        if self._masker is not None:
            self._out.append(self._masker.flush())
        self._cancel_timer()
        if final and not self._sent_any:
            self._out.clear()
            return
        self._send()

    def close(self) -> None:
        """The turn is over: nothing more goes."""
        self._cancel_timer()
        self._raw.clear()
        self._out.clear()
        self._closed = True

    def _mask(self) -> None:
        if not self._raw:
            return
        if self._masker is None:
            self._masker = self._redactor.stream() if self._redactor is not None else None
        raw = "".join(self._raw)
        self._raw.clear()
        self._out.append(self._masker.feed(raw) if self._masker is not None else raw)

    def _send(self) -> None:
        self._timer = None
        text = "".join(self._out)
        self._out.clear()
        if text:
            self._emit(text, self._restart)
            self._restart = False
            self._sent_any = True

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
