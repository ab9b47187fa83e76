"""Anthropic's Messages API, natively, through the official SDK (LLM_PROVIDER=anthropic).

The request and answer shapes are translated in ``bot.providers.anthropic_format``; this module makes the
call, streams the text as it arrives, and maps failures onto core's error kinds (SPEC §6) the way the
OpenAI-compatible provider does: 401/403 auth; 429 and 529 (overloaded) retryable after ``retry-after``;
other 5xx retryable; connection failures and broken streams network errors; a prompt too long for the
model's context the ``context_overflow`` that core answers by fitting the thread tighter, once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from typing import Any

import anthropic
import httpx2

from bot.providers.anthropic_format import StreamedMessage, body, completion
from bot.providers.idle import IdleWatchdog
from bot.providers.retry_after import retry_after_seconds
from core.errors import ProviderError
from core.providers import Completion, CompletionRequest, TextStream

log = logging.getLogger(__name__)
DEFAULT_BASE_URL = "https://api.anthropic.com"
DEFAULT_MAX_TOKENS = 4096  # the API requires a cap on the answer; enough for any chat reply or tool call

# An error event sent inside a stream (HTTP 200) names only its type: the status it stands for.
_STATUS_OF_TYPE = {
    "invalid_request_error": 400, "authentication_error": 401, "billing_error": 402, "permission_error": 403,
    "not_found_error": 404, "request_too_large": 413, "rate_limit_error": 429, "api_error": 500,
    "timeout_error": 504, "overloaded_error": 529,
}


class AnthropicProvider:
    name = "anthropic"

    def __init__(self, *, base_url: str | None, api_key: str | None, model: str, timeout_s: float,
                 stream: bool = True, max_tokens: int = DEFAULT_MAX_TOKENS,
                 idle_timeout_s: float | None = None) -> None:
        self.model = model
        self.timeout_s = timeout_s
        self.idle_timeout_s = idle_timeout_s or timeout_s  # LLM_IDLE_TIMEOUT_S: a streamed answer's silence
        self.streams = stream  # answers stream as they are written (LLM_STREAM)
        self.max_tokens = max_tokens
        self.base_url = api_base(base_url)
        # Retries are ours (classified, core.providers.complete_with_retries); the timeout is per phase
        # (connect, each read), not for a whole streamed answer.
        self._client = client(api_key, self.base_url, timeout_s)

    async def aclose(self) -> None:
        await self._client.close()

    async def complete(self, request: CompletionRequest, *, on_text: TextStream | None = None) -> Completion:
        kwargs = body(self.model, self.max_tokens, request)
        try:
            if on_text is not None and self.streams:
                return await self._stream(kwargs, on_text)
            return completion(await self._client.messages.create(**kwargs))
        except ProviderError:
            raise
        except anthropic.APIError as exc:
            raise classify(exc) from None
        except TimeoutError:  # the answer's head did not come within LLM_TIMEOUT_S
            raise ProviderError("network", f"the model endpoint did not answer within {self.timeout_s:g} s",
                                retryable=True) from None
        except httpx2.HTTPError as exc:  # the SDK wraps failures before the answer's head, not while reading
            raise ProviderError("network", f"the model's answer broke off: {type(exc).__name__}",
                                retryable=True) from None
        except Exception as exc:  # a body that is not a message
            # Only the type: the text may quote model output, which is never logged unredacted.
            raise ProviderError("model", f"unexpected response from the endpoint ({type(exc).__name__})",
                                retryable=False) from None

    async def _stream(self, kwargs: dict[str, Any], on_text: TextStream) -> Completion:
        """LLM_TIMEOUT_S covers connecting and the answer's head; then the idle watchdog has the stream (each read's
        own timeout is off: a silent stream is not a network error to retry)."""
        whole = StreamedMessage()
        async with asyncio.timeout(self.timeout_s):
            stream = await self._client.messages.create(**kwargs, stream=True, timeout=anthropic.Timeout(
                self.timeout_s, read=None))
        try:
            async with IdleWatchdog(self.idle_timeout_s) as watchdog:
                async for event in stream:
                    watchdog.touch()
                    text = whole.add(event)
                    if text:
                        on_text(text)
        finally:
            await stream.close()
        return whole.completion()


def client(api_key: str | None, base_url: str, timeout_s: float) -> anthropic.AsyncAnthropic:
    """The SDK's client, retrying nothing and following no redirect: a redirect would send the whole prompt
    (and, to the same host, the key) wherever the endpoint says; it is a configuration error instead.

    Without the headers of ANTHROPIC_CUSTOM_HEADERS, which the SDK would add to every request of every client (an
    agent's or the fallback's endpoint elsewhere too, its Authorization over the key set for that endpoint): a key
    goes only where it was configured for (bot.model_endpoints), and that variable is not the bot's setting."""
    made = anthropic.AsyncAnthropic(api_key=api_key or "not-needed", base_url=base_url, max_retries=0,
                                    timeout=anthropic.Timeout(timeout_s),
                                    http_client=anthropic.DefaultAsyncHttpxClient(follow_redirects=False))
    names = _environment_header_names()
    if not names:
        return made
    own = {name.lower(): value for name, value in made.auth_headers.items()}  # the key of this endpoint stays
    headers: dict[str, Any] = {name: own.get(name.lower(), anthropic.omit) for name in names}
    return made.with_options(default_headers=headers)


