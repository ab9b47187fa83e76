"""Any OpenAI-compatible chat-completions endpoint (OpenAI, Azure, Ollama, vLLM, OpenRouter, LiteLLM…)."""

from __future__ import annotations

import json
import logging
from typing import Any

import openai
from openai import AsyncOpenAI, AsyncStream
from openai.types.chat import ChatCompletion

from bot.providers.openai_stream import StreamedCompletion
from core.errors import ProviderError
from core.providers import ChatMessage, Completion, CompletionRequest, TextStream, ToolCall
from core.text import clean_text

try:  # the transport under the client (httpx2 in openai 2.x and later, httpx before)
    import httpx2 as _transport  # type: ignore[import-not-found, unused-ignore]
except ImportError:  # pragma: no cover - an older openai
    import httpx as _transport  # type: ignore[no-redef, unused-ignore]

_BROKEN_OFF = (_transport.HTTPError, _transport.StreamError)  # raised while a streamed answer is read
log = logging.getLogger(__name__)


class OpenAICompatibleProvider:
    name = "openai"

    def __init__(self, *, base_url: str | None, api_key: str | None, model: str, timeout_s: float,
                 stream: bool = True) -> None:
        self.model = model
        self.streams = stream  # answers stream as they are written (LLM_STREAM)
        # Retries are ours (classified, with Retry-After); the client must not retry on its own.
        self.client = AsyncOpenAI(
            base_url=base_url, api_key=api_key or "not-needed", timeout=timeout_s, max_retries=0
        )

    async def complete(self, request: CompletionRequest, *, on_text: TextStream | None = None) -> Completion:
        return await self._complete(_body(self.model, request), on_text)

    async def _complete(self, kwargs: dict[str, Any], on_text: TextStream | None) -> Completion:
        if on_text is not None and self.streams:
            return await self._streamed(kwargs, on_text)
        try:
            # The request is built here already: posted as it is, without the SDK walking every message
            # and tool schema through its parameter types first (most of a call's CPU with many tools).
            response = await self.client.post("/chat/completions", body=kwargs, cast_to=ChatCompletion)
        except openai.APIError as exc:
            raise classify(exc) from exc
        return _completion(response)


    async def _streamed(self, kwargs: dict[str, Any], on_text: TextStream) -> Completion:
        """The same call with ``stream``: text goes to ``on_text`` as it arrives, and the whole is the same
        Completion as without (bot.providers.openai_stream). An endpoint that answers with one JSON body
        anyway is read as such; one that refuses streaming is asked again without, and not again after."""
        whole = StreamedCompletion()
        try:
            stream = await self.client.post("/chat/completions", body=kwargs | {"stream": True},
                                            cast_to=ChatCompletion, stream=True,
                                            # Plain JSON chunks: no model object built for each token.
                                            stream_cls=AsyncStream[dict[str, Any]])
            async with stream:
                if "text/event-stream" not in stream.response.headers.get("content-type", ""):
                    return _completion(ChatCompletion.model_validate(json.loads(await stream.response.aread())))
                async for chunk in stream:
                    text = whole.add(chunk)
                    if text:
                        on_text(text)
        except openai.BadRequestError as exc:
            if _param_of(exc) != "stream":
                raise classify(exc) from exc
            log.warning("the model endpoint refuses streaming (%s); answers are asked for whole from now on",
                        _detail(exc))
            self.streams = False
            return await self._complete(kwargs, None)
        except openai.APIError as exc:
            raise classify(exc) from exc
        except _BROKEN_OFF as exc:  # the connection broke mid-answer
            raise ProviderError("network", f"the model's answer broke off: {type(exc).__name__}",
                                retryable=True) from exc
        except (ValueError, TypeError) as exc:  # a JSON body that is not a completion
            raise ProviderError("model", f"unexpected response from the endpoint: {exc}", retryable=False) from exc
        return Completion(content="".join(whole.text), tool_calls=whole.tool_calls())


