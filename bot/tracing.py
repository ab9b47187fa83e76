"""Traces with OpenTelemetry (the ``[otel]`` extra), set up only by the standard ``OTEL_*`` variables.

``from_environment`` gives core.tracing.NO_TRACING unless they ask for traces, and then only imports
OpenTelemetry: with none of them set, or the extra not installed, a turn costs nothing more than before.
Traces are asked for by ``OTEL_TRACES_EXPORTER`` (``otlp``, ``console``, or both; ``none``: off) or, with it
unset, by an OTLP endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``: the
standard default exporter is otlp). ``OTEL_SDK_DISABLED=true`` turns everything off. The SDK reads the rest
itself: ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``, the exporter's headers
and timeouts.

The tracer provider is this process's own, never the global one: a library that emits spans of its own
through the global API (the MCP SDK does) records nothing, so no span carries what we did not decide to put
in it. An exception leaving a span marks it failed by its class name only, never its message or stack (they
may quote a secret or a model's words).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING
from urllib.parse import unquote

from core.tracing import CURRENT, NO_TRACING, AttributeValue, Current, Tracer

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span as OtelSpan

log = logging.getLogger(__name__)

SERVICE_NAME = "chatops-gateway"  # when OTEL_SERVICE_NAME is not set
EXPORTERS = ("otlp", "console")
CAPTURE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
HEADER_VARIABLES = ("OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS")  # the exporter's credentials


def from_environment(environ: Mapping[str, str], *, secrets: Callable[[str], None] | None = None) -> Tracer:
    """The tracer the ``OTEL_*`` variables in ``environ`` ask for; NO_TRACING when they ask for none. ``secrets``
    learns the OTLP headers' values first (the log filter masks them)."""
    if secrets is not None:
        for value in header_values(environ):
            secrets(value)
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return NO_TRACING
    names = exporter_names(environ)
    if not names:
        return NO_TRACING
    try:
        exporters = [_exporter(name) for name in names]
    except ImportError as exc:
        log.warning("OTEL_* asks for traces (%s) but the [otel] extra is not installed (%s): no traces are sent; "
                    "pip install 'chatops-gateway[otel]'", ", ".join(names), exc.name or exc)
        return NO_TRACING
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    if "otlp" in names and protocol and protocol != "http/protobuf":
        log.warning("OTEL_EXPORTER_OTLP_PROTOCOL=%s: traces are sent as http/protobuf (the only one installed)",
                    protocol)
    tracer = OpenTelemetryTracer(provider(exporters, environ.get("OTEL_SERVICE_NAME") or SERVICE_NAME),
                                 content=capture_content(environ))
    log.info("traces: sent by %s%s", " and ".join(names),
             "; message text included (masked)" if tracer.content else "")
    return tracer


def exporter_names(environ: Mapping[str, str]) -> list[str]:
    """``otlp`` and/or ``console``, as OTEL_TRACES_EXPORTER says; unset, otlp once an OTLP endpoint is set."""
    named = environ.get("OTEL_TRACES_EXPORTER")
    if named is None or not named.strip():
        endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        return ["otlp"] if endpoint else []
    wanted = list(dict.fromkeys(name.strip().lower() for name in named.split(",") if name.strip()))
    if "none" in wanted:
        return []
    unknown = [name for name in wanted if name not in EXPORTERS]
    if unknown:
        log.warning("OTEL_TRACES_EXPORTER: %s is not one of otlp, console, none; left out", ", ".join(unknown))
    return [name for name in wanted if name in EXPORTERS]


def header_values(environ: Mapping[str, str]) -> list[str]:
    """What OTEL_EXPORTER_OTLP_HEADERS and OTEL_EXPORTER_OTLP_TRACES_HEADERS hold (an Authorization token, as a rule):
    each entry, its value and the value's last word, written or URL-decoded. The SDK logs an entry it cannot parse
    whole, value and all ("Authorization: Bearer …", HTTP's form, is the usual slip), so they are masked in logs."""
    found: list[str] = []
    for variable in HEADER_VARIABLES:
        for entry in (environ.get(variable) or "").split(","):
            for text in (entry, unquote(entry)):
                value = re.split(r"[=:]", text, maxsplit=1)[-1].strip()
                found += [text.strip(), value, *value.split()[-1:]]
    return [value for value in dict.fromkeys(found) if len(value) >= 4]


def capture_content(environ: Mapping[str, str]) -> bool:
    return environ.get(CAPTURE_CONTENT, "").strip().lower() == "true"


def _exporter(name: str) -> SpanExporter:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()  # endpoint, headers, timeout: from OTEL_EXPORTER_OTLP_*


def provider(exporters: Sequence[SpanExporter], service_name: str = SERVICE_NAME, *,
             batch: bool = True) -> TracerProvider:
    """A tracer provider of this process's own that sends every span to ``exporters`` (in batches, off the event
    loop's thread; ``batch=False``: at once, as tests want). Flushed when the process exits."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    made = TracerProvider(resource=Resource.create({"service.name": service_name}))
    for exporter in exporters:
        made.add_span_processor(BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter))
    return made


class OpenTelemetryTracer:
    """core.tracing.Tracer over an OpenTelemetry tracer provider."""

    enabled = True

    def __init__(self, provider: TracerProvider, *, content: bool = False) -> None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self.content = content
        self._tracer = provider.get_tracer("chatops-gateway")
        self._propagator = TraceContextTextMapPropagator()

    def span(self, name: str, attributes: Mapping[str, AttributeValue | None] | None = None, *,
             parent: str | Current | None = CURRENT, links: Sequence[str] = (), client: bool = False) -> _Scope:
        from opentelemetry.context import Context
        from opentelemetry.trace import Link, SpanKind, get_current_span

        context = None if isinstance(parent, Current) else Context() if parent is None else self._context(parent)
        linked = [get_current_span(self._context(link)).get_span_context() for link in links]
        return _Scope(lambda: self._tracer.start_span(
            name, context=context, kind=SpanKind.CLIENT if client else SpanKind.INTERNAL,
            attributes={key: value for key, value in (attributes or {}).items() if value is not None},
            links=[Link(found) for found in linked if found.is_valid],
            record_exception=False, set_status_on_exception=False))

    def traceparent(self) -> str | None:
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier)
        return carrier.get("traceparent")

    def _context(self, traceparent: str) -> Context:
        """A stored traceparent as a parent (one that does not parse: a new trace)."""
        return self._propagator.extract({"traceparent": traceparent})


class _Span:
    def __init__(self, span: OtelSpan) -> None:
        self._span = span
        self.failed = False

    def set(self, key: str, value: AttributeValue | None) -> None:
        if value is not None:
            self._span.set_attribute(key, value)

    def fail(self, error_type: str) -> None:
        from opentelemetry.trace import Status, StatusCode

        self.failed = True
        self._span.set_attribute("error.type", error_type)
        self._span.set_status(Status(StatusCode.ERROR))


class _Scope:
    """The span is started on entry (current in this task's context until exit) and ended on exit."""

    def __init__(self, start: Callable[[], OtelSpan]) -> None:
        self._start = start
        self._token: object = None
        self._span: _Span | None = None

    def __enter__(self) -> _Span:
        from opentelemetry import context, trace

        started = self._start()
        self._span = _Span(started)
        self._token = context.attach(trace.set_span_in_context(started))
        return self._span

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        from opentelemetry import context

        assert self._span is not None
        try:
            if kind is not None and not self._span.failed:
                self._span.fail(kind.__name__)  # the class only: the message may quote a secret
        finally:
            context.detach(self._token)  # type: ignore[arg-type]
            self._span._span.end()
