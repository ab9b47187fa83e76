"""Text as an approver must read it: every character accounted for, nothing pushed out of sight.

Used wherever a person decides on what the agent will run (the Slack card, the web chat, the CLI).
"""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any

# Letters and marks that draw nothing (Hangul fillers, braille blank, variation selectors, ...).
_BLANK = {0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x2800, 0x3164, 0xFFA0, *range(0x180B, 0x1810),
          *range(0xFE00, 0xFE10)}
_HIDDEN_CATEGORIES = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}
# Characters of a reason shown on a card: marks make it grow, and escaped for Slack (&lt;) it must
# still fit a block (3000).
REASON_SHOWN_MAX = 600
# What a thread's status line says while a tool runs, where its name says little (the default: "running <tool>…").
_ACTIVITIES = {"delegate": "asking helper…"}  # core.agents.DELEGATE_TOOL: a sub-agent works on a task


def activity(tool: str) -> str:
    """What the agent is doing while ``tool`` runs, for a status line ("asking helper…")."""
    return _ACTIVITIES.get(tool, f"running {tool}…")


def visible(text: str) -> str:
    """``text`` as an approver must read it: nothing invisible and nothing pushed out of sight.

    Tabs, control and format characters (zero-width, bidi overrides such as U+202E), spaces other
    than the plain one and blank letters become marks such as ``⟦TAB⟧`` or ``⟦U+202E⟧``; a run of
    three or more spaces (or a trailing one) becomes ``⟦N spaces⟧``, three or more line breaks
    ``⟦N line breaks⟧``, three or more backticks ``⟦N backticks⟧`` (they would end a code block).
    """
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch in " \n`":
            j = i
            while j < n and text[j] == ch:
                j += 1
            run = j - i
            if ch == " " and (run >= 3 or j == n or text[j] == "\n"):
                out.append(f"⟦{run} space{'s' if run > 1 else ''}⟧")
            elif ch == "\n" and run >= 3:
                out.append(f"\n⟦{run} line breaks⟧\n")
            elif ch == "`" and run >= 3:
                out.append(f"⟦{run} backticks⟧")
            else:
                out.append(ch * run)
            i = j
            continue
        code = ord(ch)
        if ch == "\t":
            out.append("⟦TAB⟧")
        elif ch == "\r":
            out.append("⟦CR⟧")
        elif (unicodedata.category(ch) in _HIDDEN_CATEGORIES or code in _BLANK or 0xE0100 <= code <= 0xE01EF
              or (unicodedata.category(ch) == "Zs" and ch != " ")):
            out.append(f"⟦U+{code:04X}⟧")
        else:
            out.append(ch)
        i += 1
    return "".join(out)


def arguments_text(arguments: dict[str, Any]) -> str:
    """Every argument in full, ``key: value`` per line, made ``visible``. A value's further lines
    start with ``│`` so that none can pass for another argument."""
    lines = []
    for key, value in arguments.items():
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        lines.append(f"{visible(str(key))}: " + visible(text).replace("\n", "\n│ "))
    return "\n".join(lines) or "(no arguments)"


def shown_reason(reason: str) -> str:
    """The model's reason as the card shows it, channel-neutral: one line (line breaks as ``⏎``),
    invisible characters marked (``visible``), and no URL scheme left whole (``https[:]//``),
    so that nothing in it passes for the bot's own words or makes a link. Channels still escape it
    for their markup and show it as quoted text."""
    text = visible(reason).replace("\n", " ⏎ ")
    text = re.sub(r"(?i)([a-z][a-z0-9+.-]*):(?=//)", r"\1[:]", text)
    if len(text) > REASON_SHOWN_MAX:
        text = text[:REASON_SHOWN_MAX] + f"… ({len(text) - REASON_SHOWN_MAX} more characters)"
    return text
