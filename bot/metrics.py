"""``GET /metrics`` in Prometheus format: counters fed by core's events, gauges read from the database.

Only for this machine (a loopback peer talking to us directly) or for whoever holds ``BOT_WEB_TOKEN``
(``Authorization: Bearer``): the numbers tell an outsider how busy the bot is and what it is waiting for.
Every name begins with ``chatops_`` (SPEC §17); docs/operations.md lists them all, from ``metric_list()``.
"""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, Gauge, Histogram, generate_latest
from prometheus_client.registry import CollectorRegistry

from bot import __version__
from channels.web.auth import bearer_matches, local_problem
from core.events import (
    ApprovalReminded,
    ApprovalRequested,
    ApprovalResolved,
    ApprovalVoted,
    CredentialRequested,
    Event,
    EventBus,
    ModelCalled,
    ModelSwitched,
    ToolEnded,
    TurnCancelled,
    TurnFailed,
    TurnFinished,
    TurnStarted,
)
from core.feedback import FeedbackGiven
from core.spending import ModelSpent
from core.store import Database
from core.store.stats import snapshot
from core.store.webhook_events import WebhookEventStore
from core.webhooks.intake import RefusalCounter

PREFIX = "chatops_"

TURNS_STARTED = Counter("chatops_turns_started", "Turns started")
TURNS_ENDED = Counter("chatops_turns_ended", "Turns ended, by outcome (answered, failed, cancelled, silent)",
                      ["outcome"])
TURN_SECONDS = Histogram("chatops_turn_duration_seconds", "From a turn's start to its end",
                         buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900))
TOOL_CALLS = Counter("chatops_tool_calls", "Tool calls ended, by tool and outcome (ok, error, denied, refused; a tool "
                                           "name the model made up is '?')", ["tool", "outcome"])
APPROVALS = Counter("chatops_approvals", "Approval requests, by event (requested, voted, reminded, approved, denied, "
                                         "expired, cancelled)", ["event"])
CREDENTIAL_REQUESTS = Counter("chatops_credential_requests", "Credential requests made")
FEEDBACK_CLICKS = Counter("chatops_feedback_clicks",
                          "Feedback buttons clicked under answers, by verdict (this process)", ["verdict"])
BUILD_INFO = Gauge("chatops_build_info", "Always 1: the bot's version and Python's, as labels", ["version", "python"])
BUILD_INFO.labels(version=__version__, python=platform.python_version()).set(1)

# Gauges read from the database (core.store.stats): every replica reports the same figures.
GAUGES = {name: Gauge(f"{PREFIX}{name}", help_text) for name, help_text in (
    ("queue_depth", "Messages waiting for a turn"),
    ("turns_running", "Turns running (all replicas)"),
    ("approvals_pending", "Approval requests waiting for a decision"),
    ("credential_requests_pending", "Credential requests waiting for a value"),
    ("connection_requests_pending", "Calls waiting for an account to be connected"),
    ("schedules_active", "Active schedules"),
)}
DELIVERIES = Gauge("chatops_deliveries", "Answers by delivery status: pending (waiting for their channel, retried with "
                                         "backoff) or given_up (retried for DELIVERY_MAX_AGE_S, or refused for good)",
                   ["status"])
FIRINGS = Gauge("chatops_firings", "Schedule firings by status: posted (answer delivered) or failed", ["status"])
FEEDBACK = Gauge("chatops_feedback", "Verdicts on answers, by verdict: positive or negative (each person's latest, "
                                     "all replicas)", ["verdict"])
# The snapshot's pairs, each one metric with a label.
LABELLED = {
    "deliveries_pending": DELIVERIES.labels(status="pending"),
    "deliveries_given_up": DELIVERIES.labels(status="given_up"),
    "firings_posted": FIRINGS.labels(status="posted"),
    "firings_failed": FIRINGS.labels(status="failed"),
    "feedback_positive": FEEDBACK.labels(verdict="positive"),
    "feedback_negative": FEEDBACK.labels(verdict="negative"),
}


# Model calls (SPEC §17 "Fallback"): each attempt, by model and outcome ("ok" or the error's kind), its duration, its
# tokens; and sessions switched to the fallback model.
MODEL_CALLS = Counter("chatops_model_calls", "Model calls (each attempt), by model and outcome (ok, or the error's "
                      "kind)", ["model", "outcome"])
MODEL_CALL_SECONDS = Histogram("chatops_model_call_duration_seconds", "How long each model call took", ["model"],
                               buckets=(0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300))
MODEL_TOKENS = Counter("chatops_model_tokens", "Tokens of model calls, as the endpoints counted them, by model and "
                       "direction (input, output)", ["model", "direction"])
MODEL_SWITCHES = Counter("chatops_model_switches", "Sessions that went over to the fallback model")

# Spending (core.spending): each model call counted, by the agent whose turn made it. Never by person: a label per
# person is a series per person forever (unbounded, and it names people to whoever reads /metrics); `bot usage`
# shows people.
SPEND_TOKENS = Counter("chatops_spend_tokens", "Tokens of model calls counted against spending caps, by agent and "
                       "direction (input, output)", ["agent", "direction"])
SPEND_COST = Counter("chatops_spend_cost", "Cost of model calls priced by [[prices]] (its currency), by agent",
                     ["agent"])

