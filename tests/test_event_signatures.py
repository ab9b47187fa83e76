"""Signature checks of events in (core.webhooks.signatures) and thread keys (core.webhooks.thread_key).

Our Standard Webhooks verifier takes its clock as an argument; the reference package reads the system's. The
differential test runs both on the same vectors at the same moment (timestamps far enough from the tolerance's
edge that the calls' few microseconds apart cannot change a verdict) and requires the same verdict on each."""

from __future__ import annotations

import base64
import hashlib
import hmac
import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from core.webhooks.signatures import (
    SignatureRefused,
    StaleTimestamp,
    standard_key,
    verify_bearer,
    verify_github,
    verify_standard,
)
from core.webhooks.thread_key import render_thread_key, template_problem

KEY_BYTES = b"0123456789abcdef0123456789abcdef"
KEY = "whsec_" + base64.b64encode(KEY_BYTES).decode()  # "…ZWY=": padded
UNPADDED = "whsec_" + base64.b64encode(b"the key of 31 bytes, unpadded!!").decode().rstrip("=")
BODY = b'{"type":"invoice.paid","data":{"id":"in_1"}}'


def sign(key: bytes, msg_id: str, timestamp: str, body: bytes) -> str:
    digest = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def vectors(now: datetime) -> list[tuple[str, str, dict[str, str], bytes]]:
    """(name, key, headers, body): what a sender might send, good and bad."""
    ts = str(int(now.timestamp()))
    good = sign(KEY_BYTES, "msg_1", ts, BODY)
    other = sign(b"another key entirely", "msg_1", ts, BODY)

    def headers(msg_id: str | None = "msg_1", stamp: str | None = ts, signature: str | None = good) -> dict[str, str]:
        found = {"webhook-id": msg_id, "webhook-timestamp": stamp, "webhook-signature": signature}
        return {k: v for k, v in found.items() if v is not None}

    def at(offset_s: int) -> dict[str, str]:
        stamp = str(int(now.timestamp()) + offset_s)
        return headers(stamp=stamp, signature=sign(KEY_BYTES, "msg_1", stamp, BODY))

    unpadded_key = standard_key(UNPADDED)
    return [
        ("valid", KEY, headers(), BODY),
        ("valid, key without prefix", KEY.removeprefix("whsec_"), headers(), BODY),
        ("valid, unpadded key", UNPADDED, headers(signature=sign(unpadded_key, "msg_1", ts, BODY)), BODY),
        ("several signatures, one good", KEY, headers(signature=f"{other} {good} v1,AAAA"), BODY),
        ("several signatures, none good", KEY, headers(signature=f"{other} v1,AAAA"), BODY),
        ("wrong key", KEY, headers(signature=other), BODY),
        ("tampered body", KEY, headers(), BODY.replace(b"in_1", b"in_2")),
        ("tampered id", KEY, headers(msg_id="msg_2"), BODY),
        ("tampered timestamp", KEY, headers(stamp=str(int(ts) + 1)), BODY),
        ("stale beyond 5 min", KEY, at(-330), BODY),
        ("future beyond 5 min", KEY, at(330), BODY),
        ("old within 5 min", KEY, at(-270), BODY),
        ("future within 5 min", KEY, at(270), BODY),
        ("missing id", KEY, headers(msg_id=None), BODY),
        ("missing timestamp", KEY, headers(stamp=None), BODY),
        ("missing signature", KEY, headers(signature=None), BODY),
        ("empty signature", KEY, headers(signature=""), BODY),
        ("non-numeric timestamp", KEY, headers(stamp="yesterday"), BODY),
        ("timestamp nan", KEY, headers(stamp="nan"), BODY),
        ("timestamp inf", KEY, headers(stamp="inf"), BODY),
        ("timestamp huge", KEY, headers(stamp="9" * 40), BODY),
        ("fractional timestamp, signed whole", KEY, headers(stamp=f"{ts}.7"), BODY),
        ("timestamp with spaces", KEY, headers(stamp=f" {ts} "), BODY),
        ("signature without version", KEY, headers(signature=good.removeprefix("v1,")), BODY),
        ("signature of another version", KEY, headers(signature="v2," + good.removeprefix("v1,")), BODY),
        ("signature with a trailing space", KEY, headers(signature=good + " "), BODY),
        ("signature separated by two spaces", KEY, headers(signature=f"{other}  {good}"), BODY),
        ("body not UTF-8", KEY, headers(signature=sign(KEY_BYTES, "msg_1", ts, b"\xff\xfe")), b"\xff\xfe"),
        ("empty body", KEY, headers(signature=sign(KEY_BYTES, "msg_1", ts, b"")), b""),
    ]


def reference_accepts(key: str, headers: dict[str, str], body: bytes) -> bool:
    from standardwebhooks.webhooks import Webhook, WebhookVerificationError

    try:
        Webhook(key).verify(body, headers, json_parse=False)
    except WebhookVerificationError:
        return False
    return True


def ours_accepts(key: str, headers: dict[str, str], body: bytes, now: datetime) -> bool:
    try:
        verify_standard(standard_key(key), headers.get("webhook-id"), headers.get("webhook-timestamp"),
                        headers.get("webhook-signature"), body, now)
    except SignatureRefused:
        return False
    return True


