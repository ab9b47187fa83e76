"""Logging: one line per event, text or JSON, stamped in UTC, with every known secret value masked."""

from __future__ import annotations

import json
import logging
import math
import re
import sys
import time
from collections.abc import Iterable

from core.logcontext import ContextFilter
from core.redaction import MaskSet

# Slack tokens (bot, user, app, refresh) have a recognisable shape even when not configured here.
_TOKEN_SHAPES = re.compile(r"\b(xox[abeposr]|xapp)-[A-Za-z0-9-]{8,}")


# Far below the 4300 digits Python refuses to turn into text, far above any count or id a log line carries.
_INT_BITS = 1024
# What json.dumps(ensure_ascii=False) leaves raw although it is a line break to some readers (U+2028, U+2029, NEL:
# str.splitlines(), JavaScript-era parsers, some log viewers) or a terminal control (DEL, the C1 set: U+009B is CSI):
# a person's text in a field must not start a line of its own or reach `kubectl logs` on a terminal as an escape.
_RAW_IN_JSON = re.compile("[\x7f-\x9f\u2028\u2029]")


def _json_escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def _label(_name: str) -> str:
    return "[redacted]"


# What every record has; anything else on a record came from ``extra=`` (session_id and turn_id: ContextFilter).
_RECORD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message", "asctime", "taskName", "session_id", "turn_id"}


def extra_fields(record: logging.LogRecord) -> dict[str, object]:
    """The fields a log call passed with ``extra=``."""
    return {key: value for key, value in vars(record).items() if key not in _RECORD_ATTRIBUTES}


class RedactingFilter(logging.Filter):
    """Masks configured secret values with their derived forms (a header's value, base64, hex,
    URL-encoded: see core.redaction), and anything shaped like a Slack token, in message and args."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self._secrets: list[str] = []
        self._masks: MaskSet | None = None
        for secret in secrets:
            self.add(secret)

    def add(self, secret: str) -> None:
        if secret and secret not in self._secrets:
            self._secrets.append(secret)
            self._masks = None  # compiled again at the next line, once for a whole batch of additions

    def redact(self, text: str) -> str:
        masks = self._masks
        if masks is None:
            masks = self._masks = MaskSet.build([("", s) for s in tuple(self._secrets)], label=_label)
        return _TOKEN_SHAPES.sub(r"\1-[redacted]", masks.mask(text))

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed call (wrong number of %-args) must not raise where it logs
            message = f"{record.msg} [unformattable args: {record.args!r}]"
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        record.msg = self.redact(message)
        record.args = None
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        for key, value in extra_fields(record).items():  # a field is written as it is given: masked the same
            setattr(record, key, self._redact_value(value))
        return True

    def _redact_value(self, value: object) -> object:
        """``value`` with the secrets in its text masked; numbers and booleans kept, anything else as text."""
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, float):  # JSON has no NaN or Infinity: a line holding one is not JSON
            return value if math.isfinite(value) else str(value)
        if isinstance(value, int):  # past Python's digit limit json.dumps raises, and the whole line is lost
            return value if value.bit_length() <= _INT_BITS else f"[int of {value.bit_length()} bits]"
        if isinstance(value, dict):
            return {self.redact(str(k)): self._redact_value(v) for k, v in value.items()}
        if isinstance(value, list | tuple | set | frozenset):
            return [self._redact_value(v) for v in value]
        return self.redact(value if isinstance(value, str) else str(value))


# Libraries whose INFO lines would drown ours, and the model SDKs, whose INFO lines name the endpoint's URL and
# whose DEBUG lines hold the whole prompt.
QUIET_LIBRARIES = ("aiohttp.access", "slack_bolt", "slack_sdk", "httpx", "httpx2", "openai", "anthropic", "alembic",
                   "apscheduler")


class QuietLibrariesFilter(logging.Filter):
    """Below WARNING, nothing from ``QUIET_LIBRARIES`` is written, whatever level their loggers were given
    later: the model SDKs set their own at import from ``ANTHROPIC_LOG`` / ``OPENAI_LOG`` (``debug`` logs
    every request's body), and they are imported after logging is configured."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        name = record.name
        return not any(name == lib or name.startswith(lib + ".") for lib in QUIET_LIBRARIES)


class UtcFormatter(logging.Formatter):
    """Times in UTC, RFC 3339 with milliseconds (``2026-12-05T08:16:33.123Z``): replicas in different zones, and a
    log collector, read the same instant."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


_JSON_FIELDS = frozenset({"ts", "level", "logger", "msg", "session_id", "turn_id", "exc"})


class JsonFormatter(UtcFormatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": self.formatTime(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in ("session_id", "turn_id"):
            value = getattr(record, key, None)
            if value is not None:
                entry[key] = value
        if record.exc_text:
            entry["exc"] = record.exc_text
        for key, value in extra_fields(record).items():  # never in place of the fields above
            entry[f"extra_{key}" if key in _JSON_FIELDS else key] = value
        # Only inside strings can these characters be (everything else json.dumps writes is ASCII): escaping them
        # there keeps the value, and the line one line of strict JSON.
        return _RAW_IN_JSON.sub(_json_escape, json.dumps(entry, ensure_ascii=False, default=str))


class TextFormatter(UtcFormatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        session, turn = getattr(record, "session_id", None), getattr(record, "turn_id", None)
        if session is not None:
            line += f" [session={session}" + (f" turn={turn}]" if turn is not None else "]")
        return line


def configure_logging(level: str, fmt: str, secrets: Iterable[str]) -> RedactingFilter:
    handler = logging.StreamHandler(sys.stderr)
    redactor = RedactingFilter(secrets)
    handler.addFilter(QuietLibrariesFilter())
    handler.addFilter(ContextFilter())
    handler.addFilter(redactor)
    handler.setFormatter(
        JsonFormatter() if fmt == "json" else TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # Also held at WARNING where they log, so their records are not even made; the handler's filter is what
    # holds when a library raises its own level afterwards.
    for noisy in QUIET_LIBRARIES:
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLevelName(level)))
    return redactor