def _body(model: str, request: CompletionRequest) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": _messages(request)}
    if request.tools:
        body["tools"] = request.tools
    return body


def _completion(response: ChatCompletion) -> Completion:
    if not response.choices:
        raise ProviderError("model", "the endpoint returned no choices", retryable=True)
    message = response.choices[0].message
    # Model output is stored and posted: its text is repaired (no NUL, no lone surrogate). The
    # arguments are left as written; a call whose arguments hold either is refused when parsed.
    calls = tuple(
        ToolCall(id=_cleaned(c.id), name=_cleaned(fn.name), arguments=fn.arguments or "{}")
        for c in (message.tool_calls or [])
        if (fn := getattr(c, "function", None)) is not None
    )
    return Completion(content=clean_text(message.content or ""), tool_calls=calls)


def _param_of(exc: openai.APIError) -> str | None:
    """The request parameter an error names (OpenAI: ``{"error": {"param": "stream", ...}}``)."""
    body = getattr(exc, "body", None)
    inner = body.get("error", body) if isinstance(body, dict) else None
    param = inner.get("param") if isinstance(inner, dict) else None
    return param if isinstance(param, str) else None


def _cleaned(value: Any) -> Any:
    """A string from the endpoint, repaired; anything else (a missing id) as it was."""
    return clean_text(value) if isinstance(value, str) else value


def _messages(request: CompletionRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": request.instructions}]
    for m in request.messages:
        out.append(_message(m))
    return out


def _message(m: ChatMessage) -> dict[str, Any]:
    if m.role == "tool":
        return {"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content}
    if m.role == "assistant" and m.tool_calls:
        return {
            "role": "assistant",
            "content": m.content or None,
            "tool_calls": [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in m.tool_calls
            ],
        }
    if m.images:
        parts: list[dict[str, Any]] = [{"type": "text", "text": m.content}] if m.content else []
        parts += [{"type": "image_url", "image_url": {"url": url}} for url in m.images]
        return {"role": m.role, "content": parts}
    return {"role": m.role, "content": m.content}


def classify(exc: openai.APIError) -> ProviderError:
    """Map the client's exceptions onto core's error kinds (SPEC §6)."""
    if isinstance(exc, openai.APIConnectionError):  # includes timeouts
        return ProviderError("network", f"cannot reach the model endpoint: {exc}", retryable=True)
    status = getattr(exc, "status_code", None)
    detail = _detail(exc)
    if isinstance(exc, openai.AuthenticationError | openai.PermissionDeniedError):
        return ProviderError("auth", f"HTTP {status}: {detail}", retryable=False, status=status)
    if isinstance(exc, openai.RateLimitError):
        return ProviderError("rate_limit", f"HTTP 429: {detail}", retryable=True,
                             retry_after=_retry_after(exc), status=status)
    if isinstance(exc, openai.BadRequestError):
        text = detail.lower()
        if ("context" in text and ("length" in text or "window" in text)) or "too many tokens" in text:
            return ProviderError("context_overflow", f"HTTP 400: {detail}", retryable=False, status=status)
        return ProviderError("model", f"HTTP 400: {detail}", retryable=False, status=status)
    if isinstance(exc, openai.NotFoundError):
        return ProviderError("model", f"HTTP 404 (unknown model or wrong LLM_BASE_URL?): {detail}",
                             retryable=False, status=status)
    if isinstance(exc, openai.InternalServerError) or (status is not None and status >= 500):
        return ProviderError("model", f"HTTP {status}: {detail}", retryable=True, status=status)
    if isinstance(exc, openai.APIResponseValidationError):
        return ProviderError("model", f"unexpected response from the endpoint: {detail}", retryable=False)
    return ProviderError("unknown", f"{type(exc).__name__}: {detail}", retryable=False, status=status)


def _detail(exc: openai.APIError) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])[:300]
        return json.dumps(body)[:300]
    return str(exc.message)[:300]


def _retry_after(exc: openai.APIStatusError) -> float | None:
    value = exc.response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return None
