"""Log redaction and formats (bot/logs.py, SPEC §13: tokens and secrets never appear in logs)."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from bot.logs import JsonFormatter, RedactingFilter, configure_logging

SECRET = "s3cr3t-signing-value"
BOT_TOKEN = "xoxb-1234567890-abcdefghij"
APP_TOKEN = "xapp-1-A0123-4567-deadbeef"


@pytest.fixture
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def capture(fmt: str = "text", secrets: tuple[str, ...] = (SECRET,)) -> tuple[logging.Logger, io.StringIO]:
    """A logger whose handler carries the redacting filter, writing into a buffer."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactingFilter(secrets))
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter("%(message)s"))
    logger = logging.getLogger(f"test.redact.{fmt}.{id(stream)}")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    return logger, stream


def test_secret_in_message_redacted() -> None:
    logger, out = capture()
    logger.info(f"signing with {SECRET} now")
    assert SECRET not in out.getvalue()
    assert "signing with [redacted] now" in out.getvalue()


def test_secret_in_args_redacted() -> None:
    logger, out = capture()
    logger.warning("config: %s / %r", SECRET, {"key": SECRET})
    assert SECRET not in out.getvalue()
    assert out.getvalue().count("[redacted]") == 2


@pytest.mark.parametrize("token", [BOT_TOKEN, APP_TOKEN, "xoxp-999999999-user-token", "xoxa-2-abcdefgh12"])
def test_token_shapes_redacted_without_configuration(token: str) -> None:
    logger, out = capture(secrets=())
    logger.info("token=%s", token)
    text = out.getvalue()
    assert token not in text
    assert token.split("-")[0] + "-[redacted]" in text


def test_short_prefix_words_not_redacted() -> None:
    logger, out = capture(secrets=())
    logger.info("xoxb- prefix and xapp-short are fine")
    assert "xoxb- prefix and xapp-short are fine" in out.getvalue()


def test_exception_traceback_redacted() -> None:
    logger, out = capture()
    try:
        raise RuntimeError(f"auth failed for {BOT_TOKEN} with {SECRET}")
    except RuntimeError:
        logger.exception("call failed")
    text = out.getvalue()
    assert "Traceback" in text and "RuntimeError" in text
    assert BOT_TOKEN not in text
    assert SECRET not in text


def test_longest_secret_replaced_first() -> None:
    redactor = RedactingFilter(["abcd", "abcdefgh"])
    assert redactor.redact("x abcdefgh y") == "x [redacted] y"


def test_added_secret_redacted() -> None:
    redactor = RedactingFilter()
    redactor.add("late-secret-123")
    assert redactor.redact("v=late-secret-123") == "v=[redacted]"


def test_json_one_object_per_line() -> None:
    logger, out = capture("json")
    logger.info("first %s", SECRET)
    logger.warning("second\nwith a newline")
    try:
        raise ValueError(APP_TOKEN)
    except ValueError:
        logger.error("third", exc_info=True)
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    entries = [json.loads(line) for line in lines]
    assert [e["level"] for e in entries] == ["info", "warning", "error"]
    assert entries[0]["msg"] == "first [redacted]"
    assert entries[1]["msg"] == "second\nwith a newline"
    assert "ValueError" in entries[2]["exc"] and APP_TOKEN not in entries[2]["exc"]
    assert all({"ts", "level", "logger", "msg"} <= e.keys() for e in entries)


def test_configure_logging_installs_redacting_handler(
    restore_root: None, capsys: pytest.CaptureFixture[str]
) -> None:
    redactor = configure_logging("INFO", "json", [SECRET])
    root = logging.getLogger()
    assert len(root.handlers) == 1
    assert redactor in root.handlers[0].filters
    assert root.level == logging.INFO
    assert logging.getLogger("slack_sdk").level == logging.WARNING
    # The model SDKs' lines name LLM_BASE_URL (INFO) and hold the whole prompt (DEBUG).
    assert all(logging.getLogger(name).level == logging.WARNING for name in ("httpx", "httpx2", "openai", "anthropic"))
    logging.getLogger("bot.test").info("key %s and %s", SECRET, BOT_TOKEN)
    logging.getLogger("bot.test").debug("hidden")
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1
    entry = json.loads(lines[0])
    assert entry["logger"] == "bot.test"
    assert SECRET not in err and BOT_TOKEN not in err


