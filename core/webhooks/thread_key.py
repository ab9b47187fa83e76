"""A source's ``thread`` template rendered from an event's payload: events with the same key share a thread."""

from __future__ import annotations

import re
from typing import Any

MAX_KEY = 255  # the column's length (webhook_events.thread_key)
FIELD_ROOM = 4 * MAX_KEY  # characters of one field looked at
FIELD = re.compile(r"\{([^{}]*)\}")
PATH = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")


def template_problem(template: str) -> str | None:
    """Why ``template`` is not text with ``{dotted.path}`` fields (a stray brace, an empty or odd field); None
    when it is."""
    for match in FIELD.finditer(template):
        if not PATH.match(match.group(1)):
            return f"has the field {{{match.group(1)}}}: a field is a dotted path such as {{repository.full_name}}"
    if "{" in FIELD.sub("", template) or "}" in FIELD.sub("", template):
        return "has a '{' or '}' that opens or closes no field: fields are written {dotted.path}"
    return None


def render_thread_key(template: str | None, payload: Any) -> str | None:
    """The key: each ``{a.b.c}`` replaced by that field of the payload (a digit part indexes a list). A missing
    field, or one that is not a string, number or boolean, renders empty (an outsider writes the payload: it
    cannot make the key huge or structured). Stripped and capped; None without a template or when it renders
    empty (the event gets its own thread)."""
    if not template:
        return None
    key = FIELD.sub(lambda match: _field(payload, match.group(1)), template)
    # Printable characters only: no line breaks in a key, and no NUL or lone surrogate a column cannot hold.
    key = "".join(char for char in key if char.isprintable()).strip()[:MAX_KEY].strip()
    return key or None


def _field(payload: Any, path: str) -> str:
    value = payload
    for part in path.split("."):
        if isinstance(value, dict):
            value = value.get(part)
        elif isinstance(value, list) and part.isascii() and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        # Only what a key can hold, and some room for what is filtered out: a field of a megabyte named a few
        # times must not be copied and filtered whole on the event loop (the key is cut to MAX_KEY anyway).
        return value[:FIELD_ROOM]
    if isinstance(value, int) and abs(value) < 10**64:  # past that, not an id (and str() of a huge int raises)
        return str(value)
    return ""
