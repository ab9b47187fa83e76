"""What a shell command line is made of, read the way a POSIX shell reads it, for approval policies.

``simple_command`` says whether a line is one plain command: no operator (``;`` ``&&`` ``||`` ``|`` ``&``),
no redirection or here-doc, no newline, no substitution (backticks, ``$(``), no expansion (``$``), no
subshell or group. Only such a line may be matched by an ``allow`` rule: anything else could run more
than its text seems to say. ``command_variants`` lists every simple command inside a line, each in the
forms a ``deny`` rule is checked against (as written, unquoted, without a path, behind a wrapper such as
``sudo``, inside what ``sh -c`` or ``eval`` runs). That is a best-effort guard, not a boundary: a command
it does not recognise is only safe when no broad ``allow`` rule follows (then it is asked about).
"""

from __future__ import annotations

import re
import shlex

# Characters that end a simple command or change what runs, outside quotes.
_OPERATORS = frozenset(";&|<>\n\r()`{}")
# Commands that run their arguments as a command: ``sudo rm`` is checked as ``rm`` too.
_WRAPPERS = frozenset({"sudo", "doas", "env", "command", "exec", "nohup", "time", "nice", "builtin", "xargs",
                       "timeout", "stdbuf", "setsid", "then", "do", "else", "elif", "if", "while", "until", "!",
                       "busybox", "chroot", "flock", "ionice", "chrt", "taskset", "unshare", "watch", "find", "su",
                       "nsenter", "runuser", "script", "strace", "ltrace", "parallel"})
# Commands that run a string as a command line (``sh -c '…'``, ``eval …``): that string is read again.
_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "ash", "busybox", "su", "eval", "watch", "script",
                     "runuser"})
_GLOB = re.compile(r"[*?\[]")
_IFS = re.compile(r"\$\{IFS\}|\$IFS")


def simple_command(line: str) -> bool:
    """True when ``line`` is one plain command a shell runs as written (see the module's docstring)."""
    if not line.strip():
        return False
    quote = ""
    escaped = False
    for char in line:
        if escaped:
            if char in "\n\r":  # a line continuation: a second line in disguise
                return False
            escaped = False
            continue
        if quote == "'":
            if char == "'":
                quote = ""
            continue
        if char == "\\":
            escaped = True
            continue
        if quote == '"':
            if char == '"':
                quote = ""
            elif char in "$`\n\r":  # substitutions and expansions work inside double quotes
                return False
            continue
        if char in "'\"":
            quote = char
        elif char in _OPERATORS or char == "$":
            return False
    if quote or escaped:
        return False  # unbalanced: no shell runs it as written
    try:
        words = shlex.split(line)
    except ValueError:
        return False
    # A program named by a pattern (``/bin/r[m]``) is whatever the file system makes of it.
    return bool(words) and not _GLOB.search(line.split(None, 1)[0])


def command_variants(line: str, _depth: int = 0) -> list[str]:
    """Every simple command inside ``line`` (split at operators, substitutions, groups and newlines), each
    as written, with its quotes removed, ``$IFS`` read as a space, its program's path dropped, and behind
    wrappers such as ``sudo``; a string run by ``sh -c`` or ``eval`` is read again; the whole line too.
    What a ``deny`` rule is matched against."""
    seen: dict[str, None] = {line.strip(): None}
    for segment in _segments(line):
        for variant in _forms(segment):
            if variant:
                seen.setdefault(variant, None)
        if _depth < 3:
            for inner in _run_strings(segment):
                for variant in command_variants(inner, _depth + 1):
                    seen.setdefault(variant, None)
    return list(seen)


def _run_strings(segment: str) -> list[str]:
    """What a shell or ``eval`` in this command runs as a command line of its own."""
    try:
        words = shlex.split(_IFS.sub(" ", segment))
    except ValueError:
        return []
    found = []
    for index, word in enumerate(words):
        if word.startswith("-S") and index and words[index - 1].rsplit("/", 1)[-1] == "env":
            found.append(word[2:] or " ".join(words[index + 1:]))  # env -S'…': split and run
        if word.rsplit("/", 1)[-1] in _SHELLS and index + 1 < len(words):
            found.append(" ".join(w for w in words[index + 1:] if w not in ("-c", "-lc", "-ic", "-s")))
    return found


def _segments(line: str) -> list[str]:
    """The pieces between operators, outside single quotes (inside double quotes, substitutions count)."""
    pieces: list[str] = []
    current: list[str] = []
    quote = ""
    line = _IFS.sub(" ", line)
    index = 0

    def cut() -> None:
        piece = "".join(current).strip()
        if piece:
            pieces.append(piece)
        current.clear()

    while index < len(line):
        char, after = line[index], line[index + 1:index + 2]
        index += 1
        if quote == "'":
            current.append(char)
            if char == "'":
                quote = ""
            continue
        if char == "\\":
            current.append(char + after)
            index += 1
            continue
        if char == "$" and after == "(":
            cut()  # what a substitution runs is a command of its own
            index += 1
            continue
        if char == "$" and after == "{":  # a parameter expansion belongs to its word
            end = line.find("}", index)
            end = len(line) if end < 0 else end + 1
            current.append(line[index - 1:end])
            index = end
            continue
        if quote == '"':
            if char == '"':
                quote = ""
                current.append(char)
            elif char in "`)\n\r":  # the edges of a substitution inside double quotes
                cut()
            else:
                current.append(char)
            continue
        if char in "'\"":
            quote = char
            current.append(char)
        elif char in _OPERATORS:
            cut()
        else:
            current.append(char)
    cut()
    return pieces


def _forms(segment: str) -> list[str]:
    forms = [segment, _IFS.sub(" ", segment)]
    try:
        words = shlex.split(_IFS.sub(" ", segment))
    except ValueError:
        words = _IFS.sub(" ", segment).split()
    start = 0
    while start < len(words):
        rest = words[start:]
        forms.append(" ".join(rest))
        program = rest[0].rsplit("/", 1)[-1]
        if program != rest[0]:
            forms.append(" ".join([program, *rest[1:]]))
        if program in _WRAPPERS:
            # ``sudo -u root rm …``: whatever follows a wrapper may be the command it runs; each tail is checked.
            for tail in range(start + 1, len(words)):
                forms.append(" ".join(words[tail:]))
                base = words[tail].rsplit("/", 1)[-1]
                if base != words[tail]:
                    forms.append(" ".join([base, *words[tail + 1:]]))
            break
        if "=" not in program:
            break
        start += 1  # ``VAR=value rm …``: the command after the assignments
    return forms