def test_our_standard_verifier_agrees_with_the_reference_package() -> None:
    pytest.importorskip("standardwebhooks")
    now = datetime.now(UTC)
    verdicts = {name: (ours_accepts(key, headers, body, datetime.now(UTC)), reference_accepts(key, headers, body))
                for name, key, headers, body in vectors(now)}
    disagree = {name: v for name, v in verdicts.items() if v[0] != v[1]}
    assert disagree == {}
    accepted = {name for name, (ours, _) in verdicts.items() if ours}
    assert accepted == {"valid", "valid, key without prefix", "valid, unpadded key", "several signatures, one good",
                        "old within 5 min", "future within 5 min", "fractional timestamp, signed whole",
                        "timestamp with spaces", "signature with a trailing space", "signature separated by two spaces",
                        "body not UTF-8", "empty body"}


@pytest.mark.parametrize("key", ["", "whsec_", "whsec_===="])
def test_an_empty_key_is_refused_by_both(key: str) -> None:
    pytest.importorskip("standardwebhooks")
    from standardwebhooks.webhooks import EmptyWebhookSecretError, Webhook

    with pytest.raises(ValueError):
        standard_key(key)
    with pytest.raises(EmptyWebhookSecretError):
        Webhook(key)


def test_the_clock_is_ours_to_give() -> None:
    """A delivery signed an hour ago verifies at that hour and is stale now: the tolerance is both ways, 5 minutes."""
    then = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    stamp = str(int(then.timestamp()))
    signature = sign(KEY_BYTES, "m", stamp, BODY)
    key = standard_key(KEY)
    verify_standard(key, "m", stamp, signature, BODY, then + timedelta(seconds=300))
    verify_standard(key, "m", stamp, signature, BODY, then - timedelta(seconds=300))
    for off in (301, -301, 3600):
        with pytest.raises(StaleTimestamp):
            verify_standard(key, "m", stamp, signature, BODY, then + timedelta(seconds=off))
    # Stale is said before the signature is looked at: a stale forged delivery is refused as stale.
    with pytest.raises(StaleTimestamp):
        verify_standard(key, "m", stamp, "v1,forged", BODY, then + timedelta(hours=1))
    assert math.floor(then.timestamp()) == int(stamp)


def test_github_signature() -> None:
    secret = b"a github secret of some length"
    good = "sha256=" + hmac.new(secret, BODY, hashlib.sha256).hexdigest()
    assert verify_github(secret, BODY, good)
    assert not verify_github(secret, BODY + b" ", good)
    assert not verify_github(b"another secret", BODY, good)
    assert not verify_github(secret, BODY, None)
    assert not verify_github(secret, BODY, good.upper())  # GitHub sends lower-case hex
    assert not verify_github(secret, BODY, good.replace("sha256=", "sha1="))
    assert not verify_github(secret, BODY, "sha256=")
    assert not verify_github(b"", BODY, "sha256=" + hmac.new(b"", BODY, hashlib.sha256).hexdigest())
    assert not verify_github(secret, BODY, good + "\udcff")  # a header's undecodable byte: refused, no error


def test_bearer_token() -> None:
    assert verify_bearer("tok-123", "Bearer tok-123")
    assert verify_bearer("tok-123", "bearer  tok-123 ")
    assert not verify_bearer("tok-123", "Bearer tok-1234")
    assert not verify_bearer("tok-123", "Basic tok-123")
    assert not verify_bearer("tok-123", "tok-123")
    assert not verify_bearer("tok-123", None)
    assert not verify_bearer("", "Bearer ")
    assert not verify_bearer("tok-123", "Bearer tok-\udcff")


PAYLOAD: dict[str, Any] = {
    "repository": {"full_name": "acme/api"}, "pull_request": {"number": 42, "merged": False},
    "commits": [{"id": "abc"}, {"id": "def"}], "labels": None, "ratio": 0.5, "nested": {"a": {"b": "deep"}},
    "text": "  line one\nline two\u0000\ud800  ",
}


@pytest.mark.parametrize(("template", "key"), [
    ("{repository.full_name}#{pull_request.number}", "acme/api#42"),
    ("{commits.1.id}", "def"),
    ("{pull_request.merged}", "false"),
    ("{nested.a.b}/{missing.field}", "deep/"),
    ("{ratio}{labels}{nested}{commits}", None),  # floats, null, objects and lists render empty: nothing left
    ("{commits.9.id}{commits.x}", None),
    ("{text}", "line oneline two"),  # printable characters only
    ("pr-{pull_request.number}", "pr-42"),
    ("", None),
    (None, None),
])
def test_thread_keys(template: str | None, key: str | None) -> None:
    assert render_thread_key(template, PAYLOAD) == key


def test_thread_keys_are_capped() -> None:
    assert render_thread_key("{a}", {"a": "x" * 1000}) == "x" * 255
    assert render_thread_key("{a}", {"a": 10 ** 100}) is None  # not an id: and str() of a huge int raises
    assert render_thread_key("{a}", [1]) is None


@pytest.mark.parametrize(("template", "fine"), [
    ("{a.b}-{c}", True), ("plain text", True), ("{a.0.b}", True),
    ("{", False), ("}", False), ("{}", False), ("{a b}", False), ("{a..b}", False), ("{{a}}", False),
])
def test_thread_templates(template: str, fine: bool) -> None:
    assert (template_problem(template) is None) is fine
