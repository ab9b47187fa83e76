"""Any OpenAI-compatible chat-completions endpoint (OpenAI, Azure, Ollama, vLLM, OpenRouter, LiteLLM…)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp.helpers import get_env_proxy_for_url
from yarl import URL

from bot.providers.idle import IdleWatchdog
from bot.providers.openai_stream import StreamedCompletion
from bot.providers.retry_after import retry_after_seconds
from core.errors import ProviderError
from core.providers import ChatMessage, Completion, CompletionRequest, TextStream, ToolCall
from core.text import clean_text

log = logging.getLogger(__name__)
DEFAULT_BASE_URL = "https://api.openai.com/v1"
MAX_BODY_BYTES = 32_000_000  # a model's answer larger than this is refused, not kept in memory


class OpenAICompatibleProvider:
    """Chat completions over the bot's own aiohttp session: the request body is built once here and the
    answer read as plain JSON (the OpenAI SDK's request path cost about 1.4 ms of CPU a call, a quarter of a
    mention's in the gateway's profile). No SDK at all: ``bot doctor`` lists the models through
    ``model_names``, and an error answer is classified from its status, headers and body (``classify``)."""

    name = "openai"

    def __init__(self, *, base_url: str | None, api_key: str | None, model: str, timeout_s: float,
                 stream: bool = True, idle_timeout_s: float | None = None) -> None:
        self.model = model
        self.idle_timeout_s = idle_timeout_s or timeout_s  # LLM_IDLE_TIMEOUT_S: a streamed answer's silence
        self.streams = stream  # answers stream as they are written (LLM_STREAM)
        base = base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
        self.base_url = base.rstrip("/")
        self.url = f"{self.base_url}/chat/completions"
        # identity: the size limit counts what arrives (nothing is inflated past it).
        self._headers = {"Authorization": f"Bearer {api_key or 'not-needed'}", "Content-Type": "application/json",
                         "Accept": "application/json", "Accept-Encoding": "identity"}
        self._timeout_s = timeout_s
        # Like the SDK: the timeout is per phase (connect, each read), not for a whole streamed answer.
        self._timeout = aiohttp.ClientTimeout(total=None, connect=timeout_s, sock_connect=timeout_s,
                                              sock_read=timeout_s)
        # A streamed answer's reads belong to the idle watchdog (LLM_IDLE_TIMEOUT_S), which is not retried.
        self._stream_timeout = aiohttp.ClientTimeout(total=None, connect=timeout_s, sock_connect=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._stream_usage = True  # ask a stream for its usage (dropped if the endpoint refuses the option)
        # HTTPS_PROXY and friends (NO_PROXY too), as the SDK honoured them: looked up once, not per request
        # (aiohttp's trust_env reads the environment and ~/.netrc on a thread for every call).
        self._proxy: URL | None = None
        self._proxy_auth: aiohttp.BasicAuth | None = None
        with contextlib.suppress(LookupError):  # none set for this URL (or NO_PROXY names its host)
            self._proxy, self._proxy_auth = get_env_proxy_for_url(URL(self.url))

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # Retries are ours (classified).
            self._session = aiohttp.ClientSession(timeout=self._timeout, cookie_jar=aiohttp.DummyCookieJar())
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def model_names(self) -> list[str] | None:
        """The model ids ``GET {base}/models`` lists (``bot doctor``), or None from an endpoint without that
        list (404). Asked as a completion is (key, proxy, no redirects), within one ``timeout_s``; an error
        answer is a ProviderError of the same kind as a completion's."""
        try:
            async with asyncio.timeout(self._timeout_s):
                response = await self._http().get(f"{self.base_url}/models", headers=self._headers,
                                                  allow_redirects=False, proxy=self._proxy,
                                                  proxy_auth=self._proxy_auth)
                async with response:
                    if response.status == 404:
                        return None
                    body = await _body_of(response)
                    if response.status >= 300:
                        raise classify(response.status, body.decode("utf-8", "replace"), response.headers)
        except ProviderError:
            raise
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ProviderError("network", f"cannot reach the model endpoint: {type(exc).__name__}",
                                retryable=True) from exc
        try:
            listing = json.loads(body)
        except (ValueError, RecursionError):
            listing = None
        models = listing.get("data") if isinstance(listing, dict) else None
        if not isinstance(models, list):
            raise ProviderError("model", "unexpected response from the endpoint: not a list of models",
                                retryable=False)
        return [m["id"] for m in models if isinstance(m, dict) and isinstance(m.get("id"), str)]

    async def complete(self, request: CompletionRequest, *, on_text: TextStream | None = None) -> Completion:
        return await self._complete(_body(self.model, request), on_text)

    async def _complete(self, body: dict[str, Any], on_text: TextStream | None) -> Completion:
        streaming = on_text is not None and self.streams
        # A streamed answer's usage (the thread's token budget) comes only when asked for.
        extra = {"stream": True, **({"stream_options": {"include_usage": True}} if self._stream_usage else {})}
        payload = json.dumps(body | extra if streaming else body)
        try:
            # Sending the request and getting the answer's head: one deadline (a peer that never reads a
            # large body would otherwise hold the turn for ever); then each read has its own.
            async with asyncio.timeout(self._timeout_s):
                response = await self._http().post(self.url, data=payload.encode(), headers=self._headers,
                                                   allow_redirects=False, proxy=self._proxy,
                                                   proxy_auth=self._proxy_auth,
                                                   timeout=self._stream_timeout if streaming else self._timeout)
            async with response:
                if response.status >= 300:
                    error = _status_error(response.status, (await self._whole(response, streaming)).decode(
                        "utf-8", "replace"), response.headers)
                    if streaming and response.status == 400 and self._stream_usage and (
                            error.param == "stream_options" or "stream_options" in error.detail):
                        log.warning("the model endpoint refuses stream_options (%s); streamed answers' tokens are "
                                    "estimated from now on", error.detail)
                        self._stream_usage = False
                        return await self._complete(body, on_text)
                    if streaming and response.status == 400 and error.param == "stream":
                        log.warning("the model endpoint refuses streaming (%s); answers are asked for whole from "
                                    "now on", error.detail)
                        self.streams = False
                        return await self._complete(body, None)
                    raise error.provider_error
                if streaming and "text/event-stream" in response.headers.get("Content-Type", ""):
                    assert on_text is not None
                    async with IdleWatchdog(self.idle_timeout_s) as watchdog:
                        return await _read_stream(response, on_text, watchdog)
                return _completion(json.loads(await self._whole(response, streaming)))
        except ProviderError:
            raise
        except (aiohttp.ClientConnectorError, aiohttp.ServerTimeoutError, TimeoutError) as exc:
            raise ProviderError("network", f"cannot reach the model endpoint: {type(exc).__name__}",
                                retryable=True) from exc
        except aiohttp.ClientError as exc:
            raise ProviderError("network", f"the model's answer broke off: {type(exc).__name__}",
                                retryable=True) from exc
        except Exception as exc:  # a body that is not a completion (not JSON, too deep, a line too long…)
            # Only the type: the text may quote model output, which is never logged unredacted.
            raise ProviderError("model", f"unexpected response from the endpoint ({type(exc).__name__})",
                                retryable=False) from None


    async def _whole(self, response: aiohttp.ClientResponse, streaming: bool) -> bytes:
        """A whole body: within LLM_TIMEOUT_S when a stream was asked for (its reads have no timeout of their own)."""
        async with asyncio.timeout(self._timeout_s if streaming else None):
            return await _body_of(response)