@pytest.mark.parametrize(("sdk", "variable"), [("anthropic", "ANTHROPIC_LOG")])
def test_an_sdks_own_debug_setting_never_writes_the_prompt(
    sdk: str, variable: str, restore_root: None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The SDK reads its variable when it is imported, which happens after logging is configured (the provider
    # is built later, doctor imports it lazily): its setup then sets its loggers to DEBUG.
    import importlib

    levels = {name: logging.getLogger(name).level for name in (sdk, "httpx", "httpx2")}
    configure_logging("DEBUG", "text", [SECRET])
    monkeypatch.setenv(variable, "debug")
    try:
        importlib.import_module(f"{sdk}._utils._logs").setup_logging()
        assert logging.getLogger(sdk).level == logging.DEBUG  # what the SDK did
        logging.getLogger(f"{sdk}._base_client").debug("Request options: %s", {"json_data": "the whole prompt"})
        logging.getLogger("httpx2").info("HTTP Request: POST https://llm.internal/v1 200")
        logging.getLogger(f"{sdk}._base_client").warning("retrying")
        logging.getLogger("bot.test").debug("ours")
        err = capsys.readouterr().err
        assert "the whole prompt" not in err and "llm.internal" not in err
        assert "retrying" in err and "ours" in err
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def test_configure_logging_text_format(restore_root: None, capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("DEBUG", "text", [SECRET])
    logging.getLogger("bot.test").debug("value %s", SECRET)
    err = capsys.readouterr().err
    assert "DEBUG bot.test: value [redacted]" in err


def test_malformed_log_call_does_not_raise(capsys: pytest.CaptureFixture[str]) -> None:
    logger, out = capture()
    logger.info("two %s %s", SECRET)  # a bug in a log line must not break the code that logs...
    logger.info("still logging %s", SECRET)
    # ...nor lose the line, nor leak what it was given (logging's own "--- Logging error ---" report
    # would do both).
    assert out.getvalue().splitlines() == ["two %s %s [unformattable args: ('[redacted]',)]",
                                           "still logging [redacted]"]
    assert "Logging error" not in capsys.readouterr().err


def test_lines_carry_the_session_and_turn(restore_root: None, capsys: pytest.CaptureFixture[str]) -> None:
    import json as _json

    from core import logcontext

    configure_logging("INFO", "json", ["xoxb-hidden-token-1234"])
    token_s, token_t = logcontext.session_id.set("slack:T1:C1:1.0"), logcontext.turn_id.set(7)
    try:
        logging.getLogger("core.dispatcher").info("turn %s started with xoxb-hidden-token-1234", 7)
    finally:
        logcontext.session_id.reset(token_s)
        logcontext.turn_id.reset(token_t)
    line = _json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert (line["session_id"], line["turn_id"]) == ("slack:T1:C1:1.0", 7)
    assert "xoxb-hidden-token-1234" not in line["msg"] and "[redacted]" in line["msg"]


def test_json_lines_are_stamped_in_utc_with_milliseconds(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    monkeypatch.setenv("TZ", "America/New_York")  # the host's zone must not show
    time.tzset()
    try:
        logger, out = capture("json")
        record = logger.makeRecord(logger.name, logging.INFO, __file__, 1, "at a known instant", (), None)
        record.created, record.msecs = 1_796_372_193.1234, 123.0  # 2026-12-04T08:16:33.123Z
        logger.handle(record)
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    assert json.loads(out.getvalue())["ts"] == "2026-12-04T08:16:33.123Z"


def test_text_lines_are_stamped_in_utc_with_a_zone(restore_root: None, capsys: pytest.CaptureFixture[str]) -> None:
    import re

    configure_logging("INFO", "text", [SECRET])
    logging.getLogger("bot.test").info("hello")
    line = capsys.readouterr().err.strip()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z INFO bot.test: hello", line), line


def test_extra_fields_are_json_keys_with_secrets_masked() -> None:
    from pathlib import Path

    logger, out = capture("json")
    logger.info("delivered", extra={"channel": "C1", "attempts": 3, "ok": True, "url": f"https://x/?t={SECRET}",
                                    "headers": {"Authorization": f"Bearer {BOT_TOKEN}"}, "ids": (1, SECRET),
                                    "path": Path("/tmp/a"), "level": "not the level"})
    entry = json.loads(out.getvalue())
    assert entry["channel"] == "C1" and entry["attempts"] == 3 and entry["ok"] is True
    assert entry["url"] == "https://x/?t=[redacted]"
    assert entry["headers"] == {"Authorization": "Bearer xoxb-[redacted]"}
    assert entry["ids"] == [1, "[redacted]"] and entry["path"] == "/tmp/a"
    assert (entry["level"], entry["extra_level"]) == ("info", "not the level")  # a field of ours is never replaced
    assert SECRET not in out.getvalue() and BOT_TOKEN not in out.getvalue()
