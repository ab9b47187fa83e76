"""A streamed chat completion put back together: the text as it arrives, the tool calls from their pieces.

Endpoints that call themselves OpenAI-compatible differ in how they stream tool calls: OpenAI sends each
call's id and name once, then its arguments in pieces, under one ``index`` per call; some send every call
under index 0 with its own id (parallel calls), repeat the name in every piece, or leave the index or the
id out. A piece that names a different id than the call at its index starts a new call; a name is set,
never appended; a call without an id gets one. A stream that ends without a finish reason was cut off.
"""

from __future__ import annotations

from typing import Any

from core.errors import ProviderError
from core.providers import ToolCall
from core.text import clean_text


class StreamedCompletion:
    def __init__(self) -> None:
        self.text: list[str] = []
        self.finished = False
        self._calls: list[dict[str, str]] = []
        self._at: dict[int, int] = {}  # a piece's index → its call in _calls

    def add(self, chunk: Any) -> str:
        """Take one chunk (a ``chat.completion.chunk`` as JSON); returns its text, repaired (may be empty)."""
        choices = _field(chunk, "choices") or []
        if not isinstance(choices, list) or not choices:
            return ""  # e.g. the usage chunk at the end
        choice = choices[0]
        if _field(choice, "finish_reason"):
            self.finished = True
        delta = _field(choice, "delta")
        if delta is None:
            return ""
        for piece in _field(delta, "tool_calls") or []:
            function = _field(piece, "function")
            self._call_piece(_field(piece, "index"), _field(piece, "id"), _field(function, "name"),
                             _field(function, "arguments"))
        content = _field(delta, "content")
        if not isinstance(content, str) or not content:
            return ""
        text = clean_text(content)
        self.text.append(text)
        return text

    def _call_piece(self, index: Any, ident: Any, name: Any, arguments: Any) -> None:
        index = index if isinstance(index, int) else None
        ident = ident if isinstance(ident, str) else None
        name = name if isinstance(name, str) else None
        at = self._at.get(index) if index is not None else (len(self._calls) - 1 if self._calls else None)
        if at is None or (ident and self._calls[at]["id"] and ident != self._calls[at]["id"]):
            self._calls.append({"id": "", "name": "", "arguments": ""})
            at = len(self._calls) - 1
            if index is not None:
                self._at[index] = at
        call = self._calls[at]
        if ident:
            call["id"] = ident
        if name:
            call["name"] = name
        if isinstance(arguments, str):
            call["arguments"] += arguments

    def tool_calls(self) -> tuple[ToolCall, ...]:
        if not self.finished:
            raise ProviderError("network", "the model's answer broke off before its end", retryable=True)
        return tuple(ToolCall(id=clean_text(c["id"]) or f"call_{n}", name=clean_text(c["name"]),
                              arguments=c["arguments"] or "{}")
                     for n, c in enumerate(self._calls, 1))


def _field(obj: Any, key: str) -> Any:
    """``obj[key]`` of a JSON object, or None (anything else, or missing)."""
    return obj.get(key) if isinstance(obj, dict) else None