async def _body_of(response: aiohttp.ClientResponse) -> bytes:
    """A whole (non-streamed) body, read up to ``MAX_BODY_BYTES``."""
    body = bytearray()
    async for piece in response.content.iter_chunked(65_536):
        body += piece
        if len(body) > MAX_BODY_BYTES:
            raise ProviderError("model", f"the endpoint's answer is over {MAX_BODY_BYTES // 1_000_000} MB",
                                retryable=False)
    return bytes(body)


async def _read_stream(response: aiohttp.ClientResponse, on_text: TextStream, watchdog: IdleWatchdog) -> Completion:
    """Server-sent chunks (``data: {...}`` lines, ``data: [DONE]`` at the end) put together as they come
    (bot.providers.openai_stream); text goes to ``on_text`` as it arrives; each ``data:`` line feeds the ``watchdog``
    (keep-alive comments do not: a proxy in front of a hung model sends them for ever, and the fallback must get its
    turn; Anthropic's SDK skips its pings alike)."""
    whole = StreamedCompletion()
    received = 0
    usage: int | None = None
    tokens: dict[str, int | None] = {}
    async for raw in response.content:
        received += len(raw)
        if received > MAX_BODY_BYTES:
            raise ProviderError("model", f"the endpoint's answer is over {MAX_BODY_BYTES // 1_000_000} MB",
                                retryable=False)
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue  # blank separators, comments (": ping"), event names
        watchdog.touch()
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        chunk = json.loads(data)
        if isinstance(chunk, dict) and isinstance(chunk.get("error"), dict):  # an error sent mid-stream
            raise _status_error(500, json.dumps(chunk), {}).provider_error
        counted = usage_of(chunk)
        if counted is not None:  # the last chunk, when asked for (stream_options)
            usage, tokens = counted, tokens_of(chunk)
        text = whole.add(chunk)
        if text:
            on_text(text)
    return Completion(content="".join(whole.text), tool_calls=whole.tool_calls(), usage=usage, **tokens)