def _environment_header_names() -> list[str]:
    """The names ANTHROPIC_CUSTOM_HEADERS sets (``Name: value`` lines), as the SDK reads them."""
    lines = (os.environ.get("ANTHROPIC_CUSTOM_HEADERS") or "").split("\n")
    return [name for name in dict.fromkeys(line.split(":", 1)[0].strip() for line in lines if ":" in line) if name]


def api_base(base_url: str | None) -> str:
    """LLM_BASE_URL as the SDK wants it: the API's root (it adds ``/v1/messages``), ``/v1`` taken off."""
    base = (base_url or DEFAULT_BASE_URL).rstrip("/")
    return base.removesuffix("/v1")


def classify(exc: anthropic.APIError) -> ProviderError:
    """The SDK's exceptions as core's error kinds (SPEC §6); ``bot doctor`` uses this too."""
    if isinstance(exc, anthropic.APIConnectionError):  # includes timeouts
        return ProviderError("network", f"cannot reach the model endpoint: {exc.message}", retryable=True)
    if isinstance(exc, anthropic.APIResponseValidationError):
        return ProviderError("model", "unexpected response from the endpoint", retryable=False)
    if not isinstance(exc, anthropic.APIStatusError):
        return ProviderError("unknown", str(exc.message)[:300], retryable=False)
    kind = getattr(exc, "type", None) or _inner(exc.body).get("type")
    status = exc.status_code
    if 300 <= status < 400:
        return ProviderError("model", f"HTTP {status}: the endpoint redirects, and redirects are not followed (the "
                             "prompt would go wherever it says); set LLM_BASE_URL to the final address",
                             retryable=False, status=status)
    if status < 400:  # an error event inside a stream
        status = _STATUS_OF_TYPE.get(kind if isinstance(kind, str) else "", 500)
    detail = _detail(exc)
    retry_after = retry_after_seconds(exc.response.headers.get("retry-after"))
    if status in (401, 403):
        return ProviderError("auth", f"HTTP {status}: {detail}", retryable=False, status=status)
    if status in (429, 529):
        what = "too many requests" if status == 429 else "Anthropic is overloaded"
        return ProviderError("rate_limit", f"HTTP {status} ({what}): {detail}", retryable=True,
                             retry_after=retry_after, status=status)
    if status == 413 or (status == 400 and _too_long(detail)):
        return ProviderError("context_overflow", f"HTTP {status}: {detail}", retryable=False, status=status)
    if status == 404:
        return ProviderError("model", f"HTTP 404 (unknown model or wrong LLM_BASE_URL?): {detail}",
                             retryable=False, status=status)
    if status >= 500:
        return ProviderError("model", f"HTTP {status}: {detail}", retryable=True, retry_after=retry_after,
                             status=status)
    if 400 <= status < 500:
        return ProviderError("model", f"HTTP {status}: {detail}", retryable=False, status=status)
    return ProviderError("unknown", f"HTTP {status}: {detail}", retryable=False, status=status)


def _too_long(detail: str) -> bool:
    """Anthropic's context-length refusals: "prompt is too long: 215000 tokens > 200000 maximum", "input
    length and `max_tokens` exceed context limit: …"."""
    text = detail.lower()
    return ("prompt is too long" in text or "exceed context limit" in text or "context window" in text
            or "context length" in text or "too many tokens" in text)


def _inner(body: object) -> dict[str, Any]:
    inner = body.get("error", body) if isinstance(body, dict) else None
    return inner if isinstance(inner, dict) else {}


def _detail(exc: anthropic.APIStatusError) -> str:
    """What the error body says (``{"type": "error", "error": {"type": …, "message": …}}``), short."""
    message = getattr(exc, "api_message", None) or _inner(exc.body).get("message")
    if message:
        return str(message)[:300]
    return (json.dumps(exc.body) if isinstance(exc.body, dict) else str(exc.body or exc.message))[:300]

