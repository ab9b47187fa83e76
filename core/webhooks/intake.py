"""A delivery to ``POST /events/<source>``, decided (SPEC §17): which source, whether it is signed, what event it
is, whether the source's filter takes it, its thread key; stored (rate, dedupe) before the answer. Every answer's
status is decided here, and bad input never raises: the HTTP handler only passes bytes in and the answer out."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from core.clock import Clock
from core.webhooks.model import EventArrival, EventSource, IntakeAnswer, Received
from core.webhooks.signatures import SignatureRefused, standard_key, verify_bearer, verify_github, verify_standard
from core.webhooks.thread_key import render_thread_key

log = logging.getLogger(__name__)

MAX_EVENT_TYPE = 255  # the column's length
MAX_DELIVERY_ID = 255


class EventStore(Protocol):
    async def receive(self, arrival: EventArrival) -> Received: ...


class RefusalCounter:
    """Deliveries refused, by source and reason (``unknown_source``, ``signature``, ``unsigned``, ``stale``,
    ``malformed``, ``too_large``, ``too_slow``, ``rate``, ``no_secret``): for /metrics."""

    def __init__(self) -> None:
        self._counts: Counter[tuple[str, str]] = Counter()

    def add(self, source: str, reason: str) -> None:
        self._counts[(source, reason)] += 1

    def counts(self) -> dict[tuple[str, str], int]:
        return dict(self._counts)


class Refused(Exception):
    """A delivery answered with an error status, and the reason counted."""

    def __init__(self, status: int, text: str, reason: str) -> None:
        super().__init__(text)
        self.status, self.text, self.reason = status, text, reason


class WebhookIntake:
    """``deliver`` for every delivery: verified, stored, answered. ``secrets`` holds each source's secret as read
    from its ``secret_env`` (a source without one refuses every delivery: nothing unsigned gets in)."""

    def __init__(self, sources: list[EventSource], secrets: Mapping[str, str], store: EventStore, clock: Clock,
                 on_queued: Callable[[int, EventArrival], None], refusals: RefusalCounter | None = None) -> None:
        self.sources = {source.name: source for source in sources}
        self._secrets = dict(secrets)
        self._keys: dict[str, bytes] = {}  # Standard Webhooks sources' decoded keys
        for source in sources:
            secret = self._secrets.get(source.name)
            if source.kind == "standard" and secret:
                try:
                    self._keys[source.name] = standard_key(secret)
                except ValueError as exc:
                    log.error("event source %s: %s (%s): its deliveries are refused", source.name, exc,
                              source.secret_env)
        self.store = store
        self.clock = clock
        self.on_queued = on_queued
        self.refusals = refusals or RefusalCounter()

    async def deliver(self, name: str, headers: Mapping[str, str], body: bytes) -> IntakeAnswer:
        source = self.sources.get(name)
        if source is None:
            self.refusals.add("?", "unknown_source")  # not by name: any path would grow the counter
            return IntakeAnswer(404, "no such event source")
        try:
            return await self._deliver(source, {k.lower(): v for k, v in headers.items()}, body)
        except Refused as refused:
            self.refusals.add(source.name, refused.reason)
            return IntakeAnswer(refused.status, refused.text)

    def too_large(self, name: str) -> IntakeAnswer:
        """The answer to a body over the cap (the HTTP handler stops reading it)."""
        self.refusals.add(name if name in self.sources else "?", "too_large")
        return IntakeAnswer(413, "the body is too large")

    def too_slow(self, name: str) -> IntakeAnswer:
        """The answer to a body that did not arrive in time (the HTTP handler stops waiting for it)."""
        self.refusals.add(name if name in self.sources else "?", "too_slow")
        return IntakeAnswer(408, "the body took too long to arrive")

    async def _deliver(self, source: EventSource, headers: dict[str, str], body: bytes) -> IntakeAnswer:
        self._verify(source, headers, body)
        payload = _payload(body, source)
        event_type, delivery_id = _identify(source, headers, payload)
        if source.kind == "github" and event_type == "ping":
            return IntakeAnswer(200, "pong")  # GitHub's check that the hook works: nothing to store
        filtered = not any(fnmatch.fnmatchcase(event_type, glob) for glob in source.events)
        arrival = EventArrival(
            source=source.name, kind=source.kind, event_type=event_type, delivery_id=delivery_id,
            payload=body.decode("utf-8"), thread_key=None if filtered else render_thread_key(source.thread, payload),
            filtered=filtered, rate_per_minute=source.rate_per_minute, now=self.clock.now(),
            body_digest=hashlib.sha256(body).hexdigest() if source.kind == "github" else None)
        received = await self.store.receive(arrival)
        if received.outcome == "limited":
            self.refusals.add(source.name, "rate")
            return IntakeAnswer(429, "too many deliveries from this source; try again later",
                                retry_after_s=received.retry_after_s)
        if received.outcome == "duplicate":
            return IntakeAnswer(200, "already received", event_id=received.event_id)
        if received.outcome == "filtered":
            return IntakeAnswer(202, "filtered out", event_id=received.event_id)
        if received.event_id is not None:
            try:
                self.on_queued(received.event_id, arrival)  # what was stored: the processor need not read it
            except Exception:  # the event is stored: the processor finds it at its next start all the same
                log.exception("event %s of %s: waking the processor failed", received.event_id, source.name)
        return IntakeAnswer(202, "accepted", event_id=received.event_id)

    def _verify(self, source: EventSource, headers: dict[str, str], body: bytes) -> None:
        secret = self._secrets.get(source.name)
        if not secret:
            raise Refused(401, "this event source has no secret configured", "no_secret")
        if source.kind == "github":
            if not verify_github(secret.encode(), body, headers.get("x-hub-signature-256")):
                raise Refused(401, "missing or wrong signature", "signature")
        elif source.kind == "standard":
            key = self._keys.get(source.name)
            if key is None:
                raise Refused(401, "this event source has no usable key configured", "no_secret")
            try:
                verify_standard(key, headers.get("webhook-id"), headers.get("webhook-timestamp"),
                                headers.get("webhook-signature"), body, self.clock.now())
            except SignatureRefused as exc:
                raise Refused(401, str(exc), exc.reason) from None
        elif not verify_bearer(secret, headers.get("authorization")):
            raise Refused(401, "missing or wrong bearer token", "signature")


def _payload(body: bytes, source: EventSource) -> dict[str, Any]:
    """The body as a JSON object; anything else is malformed."""
    try:
        payload = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        # GitHub's default content type is a form: the operator's fix is one setting.
        hint = " (set the GitHub webhook's Content type to application/json)" if source.kind == "github" else ""
        raise Refused(400, f"the body is not JSON{hint}", "malformed") from None
    if not isinstance(payload, dict):
        raise Refused(400, "the body is not a JSON object", "malformed")
    return payload


def _identify(source: EventSource, headers: dict[str, str], payload: dict[str, Any]) -> tuple[str, str | None]:
    """The event type the `events` globs match, and the delivery id redeliveries repeat."""
    if source.kind == "github":
        event = headers.get("x-github-event", "").strip()
        delivery = headers.get("x-github-delivery", "").strip()
        if not event or not delivery:
            raise Refused(400, "X-GitHub-Event and X-GitHub-Delivery are required", "malformed")
        action = payload.get("action")
        event_type = f"{event}.{action}" if isinstance(action, str) and action else event
        return _bounded(event_type, MAX_EVENT_TYPE, "the event type"), _bounded(delivery, MAX_DELIVERY_ID,
                                                                                 "X-GitHub-Delivery")
    if source.kind == "standard":
        kind = payload.get("type")
        if not isinstance(kind, str):
            raise Refused(400, "a Standard Webhooks payload has a string `type`", "malformed")
        return _bounded(kind, MAX_EVENT_TYPE, "the type"), _bounded(headers["webhook-id"], MAX_DELIVERY_ID,
                                                                    "webhook-id")
    # Bearer (Alertmanager, Grafana…): no standard type; Alertmanager's `status` (firing/resolved) serves.
    for key in ("type", "status"):
        value = payload.get(key)
        if isinstance(value, str):
            return _bounded(value, MAX_EVENT_TYPE, f"the {key}"), None
    return "", None


def _bounded(value: str, limit: int, what: str) -> str:
    if len(value) > limit:
        raise Refused(400, f"{what} is longer than {limit} characters", "malformed")
    if not value.isprintable():  # control characters, lone surrogates: no column should hold them
        raise Refused(400, f"{what} holds control characters", "malformed")
    return value