def _body(model: str, request: CompletionRequest) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": _messages(request)}
    if request.tools:
        body["tools"] = request.tools
    if request.max_output_tokens is not None:
        body["max_tokens"] = request.max_output_tokens
    return body


def _completion(response: Any) -> Completion:
    """A chat completion as JSON (a dict) put into core's terms."""
    choices = response.get("choices") if isinstance(response, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ProviderError("model", "the endpoint returned no choices", retryable=True)
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise ProviderError("model", "unexpected response from the endpoint: a choice without a message",
                            retryable=False)
    # Model output is stored and posted: its text is repaired (no NUL, no lone surrogate). The
    # arguments are left as written; a call whose arguments hold either is refused when parsed.
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            arguments = function.get("arguments")
            calls.append(ToolCall(id=_cleaned(call.get("id")), name=_cleaned(function.get("name")),
                                  arguments=arguments if isinstance(arguments, str) and arguments else "{}"))
    content = message.get("content")
    return Completion(content=clean_text(content if isinstance(content, str) else ""), tool_calls=tuple(calls),
                      usage=usage_of(response), **tokens_of(response))


def usage_of(response: Any) -> int | None:
    """``usage.total_tokens`` of a completion (or of a stream's last chunk), if the endpoint says it."""
    usage = response.get("usage") if isinstance(response, dict) else None
    total = usage.get("total_tokens") if isinstance(usage, dict) else None
    # Zero or absurd figures are not believed (an endpoint must not switch a budget off): estimated instead.
    return total if isinstance(total, int) and not isinstance(total, bool) and 0 < total < 10**7 else None


def tokens_of(response: Any) -> dict[str, int | None]:
    """``usage.prompt_tokens`` and ``usage.completion_tokens`` as ``input_tokens`` and ``output_tokens``."""
    usage = response.get("usage") if isinstance(response, dict) else None
    usage = usage if isinstance(usage, dict) else {}
    return {field: value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 10**7 else None
            for field, value in (("input_tokens", usage.get("prompt_tokens")),
                                 ("output_tokens", usage.get("completion_tokens")))}


@dataclass(frozen=True)
class _StatusError:
    provider_error: ProviderError
    detail: str
    param: str | None


def classify(status: int, text: str, headers: Mapping[str, str]) -> ProviderError:
    """An error answer (HTTP ``status``, its body ``text``, its headers) as core's error kind (SPEC §6)."""
    return _status_error(status, text, headers).provider_error


def _status_error(status: int, text: str, headers: Mapping[str, str]) -> _StatusError:
    """An error answer as core's error kind, with what it says and the parameter it names (if any)."""
    try:
        body: Any = json.loads(text)
    except ValueError:
        body = None
    inner = body.get("error", body) if isinstance(body, dict) else None
    detail = _detail_of(body, text or f"HTTP {status}")
    param = inner.get("param") if isinstance(inner, dict) and isinstance(inner.get("param"), str) else None
    return _StatusError(_kind_of(status, detail, retry_after_seconds(headers.get("retry-after"))), detail, param)


def _detail_of(body: Any, fallback: str) -> str:
    """What an error body says (OpenAI: ``{"error": {"message": …}}``), short; ``fallback`` without a body."""
    inner = body.get("error", body) if isinstance(body, dict) else None
    if isinstance(inner, dict) and inner.get("message"):
        return str(inner["message"])[:300]
    return (json.dumps(body) if body is not None else fallback)[:300]


def _kind_of(status: int, detail: str, retry_after: float | None) -> ProviderError:
    if status in (401, 403):
        return ProviderError("auth", f"HTTP {status}: {detail}", retryable=False, status=status)
    if status == 429:
        return ProviderError("rate_limit", f"HTTP 429: {detail}", retryable=True, retry_after=retry_after,
                             status=status)
    if status == 400:
        text = detail.lower()
        if ("context" in text and ("length" in text or "window" in text)) or "too many tokens" in text:
            return ProviderError("context_overflow", f"HTTP 400: {detail}", retryable=False, status=status)
        return ProviderError("model", f"HTTP 400: {detail}", retryable=False, status=status)
    if status == 404:
        return ProviderError("model", f"HTTP 404 (unknown model or wrong LLM_BASE_URL?): {detail}",
                             retryable=False, status=status)
    if status >= 500:
        return ProviderError("model", f"HTTP {status}: {detail}", retryable=True, status=status)
    return ProviderError("unknown", f"HTTP {status}: {detail}", retryable=False, status=status)



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
