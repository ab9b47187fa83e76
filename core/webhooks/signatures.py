"""Signature checks of the three kinds of source (SPEC §17): GitHub's ``X-Hub-Signature-256``, Standard Webhooks
(``webhook-id`` / ``webhook-timestamp`` / ``webhook-signature``) and a bearer token. Every comparison is
constant-time.

The Standard Webhooks check is our own, with an injectable clock; it accepts and refuses exactly what the
reference package (``standardwebhooks.Webhook.verify``) does: tests/test_event_signatures.py compares them on
the same vectors.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import math
from datetime import UTC, datetime, timedelta

STANDARD_TOLERANCE = timedelta(minutes=5)
WHSEC_PREFIX = "whsec_"
MIN_STANDARD_KEY_BYTES = 16


class SignatureRefused(Exception):
    """A delivery whose signature (or timestamp) does not hold: the answer is 401. ``reason`` is the metric's."""

    reason = "signature"


class StaleTimestamp(SignatureRefused):
    """A Standard Webhooks timestamp more than five minutes away from now (either way)."""

    reason = "stale"


class MissingHeaders(SignatureRefused):
    reason = "unsigned"


def verify_github(secret: bytes, body: bytes, header: str | None) -> bool:
    """``X-Hub-Signature-256: sha256=<hex>``, the HMAC-SHA256 of the body with the webhook's secret."""
    if not secret or header is None or not header.startswith("sha256="):
        return False
    expected = "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected.encode(), header.encode("utf-8", "surrogateescape"))


def standard_key(key: str) -> bytes:
    """The signing key of a ``whsec_…`` secret (base64, padded or not), as the reference package decodes it.
    Raises ValueError for an empty key."""
    text = key[len(WHSEC_PREFIX):] if key.startswith(WHSEC_PREFIX) else key
    try:
        decoded = base64.b64decode(text + "==")  # b64decode ignores surplus padding, as the package relies on
    except (binascii.Error, ValueError):
        raise ValueError("the Standard Webhooks key is not base64") from None
    if not decoded:
        raise ValueError("the Standard Webhooks key is empty")
    return decoded


def verify_standard(key: bytes, msg_id: str | None, timestamp: str | None, signatures: str | None, body: bytes,
                    now: datetime) -> None:
    """Raise SignatureRefused unless one of the space-separated ``v1,<base64>`` signatures signs
    ``<id>.<timestamp>.<body>`` with ``key`` and the timestamp is within five minutes of ``now``."""
    if not (msg_id and timestamp and signatures):
        raise MissingHeaders("webhook-id, webhook-timestamp and webhook-signature are required")
    sent_at = _timestamp(timestamp)
    if sent_at < now - STANDARD_TOLERANCE or sent_at > now + STANDARD_TOLERANCE:
        raise StaleTimestamp("the webhook-timestamp is more than 5 minutes away")
    # As the reference does: the timestamp signed is the whole seconds of the parsed value.
    signed = f"{msg_id}.{math.floor(sent_at.timestamp())}.".encode() + body
    expected = ("v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()).encode()
    # Every entry is compared (no early exit on a match): the time taken says nothing about which one held.
    matched = False
    for entry in signatures.split(" "):
        matched |= hmac.compare_digest(expected, entry.encode("utf-8", "surrogateescape"))
    if not matched:
        raise SignatureRefused("no webhook-signature matches")


def _timestamp(header: str) -> datetime:
    try:
        return datetime.fromtimestamp(float(header), tz=UTC)
    except (ValueError, OverflowError, OSError):
        raise SignatureRefused("the webhook-timestamp is not a number of seconds") from None


def verify_bearer(token: str, header: str | None) -> bool:
    """``Authorization: Bearer <token>`` (the scheme in any case), compared in constant time."""
    if not token or header is None:
        return False
    scheme, _, given = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(token.encode(), given.strip().encode("utf-8", "surrogateescape"))


def secret_problem(kind: str, secret: str) -> str | None:
    """What is wrong with a source's secret (``bot doctor``), or None: a GitHub secret is long enough to resist
    guessing, a Standard Webhooks key opens and is long enough too."""
    if kind == "github" and len(secret) < 16:
        return f"a GitHub webhook secret must have at least 16 characters (it has {len(secret)})"
    if kind == "standard":
        try:
            key = standard_key(secret)
        except ValueError as exc:
            return str(exc)
        if len(key) < MIN_STANDARD_KEY_BYTES:  # the senders' keys are 24 to 64 bytes
            return (f"a Standard Webhooks key must decode to at least {MIN_STANDARD_KEY_BYTES} bytes (it has "
                    f"{len(key)})")
    if kind == "bearer" and len(secret) < 16:
        return f"a bearer token should have at least 16 characters (it has {len(secret)})"
    return None