EVENTS = Gauge("chatops_events", "Stored events by source and status (queued, answered, failed, filtered, duplicate; "
               "all replicas, within EVENT_RETENTION_DAYS)", ["source", "status"])
EVENT_REFUSALS = Counter("chatops_event_refusals", "Event deliveries refused, by source and reason (this process; an "
                                                   "unknown source's name is '?')", ["source", "reason"])


def metric_list(registry: CollectorRegistry = REGISTRY) -> list[str]:
    """One Markdown line per ``chatops_`` metric registered (those of every module imported so far): name with its
    labels, type, help. docs/operations.md holds this list; tests/test_metrics.py checks it is current."""
    lines = []
    for collector in list(registry._collector_to_names):  # no public way to walk the collectors
        for family in collector.describe() if hasattr(collector, "describe") else ():
            if not family.name.startswith(PREFIX):
                continue
            # Read before any sample exists: prometheus_client keeps a metric's label names only here.
            labels = ",".join(getattr(collector, "_labelnames", ()))
            name = family.name + ("_total" if family.type == "counter" else "")
            lines.append(f"- `{name}{{{labels}}}` ({family.type}): {family.documentation}" if labels
                         else f"- `{name}` ({family.type}): {family.documentation}")
    return sorted(lines)


@dataclass
class EventFigures:
    """The events' figures: stored rows by status (the database), refused deliveries (this process's counter)."""

    store: WebhookEventStore
    refusals: RefusalCounter
    _reported: dict[tuple[str, str], int] = field(default_factory=dict)  # refusals already added to the counter

    async def update(self) -> None:
        for (source, status), count in (await self.store.counts()).items():
            EVENTS.labels(source=source, status=status).set(count)
        for key, count in self.refusals.counts().items():
            if count > self._reported.get(key, 0):
                EVENT_REFUSALS.labels(source=key[0], reason=key[1]).inc(count - self._reported.get(key, 0))
                self._reported[key] = count


class Metrics:
    def __init__(self, db: Database, bus: EventBus, *, token: str | None = None,
                 events: EventFigures | None = None) -> None:
        self.db = db
        self.token = token
        self.events = events
        self._started: dict[int, float] = {}  # turn id -> monotonic start, for the duration histogram
        bus.subscribe(self.observe)

    async def observe(self, event: Event) -> None:
        if isinstance(event, TurnStarted):
            TURNS_STARTED.inc()
            self._started[event.turn.id] = time.monotonic()
        elif isinstance(event, TurnFinished | TurnFailed | TurnCancelled):
            outcome = {TurnFinished: "answered", TurnFailed: "failed", TurnCancelled: "cancelled"}[type(event)]
            if isinstance(event, TurnFinished) and event.silent:
                outcome = "silent"  # a listening turn that had nothing to add (core.listening)
            TURNS_ENDED.labels(outcome=outcome).inc()
            started = self._started.pop(event.turn.id, None)
            if started is not None:
                TURN_SECONDS.observe(time.monotonic() - started)
        elif isinstance(event, ApprovalRequested):
            APPROVALS.labels(event="requested").inc(len(event.batch) or 1)  # a batch: one per call
        elif isinstance(event, ApprovalResolved):  # approved, denied, expired (nobody's decision), cancelled
            APPROVALS.labels(event=event.request.status).inc()
        elif isinstance(event, ApprovalVoted | ApprovalReminded):
            APPROVALS.labels(event="voted" if isinstance(event, ApprovalVoted) else "reminded").inc()
        elif isinstance(event, CredentialRequested):
            CREDENTIAL_REQUESTS.inc()
        elif isinstance(event, ModelCalled):
            MODEL_CALLS.labels(model=event.model, outcome=event.outcome).inc()
            MODEL_CALL_SECONDS.labels(model=event.model).observe(event.duration_s)
            for direction, tokens in (("input", event.input_tokens), ("output", event.output_tokens)):
                if tokens:
                    MODEL_TOKENS.labels(model=event.model, direction=direction).inc(tokens)
        elif isinstance(event, ModelSpent):
            for direction, tokens in (("input", event.input_tokens), ("output", event.output_tokens)):
                SPEND_TOKENS.labels(agent=event.agent, direction=direction).inc(tokens)
            if event.cost is not None:
                SPEND_COST.labels(agent=event.agent).inc(event.cost)
        elif isinstance(event, ModelSwitched):
            MODEL_SWITCHES.inc()
        elif isinstance(event, FeedbackGiven):
            FEEDBACK_CLICKS.labels(verdict="positive" if event.positive else "negative").inc()
        elif isinstance(event, ToolEnded):
            TOOL_CALLS.labels(tool=event.tool or "?", outcome=event.outcome).inc()

    async def handle(self, request: web.Request) -> web.Response:
        if not (self.token and bearer_matches(request, self.token)) and local_problem(request) is not None:
            return web.Response(status=403, text="GET /metrics is for this machine, or send "
                                                 "Authorization: Bearer <BOT_WEB_TOKEN>.")
        for name, value in (await snapshot(self.db)).items():
            (GAUGES[name] if name in GAUGES else LABELLED[name]).set(value)
        if self.events is not None:
            await self.events.update()
        return web.Response(body=generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST})
