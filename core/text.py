"""Text that can be stored and sent: no NUL characters, no lone UTF-16 surrogates; ids people type.

PostgreSQL refuses NUL in text, and no database driver can encode a lone surrogate (``"\\ud800"``
decoded from JSON): either would turn an odd message into a crash. Input is repaired where it enters
(a channel's payload, a model's reply, a tool's output); a model's tool arguments are refused instead
(see ``Tool.parse_arguments``), because a repaired command is not the command that was written.
"""

from __future__ import annotations

import math
import re
from typing import Any

REPLACEMENT = "\ufffd"
MAX_ID = 10**18 - 1  # ids people type: at most 18 digits, well inside a signed 64-bit column
_ID = re.compile(r"[0-9]{1,18}")
_SURROGATE = re.compile(r"[\ud800-\udfff]")  # in a Python str, any surrogate is a lone one
# The frame around text from outside that the model reads as data (a model's summary of a thread, an event).
DATA_OPEN, DATA_CLOSE = "<<<", ">>>"
_FRAME_MARKS = re.compile(r"<{3,}|>{3,}")


def clean_text(text: str) -> str:
    """``text`` with NUL characters removed and lone surrogates replaced by U+FFFD."""
    if "\x00" in text:
        text = text.replace("\x00", "")
    return _SURROGATE.sub(REPLACEMENT, text)


def text_problem(text: str) -> str | None:
    """What makes ``text`` unstorable (a NUL, a lone surrogate), or None."""
    if "\x00" in text:
        return "a NUL character"
    if _SURROGATE.search(text):
        return "invalid Unicode (a lone surrogate)"
    return None


def clean_tree(value: Any) -> Any:
    """Every string in a decoded JSON value (keys too) cleaned; dicts and lists are changed in place,
    so a parsed payload that others hold a reference to is repaired for them as well."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, list):
        for i, item in enumerate(value):
            value[i] = clean_tree(item)
    elif isinstance(value, dict):
        for key in list(value):
            item = clean_tree(value[key])
            if isinstance(key, str) and clean_text(key) != key:
                del value[key]
                key = clean_text(key)
            value[key] = item
    return value


MAX_INTEGER_BITS = 1024  # about 308 digits: an argument's integer past this is refused, not stored or printed


def tree_problem(value: Any) -> str | None:
    """The first unstorable value anywhere in a decoded JSON value (keys too), or None: a text with a NUL or a
    lone surrogate, a number that is not finite (``NaN``, ``Infinity``: ``json.loads`` takes them, JSON has
    none), or an integer too large to check or print (a 5,000-digit one cannot even be turned into text)."""
    if isinstance(value, str):
        return text_problem(value)
    if isinstance(value, float) and not math.isfinite(value):
        return f"a number that is not finite ({value})"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > MAX_INTEGER_BITS:
        return f"an integer of more than {MAX_INTEGER_BITS} bits"
    items: list[Any] = []
    if isinstance(value, list):
        items = value
    elif isinstance(value, dict):
        items = [*value, *value.values()]
    for item in items:
        problem = tree_problem(item)
        if problem is not None:
            return problem
    return None


def framed_data(text: str) -> str:
    """``text`` between ``<<<`` and ``>>>``, each on its own line: the frame that marks what anyone may have
    written as data, never instructions. A run of three or more ``<`` or ``>`` inside becomes two (``<<<<``
    too, which one replace of ``<<<`` would leave as ``<<<``): nothing inside can close the frame early or
    open another, so what follows it cannot pass for the operator's words."""
    return f"{DATA_OPEN}\n{frame_safe(text)}\n{DATA_CLOSE}"


def frame_safe(text: str) -> str:
    """``text`` as ``framed_data`` puts it inside the frame (runs of ``<`` or ``>`` cut to two). Line by line it is the
    same as whole, since a run never spans a line break: a caller fitting lines into a frame may measure each once."""
    return _FRAME_MARKS.sub(lambda m: m.group(0)[0] * 2, text)


def parse_id(text: str) -> int | None:
    """A positive id typed as ASCII digits (``"42"``), or None: not ``"²"``, ``"١٢"``, ``"+1"`` or
    a number too large for the database."""
    if _ID.fullmatch(text) is None:
        return None
    return int(text) or None
