"""Traces (SPEC §17 "Traces"): the port core opens spans through, and the default that records nothing.

core never imports OpenTelemetry: bot.tracing implements this port with it when the standard ``OTEL_*``
variables ask for traces, and everything else gets ``NO_TRACING``, whose spans are one shared object that
does nothing (no allocation, no clock read). Span names and attributes follow the OpenTelemetry GenAI
semantic conventions: ``invoke_agent <agent>``, ``chat <model>``, ``execute_tool <tool>``; the gateway's own
steps around them (intake, a person's approval, delivery) are named here too.

A turn is one trace. Its context (a W3C ``traceparent``) is taken at intake and stored with the input in the
database, so the turn that takes the input, a resumed one after a restart, and the answer's delivery all
belong to that trace, whichever process runs them.

Message text (prompts, answers, tool arguments and results) goes into spans only when ``content`` is true
(OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true), and then masked by the redactor first. Errors are
recorded by their type only: an exception's message may quote a secret or a model's words.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Final, Protocol

AttributeValue = str | bool | int | float

# Span names beyond the GenAI conventions' (they name only the model, agent and tool spans).
INTAKE = "intake"  # ``intake <channel>``: a message taken in (stored, queued or refused)
APPROVAL = "await_approval"  # ``await_approval <tool>``: a gated call waits on a person
DELIVERY = "deliver"  # ``deliver <channel>``: one attempt at posting a turn's answer


class Current:
    """``parent=CURRENT``: the span opened in the current task's context, if any, is the parent."""


CURRENT: Final = Current()


class Span(Protocol):
    def set(self, key: str, value: AttributeValue | None) -> None:
        """Set an attribute; None sets nothing (a figure the provider did not report)."""

    def fail(self, error_type: str) -> None:
        """The operation failed although nothing was raised (e.g. a tool's "error: …" result): an error status
        and ``error.type``, never a message."""


class SpanScope(Protocol):
    """A span while it is open: ``with tracer.span(...) as span``. An exception leaving it marks the span
    failed with ``error.type`` = the exception's class name, and is not recorded otherwise."""

    def __enter__(self) -> Span: ...

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None: ...


class Tracer(Protocol):
    @property
    def enabled(self) -> bool:
        """False: spans record nothing, so a caller skips working out what only a span would hold."""

    @property
    def content(self) -> bool:
        """Message text may go into spans (masked): OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true."""

    def span(self, name: str, attributes: Mapping[str, AttributeValue | None] | None = None, *,
             parent: str | Current | None = CURRENT, links: Sequence[str] = (), client: bool = False) -> SpanScope:
        """Open a span, current in this task until it closes. ``parent``: CURRENT (the current span, if any),
        a stored ``traceparent`` (a turn's: its first span, in another task or process), or None (a new trace,
        whatever is current). ``links``: stored ``traceparent`` values this span relates to (a resumed turn's
        first span). ``client``: a call to another service (the model), not work in this process."""
        ...

    def traceparent(self) -> str | None:
        """The current span's W3C ``traceparent``, to store (None: no span is recording)."""
        ...


class _NoSpan:
    """One object for every span nobody records: entering, setting and leaving it do nothing."""

    def set(self, key: str, value: AttributeValue | None) -> None:
        pass

    def fail(self, error_type: str) -> None:
        pass

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        return None


_NO_SPAN: Final = _NoSpan()


class NoTracing:
    """The default: no OTEL_* asks for traces (or the ``[otel]`` extra is not installed)."""

    enabled = False
    content = False

    def span(self, name: str, attributes: Mapping[str, AttributeValue | None] | None = None, *,
             parent: str | Current | None = CURRENT, links: Sequence[str] = (), client: bool = False) -> _NoSpan:
        return _NO_SPAN

    def traceparent(self) -> str | None:
        return None


NO_TRACING: Final = NoTracing()
