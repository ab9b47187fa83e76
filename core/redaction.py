"""Masking secrets in text (SPEC §8, §13): stored credentials, what is derived from them, the bot's own.

A value is masked as itself and in the forms a tool or a model is likely to show it in: the value part
of a ``Header: value`` credential, base64 (standard and URL-safe, padded or not, and the part of it
that survives a prefix or suffix such as ``user:`` or a trailing newline), hex (lower and upper),
percent-encoding and a JSON string's escaping.

Beside the masks, ``reading`` is how a reader takes a text in (escapes decoded, case and compatibility forms folded,
only letters and digits kept): what must never keep a secret at all (a memory) is also compared that way, so a
zero-width character, a line break or another case inside a value does not get it kept.

``MaskSet`` is one compiled matcher for a set of values (one regex over a prefix tree of every form,
longest match first); ``StreamMasker`` applies it to text arriving in chunks; ``Redactor`` keeps the
current ``MaskSet`` in memory as a cache of what the database holds, reloaded when a cheap
fingerprint of the stored secrets changes.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import html
import json
import math
import re
import time
import unicodedata
from collections.abc import Awaitable, Callable, Hashable, Iterable
from itertools import groupby
from urllib.parse import quote, quote_plus, unquote

MIN_VALUE_CHARS = 4  # shorter values would mangle ordinary text, and masking them hides little
# Encoded forms look random: a 4-character base64 group occurs by chance in any long base64 blob.
MIN_ENCODED_CHARS = 8
MIN_LINE_CHARS = 16  # one line of a multi-line value (a PEM body line) is masked on its own
MIN_READING_CHARS = 8  # letters and digits of a value compared as read: fewer would match ordinary words by chance
_HEADER_NAME = re.compile(r"[A-Za-z0-9-]{1,64}")
_ESCAPE = re.compile(r"\\u([0-9a-fA-F]{4})|\\x([0-9a-fA-F]{2})")
_WRAP_WIDTHS = (76, 64)  # `base64` and PEM / `openssl base64` wrap their output at these widths


def mask_label(name: str) -> str:
    return f"[redacted:{name}]"


def header_value(value: str) -> str | None:
    """The part sent of a credential that names its header (``X-Api-Key: abc`` → ``abc``), as
    ``CredentialService.headers_for`` reads it."""
    header, sep, rest = value.partition(":")
    if sep and _HEADER_NAME.fullmatch(header) and "\n" not in value:
        return rest.strip()
    return None


def derived_forms(value: str) -> set[str]:
    """Every form of ``value`` to mask, long enough to mask safely."""
    bases = [value]
    sent = header_value(value)
    if sent:
        bases.append(sent)
        scheme, _, token = sent.partition(" ")  # "Authorization: Bearer abc": the token alone too
        if token.strip() and scheme.isalpha():
            bases.append(token.strip())
    forms: set[str] = set()
    for base in bases:
        if len(base) < MIN_VALUE_CHARS:
            continue
        forms.add(base)
        forms.update(_escaped(base))
        forms.update(form for form in _encoded(base.encode()) if len(form) >= MIN_ENCODED_CHARS)
    # A multi-line value (a PEM key) may be shown with other line ends, or in part: each line too.
    forms.update(line.strip() for line in value.splitlines()
                 if len(line.strip()) >= MIN_LINE_CHARS and not line.strip().startswith("-----"))
    return forms


def reading(text: str) -> str:
    """``text`` as a reader takes it in: HTML entities, percent-escapes (either case) and ``\\u``/``\\x`` escapes
    decoded, compatibility forms folded (full-width letters), case folded, and only letters and digits kept (no
    zero-width character, soft hyphen, space or line break between them)."""
    text = _ESCAPE.sub(lambda m: chr(int(m.group(1) or m.group(2), 16)), unquote(html.unescape(text)))
    return "".join(ch for ch in unicodedata.normalize("NFKC", text).casefold() if ch.isalnum())


def _readings(values: Iterable[str]) -> tuple[str, ...]:
    """What each value reads as (``reading``), and the part a credential naming its header sends, when long enough."""
    read: set[str] = set()
    for value in values:
        sent = header_value(value)
        for base in (value, sent) if sent else (value,):
            if len(form := reading(base)) >= MIN_READING_CHARS:
                read.add(form)
    return tuple(sorted(read))


def _escaped(text: str) -> list[str]:
    return [quote(text, safe=""), quote(text), quote_plus(text, safe=""), json.dumps(text)[1:-1]]


def _encoded(raw: bytes) -> list[str]:
    forms = [raw.hex(), raw.hex().upper()]
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        whole = encode(raw).decode()
        forms += [whole, whole.rstrip("=")]
        # Bytes before the secret shift its encoding by 0, 1 or 2 bytes; whatever surrounds it, the
        # groups that hold only the secret's bytes are one of these three.
        for start in range(3):
            inner = raw[start:]
            forms.append(encode(inner[: len(inner) // 3 * 3]).decode())
    aligned = base64.b64encode(raw[: len(raw) // 3 * 3]).decode()
    for width in _WRAP_WIDTHS:
        if len(aligned) > width:
            forms += [aligned[i:i + width] for i in range(0, len(aligned), width)]
    return forms


_PROBE = 16


class MaskSet:
    """An immutable compiled set of masks: ``mask(text)`` replaces every form of every value."""

    def __init__(self, masks: dict[str, str]) -> None:
        self.masks = masks  # form → what replaces it
        self.longest = max(map(len, masks), default=0)
        self.pattern = _compile(list(masks)) if masks else None
        self._sorted = sorted(masks)  # the forms that start with a text follow it at once, in this order

    def could_begin(self, text: str, start: int) -> int:
        """The first position from ``start`` on at which the rest of ``text`` could still be the beginning
        of a form (``len(text)``: none)."""
        forms, end = self._sorted, len(text)
        for at in range(start, end):
            probe = text[at:at + _PROBE]  # most positions fail on a few characters, without copying the rest
            i = bisect.bisect_left(forms, probe)
            if i == len(forms) or not forms[i].startswith(probe):
                continue
            if end - at <= _PROBE:
                return at
            rest = text[at:]
            i = bisect.bisect_left(forms, rest)
            if i < len(forms) and forms[i].startswith(rest):
                return at
        return end

    @classmethod
    def build(cls, named: Iterable[tuple[str, str]], label: Callable[[str], str] = mask_label) -> MaskSet:
        """From (name, value) pairs; a form shared by two values keeps the first one's name."""
        masks: dict[str, str] = {}
        for name, value in named:
            for form in derived_forms(value):
                masks.setdefault(form, label(name))
        return cls(masks)

    def __len__(self) -> int:
        return len(self.masks)

    def mask(self, text: str) -> str:
        if self.pattern is None or not text:
            return text
        return self.pattern.sub(self._replace, text)

    def stream(self) -> StreamMasker:
        return StreamMasker(self)

    def _replace(self, match: re.Match[str]) -> str:
        return self.masks[match.group(0)]


