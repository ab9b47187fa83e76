"""Final review: a request's own trace context never becomes the stored one (core.dispatcher's intake span has
parent=None). A Slack event arriving with a W3C ``traceparent`` header, and inside a span the caller had open,
starts a trace of its own; what the input stores is that trace's."""

from __future__ import annotations

from collections.abc import Callable
from json import dumps

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlmodel import select

from bot.settings import Settings
from core.store.tables import InputRow
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import event_body, mention, signed_headers
from tests.test_traces import Start, _one, _trace
from tests.test_traces import exporter as exporter
from tests.test_traces import traced as traced

OUTSIDE_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
OUTSIDE = f"00-{OUTSIDE_TRACE}-00f067aa0ba902b7-01"


async def test_a_requests_traceparent_is_never_stored_or_joined(
    traced: Start, make_settings: Callable[..., Settings], exporter: InMemorySpanExporter,
    fake_slack: FakeSlack, fake_llm: FakeLLM,
) -> None:
    gateway = await traced(make_settings())
    fake_llm.then(Reply("hi"))
    body = dumps(event_body(mention("hello")))
    headers = signed_headers(body) | {"traceparent": OUTSIDE, "tracestate": "evil=1"}
    await gateway.post_raw(body, headers)
    await fake_slack.wait_for("chat.postMessage", 1)
    await gateway.idle()
    spans = exporter.get_finished_spans()
    intake = _one(spans, "intake slack")
    assert intake.parent is None and f"{_trace(intake):032x}" != OUTSIDE_TRACE
    assert all(f"{_trace(span):032x}" != OUTSIDE_TRACE for span in spans)
    async with gateway.app.db.read() as s:
        stored = (await s.exec(select(InputRow.trace_context))).all()
    assert stored and all(t is not None and OUTSIDE_TRACE not in t and t.split("-")[1] == f"{_trace(intake):032x}"
                          for t in stored)
