"""Files shared with a message, read when a turn takes it: images go to the model as image inputs, text files
as text, anything else is named but not read. The person is told plainly what could not be read.

What a file *is* is decided from its bytes, not from the name or type the sender gave it: an image must
begin like one, and text must decode as UTF-8 without NUL bytes. Limits keep one message from filling the
conversation: each file's size, the images per message, the text per message, and one deadline for all.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import re
from dataclasses import dataclass, field

from core.errors import FetchFailed, FileTooBig
from core.model import Attachment, SessionInfo
from core.ports import Ports

log = logging.getLogger(__name__)

TEXT_MAX_BYTES = 100_000  # one text file
TEXT_MAX_CHARS = 40_000  # all text files of one message together (a typed message's own limit)
IMAGE_MAX_BYTES = 5_000_000  # one image (IMAGE_MAX_BYTES)
IMAGES_MAX = 4  # images of one message given to the model
READ_DEADLINE_S = 60.0  # for all files of one message
# What an image must begin with, by type: the model gets only these (png, jpeg, gif, webp).
_IMAGE_MAGIC = {"image/png": (b"\x89PNG\r\n\x1a\n",), "image/jpeg": (b"\xff\xd8\xff",),
                "image/gif": (b"GIF87a", b"GIF89a"), "image/webp": (b"RIFF",)}
_TEXT_TYPES = {"application/json", "application/xml", "application/x-yaml", "application/yaml", "application/toml",
               "application/x-sh", "application/javascript", "application/sql", "application/x-python",
               "application/csv", "application/x-ndjson"}
_TEXT_SUFFIXES = {".txt", ".md", ".log", ".json", ".yaml", ".yml", ".toml", ".ini", ".cfg", ".conf", ".csv",
                  ".tsv", ".xml", ".sh", ".py", ".js", ".ts", ".go", ".rs", ".java", ".rb", ".sql", ".diff",
                  ".patch", ".tf", ".hcl", ".css"}
_NOT_READ = {"text/html"}  # a web page: not worth the model's time (and Slack's sign-in page looks the same)


@dataclass
class ReadFiles:
    images: list[str] = field(default_factory=list)  # data: URIs
    texts: list[str] = field(default_factory=list)  # what the model is told: each file's text or why not
    problems: list[str] = field(default_factory=list)  # said to the person

    @property
    def text(self) -> str:
        return "\n\n".join(self.texts)


class AttachmentReader:
    def __init__(self, ports: Ports, *, image_max_bytes: int = IMAGE_MAX_BYTES,
                 text_max_bytes: int = TEXT_MAX_BYTES) -> None:
        self.ports = ports
        self.image_max_bytes = image_max_bytes
        self.text_max_bytes = text_max_bytes

    async def read(self, session: SessionInfo, attachments: tuple[Attachment, ...]) -> ReadFiles:
        read = ReadFiles()
        chars = done = 0
        try:
            async with asyncio.timeout(READ_DEADLINE_S):
                for item in attachments:
                    try:
                        chars += await self._one(session, item, read, chars)
                    except FetchFailed as exc:
                        self._cannot(read, item, str(exc))
                    except Exception as exc:  # one odd file never fails the turn
                        log.exception("reading a shared file failed")
                        self._cannot(read, item, f"reading it failed ({type(exc).__name__})")
                    done += 1
        except TimeoutError:
            for item in attachments[done:]:
                self._cannot(read, item, f"reading the files took longer than {READ_DEADLINE_S:.0f} s")
        return read

    async def _one(self, session: SessionInfo, item: Attachment, read: ReadFiles, chars: int) -> int:
        """Read one file into ``read``; the characters of text it added."""
        kind = _kind(item)
        if kind is None:
            read.texts.append(f"[{_label(item)} was shared; it is not an image or a text file, so it was not read]")
            return 0
        if kind == "image" and len(read.images) >= IMAGES_MAX:
            self._cannot(read, item, f"only {IMAGES_MAX} images of one message are looked at")
            return 0
        limit = self.image_max_bytes if kind == "image" else self.text_max_bytes
        if item.size is not None and item.size > limit:
            raise FetchFailed(_too_big(item.size, limit, kind))
        port = self.ports.find(session.channel)
        if port is None:
            raise FetchFailed(f"the {session.channel} channel cannot fetch files")
        try:
            content = await port.fetch_file(item.source, limit)
        except FileTooBig:
            raise FetchFailed(_too_big(None, limit, kind)) from None
        if kind == "image":
            image = _image(content)
            if image is None:
                raise FetchFailed("its content is not a png, jpeg, gif or webp image")
            read.images.append(image)
            read.texts.append(f"[{_label(item)} was shared; the image is attached]")
            return 0
        text = _text(content)
        if text is None:
            raise FetchFailed("its content is not UTF-8 text")
        room = TEXT_MAX_CHARS - chars
        if room <= 0:
            raise FetchFailed(f"the files of one message are read up to {TEXT_MAX_CHARS:,} characters in all")
        if len(text) > room:
            read.problems.append(f"I read only the first {room:,} characters of {_plain(item.name)}: the files of one "
                                 f"message are read up to {TEXT_MAX_CHARS:,} characters in all.")
            text = text[:room] + "\n[…cut here]"
        fence = "`" * max(3, _longest_backticks(text) + 1)
        read.texts.append(f"[{_label(item)}]\n{fence}\n{text}\n{fence}")
        return min(len(text), room)

    @staticmethod
    def _cannot(read: ReadFiles, item: Attachment, why: str) -> None:
        log.info("shared file not read (%r): %s", item.mimetype, why)
        read.problems.append(f"I couldn't read the file {_plain(item.name)}: {why}.")
        read.texts.append(f"[{_label(item)} was shared but could not be read: {why}]")


def _kind(item: Attachment) -> str | None:
    mimetype = item.mimetype.lower()
    if mimetype in _IMAGE_MAGIC:
        return "image"
    if mimetype in _NOT_READ:
        return None
    name = item.name.lower()
    if mimetype.startswith("text/") or mimetype in _TEXT_TYPES or any(name.endswith(s) for s in _TEXT_SUFFIXES):
        return "text"
    return None


def _image(content: bytes) -> str | None:
    """A data: URI, if the bytes are an image of a type the model takes (whatever type was declared)."""
    for mimetype, magics in _IMAGE_MAGIC.items():
        if any(content.startswith(m) for m in magics) and (mimetype != "image/webp" or content[8:12] == b"WEBP"):
            return f"data:{mimetype};base64,{base64.b64encode(content).decode('ascii')}"
    return None


def _text(content: bytes) -> str | None:
    if b"\x00" in content:
        return None
    try:
        return content.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _longest_backticks(text: str) -> int:
    return max((len(run) for run in re.findall(r"`+", text)), default=0)


def _too_big(size: int | None, limit: int, kind: str) -> str:
    what = "images" if kind == "image" else "text files"
    return f"it is {_size(size)}, over the {_size(limit)} limit for {what}" if size is not None else (
        f"it is over the {_size(limit)} limit for {what}")


def _plain(name: str) -> str:
    """A file name as a notice shows it: letters, digits and ``._- ()`` only, in code (no markup, no link,
    no mention)."""
    kept = "".join(c if c.isalnum() or c in "._- ()" else "_" for c in name)[:80]
    return f"`{kept or '(unnamed)'}`"


def _label(item: Attachment) -> str:
    return f"file {item.name!r} ({item.mimetype or 'unknown type'!r})"


def _size(n: int) -> str:
    return f"{n / 1_000_000:.1f} MB" if n >= 1_000_000 else f"{n / 1000:.0f} KB"