class StreamMasker:
    """Masks text that arrives in chunks (a streamed answer) exactly as masking it whole would.

    It holds back only the tail that could still be the start of a form: from the first position at which
    what has arrived is the beginning of one (never more than ``longest - 1`` characters). Everything
    before that is decided and emitted, masked: a match that starts there can no longer grow."""

    def __init__(self, masks: MaskSet) -> None:
        self._masks = masks
        self._pending = ""

    def feed(self, chunk: str) -> str:
        text = self._pending + chunk
        pattern = self._masks.pattern
        if pattern is None:
            self._pending = ""
            return text
        # A match starting before ``decided`` can see its longest possible form in full; from there on, up to
        # where the rest could still begin a form, none can grow either.
        decided = self._masks.could_begin(text, max(0, len(text) - self._masks.longest + 1))
        out: list[str] = []
        pos = 0
        for match in pattern.finditer(text):
            if match.start() >= decided:
                break
            out += [text[pos:match.start()], self._masks.masks[match.group(0)]]
            pos = match.end()
        cut = max(pos, decided)
        out.append(text[pos:cut])
        self._pending = text[cut:]
        return "".join(out)

    def flush(self) -> str:
        text, self._pending = self._pending, ""
        return self._masks.mask(text)


def _compile(forms: list[str]) -> re.Pattern[str]:
    """One regex over a prefix tree of the forms: at each position the longest form wins, and the
    cost grows with the text, not with the number of forms."""
    try:
        return re.compile(_tree(sorted(set(forms))))
    except (RecursionError, re.error):  # an absurdly deep tree: a flat alternation, longest first
        return re.compile("|".join(map(re.escape, sorted(set(forms), key=len, reverse=True))))


def _tree(words: list[str]) -> str:
    """A regex matching exactly ``words`` (sorted, distinct; "" allowed), greedy: longer first."""
    branches = []
    for _first, group in groupby((w for w in words if w), key=lambda w: w[0]):
        members = list(group)
        prefix = _common_prefix(members[0], members[-1])  # sorted: the ends differ most
        rest = [w[len(prefix):] for w in members]
        branches.append(re.escape(prefix) + (_tree(rest) if rest != [""] else ""))
    if not branches:
        return ""
    body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
    if "" in words:  # a shorter form ends here: try the longer ones first, then stop
        return f"(?:{body})?"
    return body


