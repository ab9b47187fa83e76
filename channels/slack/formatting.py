"""Markdown → Slack mrkdwn, and splitting long answers under Slack's message limits."""

from __future__ import annotations

import re

# chat.postMessage accepts 40,000 characters but Slack advises ≤ 4,000 per message for display.
MESSAGE_LIMIT = 3_800

_LINK = re.compile(r"\[([^\]\n]+)\]\((https?://[^)\s]+)\)")
_BOLD = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*")
_STRIKE = re.compile(r"~~(?=\S)(.+?)(?<=\S)~~")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$")
# A ``<`` that Slack could read as the start of a mention, a channel or a link; in a piece of a streamed
# answer, also one at its end that the next piece could finish (``<`` | ``!channel>``).
_TOKEN_START = re.compile(r"<(?=\s*[!@#]|\s*[A-Za-z][A-Za-z0-9+.-]*:)")
_PIECE_TOKEN_START = re.compile(r"<(?=\s*[!@#]|\s*[A-Za-z][A-Za-z0-9+.-]*(?::|$)|\s*$)")


def to_mrkdwn(text: str) -> str:
    """Convert the common Markdown a model writes into Slack mrkdwn; code stays as written, except that a
    ``<`` that could open a mention or a link there is defused too (``defused``)."""
    out: list[str] = []
    in_code = False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            in_code = not in_code
            out.append(defused(line))
            continue
        out.append(defused(line) if in_code else _convert_line(line))
    return "\n".join(out)


def _convert_line(line: str) -> str:
    if m := _HEADING.match(line):
        return f"*{_convert_inline(m.group(1))}*"
    return _convert_inline(line)


def _convert_inline(line: str) -> str:
    parts = line.split("`")
    # Even indexes are outside inline code; odd ones are code.
    for i in range(len(parts)):
        parts[i] = _convert_prose(parts[i], first=i == 0) if i % 2 == 0 else defused(parts[i])
    return "`".join(parts)


def _convert_prose(text: str, *, first: bool) -> str:
    quote = ""
    if first and text.startswith(">"):
        quote, text = ">", text[1:]
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = _LINK.sub(lambda m: f"<{m.group(2)}|{m.group(1)}>", text)
    text = _BOLD.sub(r"*\1*", text)
    text = _STRIKE.sub(r"~\1~", text)
    return quote + text


def split_message(text: str, limit: int = MESSAGE_LIMIT) -> list[str]:
    """Split at paragraph, line or word boundaries; a code block cut in two is closed and reopened."""
    if len(text) <= limit:
        return [text]
    chunks: list[str] = []
    rest = text
    while len(rest) > limit:
        cut = _cut_point(rest, limit - 4)  # room to close a code fence
        head, rest = rest[:cut].rstrip("\n"), rest[cut:].lstrip("\n")
        if head.count("```") % 2 == 1:
            head += "\n```"
            rest = "```\n" + rest
        chunks.append(head)
    if rest.strip():
        chunks.append(rest)
    return chunks


def _cut_point(text: str, limit: int) -> int:
    window = text[:limit]
    for sep in ("\n\n", "\n", " "):
        at = window.rfind(sep)
        if at > limit // 2:
            return at + len(sep)
    return limit


def defused(text: str, *, piece: bool = False) -> str:
    """Model text as Markdown for Slack (a ``markdown`` block, a stream's ``markdown_text``), with no ``<``
    left to open a mention or a link (``<!channel>``, ``<@U…>``, ``<#C…>``, ``<https://…|…>``): a zero-width
    space follows each such ``<``. Any other ``<`` (``a<b``, ``cat <<EOF``) stays as written, so code copied
    from an answer works. ``piece``: more text will follow it (a stream's start or append)."""
    return (_PIECE_TOKEN_START if piece else _TOKEN_START).sub("<\u200b", text)


def escape(text: str) -> str:
    """Text that Slack must show as typed: no link, mention or markup of its own (``&``, ``<``, ``>``)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class SlackMarks:
    """Core's replies (``core.replies.Marks``) in mrkdwn: escaped text, mentions and channel links."""

    def text(self, raw: str) -> str:
        return escape(raw)

    def code(self, raw: str) -> str:
        return f"`{escape(raw)}`"

    def block(self, raw: str) -> str:
        return f"```\n{escape(raw)}\n```"

    def bold(self, marked: str) -> str:
        return f"*{marked}*"

    def italic(self, marked: str) -> str:
        return f"_{marked}_"

    def user(self, user_id: str) -> str:
        # A Slack user id becomes a mention; anything else ("web", "operator:ann") is shown as it is.
        return f"<@{user_id}>" if re.fullmatch(r"[A-Z0-9]{1,32}", user_id) else escape(user_id)

    def place(self, place: str) -> str:
        parts = place.split(":")  # "slack:T1:C1" (a channel), "slack:dest:C2" (a schedule's destination)
        return f"<#{parts[-1]}>" if place.startswith("slack:") and len(parts) == 3 else escape(place)


SLACK_MARKS = SlackMarks()
