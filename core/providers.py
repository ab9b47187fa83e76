"""The protocol every LLM provider implements, and retrying of retryable failures."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from core.errors import ProviderError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as the model produced it

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}


@dataclass(frozen=True)
class ChatMessage:
    role: str  # "user", "assistant" or "tool"
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    images: tuple[str, ...] = ()  # image URLs or data: URIs (user messages)
    senders: tuple[str, ...] = ()  # who wrote a user message taken in mid-turn (trust; never sent to a model)
    # It addressed the bot (a mention, a DM: not context): the newest such is never cut to fit the context window
    # (core.context_window). Never sent to a model.
    asked: bool = False


@dataclass(frozen=True)
class CompletionRequest:
    instructions: str
    messages: list[ChatMessage]
    tools: list[dict[str, Any]] = field(default_factory=list)
    max_output_tokens: int | None = None  # a cap on the answer (a side call's, e.g. the memory pass); None: the model's


@dataclass(frozen=True)
class Completion:
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    usage: int | None = None  # the tokens the call used, as the provider counted them (None: not said)
    input_tokens: int | None = None  # of them, the request's (cached ones included)
    output_tokens: int | None = None  # of them, the answer's


class TextStream(Protocol):
    """Where a streaming provider sends the answer's text as it arrives (core.answer_stream)."""

    def restart(self) -> None:
        """A new model call begins (a retry): what came before is not its text."""

    def __call__(self, text: str) -> None: ...


class Provider(Protocol):
    name: str

    async def complete(self, request: CompletionRequest) -> Completion:
        """One model call; raise ProviderError (classified) on failure. A provider whose ``streams``
        attribute is true also takes ``on_text: TextStream | None``, and calls it as the text arrives."""
        ...


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 4
    base_delay_s: float = 0.5
    max_delay_s: float = 20.0
    # A Retry-After the endpoint asks for is waited out up to this (LLM_TIMEOUT_S): a rate limit is a transient,
    # not a reason to switch to the fallback model, but no endpoint holds a turn for longer than a call may take.
    retry_after_max_s: float = 120.0

    def delay(self, attempt: int, error: ProviderError) -> float:
        if error.retry_after is not None:
            return min(max(error.retry_after, 0.0), self.retry_after_max_s)
        backoff = self.base_delay_s * (2 ** (attempt - 1))
        return min(backoff * (0.5 + random.random() / 2), self.max_delay_s)


CallObserver = Callable[[Completion | ProviderError, float], None]


async def complete_with_retries(provider: Provider, request: CompletionRequest, policy: RetryPolicy,
                                on_text: TextStream | None = None, observe: CallObserver | None = None) -> Completion:
    """``observe`` learns how each attempt ended (its completion or its error) and how long it took (metrics)."""
    streaming = on_text is not None and getattr(provider, "streams", False)
    for attempt in range(1, policy.attempts + 1):
        started = time.monotonic()
        try:
            if streaming:
                assert on_text is not None
                on_text.restart()
                reply = await provider.complete(request, on_text=on_text)  # type: ignore[call-arg]
            else:
                reply = await provider.complete(request)
        except ProviderError as error:
            if observe is not None:
                observe(error, time.monotonic() - started)
            if not error.retryable or attempt == policy.attempts:
                raise
            delay = policy.delay(attempt, error)
            log.warning(
                "model call failed (%s: %s); retry %d/%d in %.2f s",
                error.kind, error, attempt, policy.attempts - 1, delay,
            )
            await asyncio.sleep(delay)
            continue
        if observe is not None:
            observe(reply, time.monotonic() - started)
        return reply
    raise AssertionError("unreachable")
