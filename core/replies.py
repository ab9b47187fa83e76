"""Reply texts that channels show: core writes the words, a channel supplies the marks (``Marks``).

A reply mixes fixed words with things people typed or named (a command, a destination, an error).
Core composes it; each dynamic piece goes through the channel's ``Marks``, which escapes it for the
channel's markup (Slack: ``&lt;``) and marks code, emphasis, people and places its own way.
"""

from __future__ import annotations

from typing import Protocol

from core.display import visible
from core.model import ApprovalInfo


class Marks(Protocol):
    """How a channel marks up a reply. ``text``, ``code`` and ``block`` take raw text and escape it;
    ``bold`` and ``italic`` wrap text already marked up."""

    def text(self, raw: str) -> str: ...
    def code(self, raw: str) -> str: ...
    def block(self, raw: str) -> str: ...
    def bold(self, marked: str) -> str: ...
    def italic(self, marked: str) -> str: ...
    def user(self, user_id: str) -> str: ...
    def place(self, place: str) -> str: ...


class PlainMarks:
    """Plain text, with backticks around code (the web chat and the CLI)."""

    def text(self, raw: str) -> str:
        return raw

    def code(self, raw: str) -> str:
        return f"`{raw}`"

    def block(self, raw: str) -> str:
        return f"\n{raw}\n"

    def bold(self, marked: str) -> str:
        return marked

    def italic(self, marked: str) -> str:
        return marked

    def user(self, user_id: str) -> str:
        return user_id

    def place(self, place: str) -> str:
        return place


PLAIN = PlainMarks()


def typed(text: str) -> str:
    """Something a person typed, for quoting back as code: short, every character visible, no backtick."""
    return visible(text[:40]).replace("`", "'")


def asked_by(request: ApprovalInfo, marks: Marks = PLAIN, *, limit: int = 10) -> str:
    """Who the call may come from: the requester (the turn's first sender), and everyone else whose
    messages the turn had taken (a steered reply may be what asked for it)."""
    asked = f"Asked by {marks.user(request.requester)}" if request.requester else "Asked by the agent"
    others = [marks.user(user) for user in request.other_senders[:limit]]
    if len(request.other_senders) > limit:
        others.append(f"{len(request.other_senders) - limit} more")
    if not others:
        return asked
    listed = others[0] if len(others) == 1 else f"{', '.join(others[:-1])} and {others[-1]}"
    return f"{asked} (with messages from {listed})"


def listed_call(call: str, marks: Marks = PLAIN, limit: int = 500) -> str:
    """A grant's call in a listing, made visible (no ``` run survives ``visible``). A long one is
    said to be cut, and how long it is: `bot approvals grants` prints it whole."""
    shown = visible(call)
    more = ("\n" + marks.italic(f"(the first {limit} of {len(shown):,} characters: "
                                f"{marks.code('bot approvals grants')} prints it whole)")) if len(shown) > limit else ""
    return f"\n{marks.block(shown[:limit])}{more}"