def _common_prefix(first: str, last: str) -> str:
    size = 0
    for a, b in zip(first, last, strict=False):
        if a != b:
            break
        size += 1
    return first[:size]


Loader = Callable[[], Awaitable[list[tuple[str, str]]]]
Fingerprint = Callable[[], Awaitable[Hashable]]


class Redactor:
    """The masks in effect in this process: a cache of the stored secrets plus fixed ones (settings).

    The database holds the state. The compiled masks are rebuilt when a secret is stored here
    (``learn``), and reloaded when the stored secrets' fingerprint changes (another replica, the CLI):
    ``check`` compares it (one small query), at every turn's start and at most every
    ``check_every_s`` seconds while text is masked."""

    def __init__(self, load: Loader, fingerprint: Fingerprint, *, check_every_s: float = 5.0,
                 sink: Callable[[str], None] | None = None) -> None:
        self._load = load
        self._fingerprint = fingerprint
        self.check_every_s = check_every_s
        self.sink = sink  # learns each value too (the log filter)
        self._static: list[tuple[str, str]] = []
        self._stored: list[tuple[str, str]] = []
        self._learned: list[tuple[int, str, str]] = []  # (generation, name, value) not yet seen loaded
        self._generation = 0
        self._seen: object = _NEVER  # the fingerprint the stored values were loaded at
        self._checked = -math.inf
        self._told: set[str] = set()
        self._lock = asyncio.Lock()
        self._masks = MaskSet({})
        self._readings: tuple[str, ...] = ()  # each value as read (``reading``)
        self.version = 0  # counts the masks' rebuilds: what was masked with older ones is stale
        self.loads = 0  # how often the stored secrets were decrypted (they are not, per call)

    def add_static(self, named: Iterable[tuple[str, str]]) -> None:
        """Secrets that are not stored (the bot's settings), masked for the process's life."""
        self._static += [(name, value) for name, value in named if value]
        self._rebuild()

    def learn(self, name: str, value: str) -> None:
        """A secret stored in this process: masked from now on (the hook credentials call)."""
        self._generation += 1
        self._learned.append((self._generation, name, value))
        self._rebuild()
        self._tell([value])

    async def check(self, fingerprint: object = None) -> None:
        """Reload the stored secrets if their fingerprint changed. ``fingerprint``: read by the caller just
        now (with a turn's start), so it is not read again here."""
        asked = time.monotonic()
        if fingerprint is not None and fingerprint == self._seen:
            return  # current as of the caller's read (not counted as a check of ours: the periodic one stays due)
        async with self._lock:
            if self._checked >= asked:  # someone else checked while this one waited
                return
            self._checked = time.monotonic()
            generation = self._generation
            if fingerprint is None:
                fingerprint = await self._fingerprint()
            if fingerprint == self._seen:
                return
            stored = await self._load()
            self.loads += 1
            self._stored, self._seen = stored, fingerprint
            # What was learnt before this load is in it (or was deleted since); later ones stay.
            self._learned = [entry for entry in self._learned if entry[0] > generation]
            self._rebuild()
            self._tell([value for _name, value in stored])

    async def redact(self, text: str) -> str:
        if time.monotonic() - self._checked >= self.check_every_s:
            await self.check()
        return self._masks.mask(text)

    def mask(self, text: str) -> str:
        """With the masks as they are now (no database access)."""
        return self._masks.mask(text)

    async def holds_secret(self, text: str) -> bool:
        """Whether ``text`` holds a secret's value: in a form the masks know, or as a reader takes it in
        (``reading``: another case, a zero-width character or a line break inside, full-width letters, escapes)."""
        return await self.redact(text) != text or self.reads_as_secret(text)

    def reads_as_secret(self, text: str) -> bool:
        """Whether a secret's value is in ``text`` as a reader takes it in (with the values as they are now)."""
        if not self._readings:
            return False
        read = reading(text)
        return any(value in read for value in self._readings)

    def stream(self) -> StreamMasker:
        return self._masks.stream()

    def _rebuild(self) -> None:
        learned = [(name, value) for _g, name, value in self._learned]
        named = self._stored + learned + self._static
        self._masks = MaskSet.build(named)
        self._readings = _readings(value for _name, value in named)
        self.version += 1

    def _tell(self, values: list[str]) -> None:
        for value in values:
            if self.sink is not None and value not in self._told:
                self._told.add(value)
                self.sink(value)


_NEVER = object()
