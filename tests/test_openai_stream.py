"""The OpenAI-compatible provider's streamed answers, against an endpoint that streams the ways real ones do
(OpenAI, Ollama, proxies): tool calls put together right, a cut-off stream retried, a JSON body read as one,
an endpoint that refuses streaming asked again without it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from bot.providers.openai_compat import OpenAICompatibleProvider
from core.errors import ProviderError
from core.providers import ChatMessage, CompletionRequest
from tests.fakes.server import RunningServer

REQUEST = CompletionRequest(instructions="be brief", messages=[ChatMessage("user", "hi")])


class Endpoint:
    """Answers each request with the next scripted response: a list of SSE chunks, or (status, JSON body)."""

    def __init__(self) -> None:
        self.script: list[Any] = []
        self.bodies: list[dict[str, Any]] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.bodies.append(await request.json())
        step = self.script.pop(0)
        if callable(step):
            return await step(request)
        if isinstance(step, tuple):
            return web.json_response(step[1], status=step[0])
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in step:
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response


@pytest.fixture
async def endpoint() -> AsyncIterator[tuple[Endpoint, OpenAICompatibleProvider]]:
    fake = Endpoint()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", fake.handle)
    server = await RunningServer(app).start()
    provider = OpenAICompatibleProvider(base_url=f"{server.url}/v1", api_key="k", model="m", timeout_s=5)
    yield fake, provider
    await provider.aclose()
    await server.stop()


def _chunk(delta: dict[str, Any] | None, finish: str | None = None) -> dict[str, Any]:
    return {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def _call(index: int | None, ident: str | None, name: str | None, arguments: str) -> dict[str, Any]:
    piece: dict[str, Any] = {"function": {"name": name, "arguments": arguments}}
    if index is not None:
        piece["index"] = index
    if ident is not None:
        piece["id"] = ident
    return _chunk({"tool_calls": [piece]})


class Texts:
    def __init__(self) -> None:
        self.pieces: list[str] = []

    def restart(self) -> None:
        self.pieces.clear()

    def __call__(self, text: str) -> None:
        self.pieces.append(text)


async def test_text_arrives_piece_by_piece_and_the_whole_matches(endpoint: Any) -> None:
    fake, provider = endpoint
    fake.script.append([_chunk({"role": "assistant", "content": ""}), _chunk({"content": "The disk "}),
                        _chunk({"content": "is fine."}), _chunk({}, "stop")])
    texts = Texts()
    completion = await provider.complete(REQUEST, on_text=texts)
    assert texts.pieces == ["The disk ", "is fine."] and completion.content == "The disk is fine."
    assert fake.bodies[0]["stream"] is True


async def test_parallel_calls_under_one_index_with_their_own_ids_stay_apart(endpoint: Any) -> None:
    fake, provider = endpoint  # Ollama: every call under index 0, each with its id, the name repeated
    fake.script.append([_call(0, "a", "file_write", '{"path":'), _call(0, "a", "file_write", '"a"}'),
                        _call(0, "b", "file_write", '{"path":"b"}'), _chunk({}, "tool_calls")])
    completion = await provider.complete(REQUEST, on_text=Texts())
    assert [(c.id, c.name, json.loads(c.arguments)) for c in completion.tool_calls] == [
        ("a", "file_write", {"path": "a"}), ("b", "file_write", {"path": "b"})]


async def test_calls_without_an_index_or_an_id_are_put_together_and_named(endpoint: Any) -> None:
    fake, provider = endpoint
    fake.script.append([_call(None, None, "time_now", "{"), _call(None, None, None, "}"),
                        _chunk(None), _chunk({}, "tool_calls")])
    completion = await provider.complete(REQUEST, on_text=Texts())
    assert [(c.id, c.name, c.arguments) for c in completion.tool_calls] == [("call_1", "time_now", "{}")]


async def test_a_stream_that_ends_without_a_finish_reason_was_cut_off_and_is_retryable(endpoint: Any) -> None:
    fake, provider = endpoint
    fake.script.append([_chunk({"content": "The disk is almost"})])
    with pytest.raises(ProviderError) as failure:
        await provider.complete(REQUEST, on_text=Texts())
    assert failure.value.retryable and failure.value.kind == "network"


async def test_an_endpoint_that_answers_with_one_json_body_is_read_as_one(endpoint: Any) -> None:
    fake, provider = endpoint
    fake.script.append((200, {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                              "choices": [{"index": 0, "finish_reason": "stop",
                                           "message": {"role": "assistant", "content": "whole"}}]}))
    completion = await provider.complete(REQUEST, on_text=Texts())
    assert completion.content == "whole"


async def test_an_endpoint_that_refuses_streaming_is_asked_without_it_from_then_on(endpoint: Any) -> None:
    fake, provider = endpoint
    refusal = {"error": {"message": "Your organization must be verified to stream this model.",
                         "type": "invalid_request_error", "param": "stream", "code": "unsupported_value"}}
    answer = {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
              "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}]}
    fake.script += [(400, refusal), (200, answer), (200, answer)]
    assert (await provider.complete(REQUEST, on_text=Texts())).content == "ok"
    assert (await provider.complete(REQUEST, on_text=Texts())).content == "ok"
    assert [b.get("stream") for b in fake.bodies] == [True, None, None]


async def test_another_bad_request_is_still_a_model_error(endpoint: Any) -> None:
    fake, provider = endpoint
    fake.script.append((400, {"error": {"message": "bad tools", "param": "tools"}}))
    with pytest.raises(ProviderError) as failure:
        await provider.complete(REQUEST, on_text=Texts())
    assert failure.value.kind == "model" and not failure.value.retryable


async def _raw(status: int, body: bytes, headers: dict[str, str] | None = None) -> Any:
    async def answer(_request: web.Request) -> web.Response:
        return web.Response(status=status, body=body, headers=headers or {"Content-Type": "application/json"})
    return answer


@pytest.mark.parametrize(("status", "body", "headers", "kind", "retryable"), [
    (307, b"", {"Location": "http://127.0.0.1:9/elsewhere"}, "unknown", False),  # no redirect is followed
    (200, b"<html>sign in</html>", {"Content-Type": "text/html"}, "model", False),
    (200, b"[" * 100_000 + b"]" * 100_000, None, "model", False),  # too deep to parse
    (503, b"\xff\xfe not utf-8", {"Content-Type": "text/plain"}, "model", True),
    (429, b"{}", {"Retry-After": "nan"}, "rate_limit", True),
])
async def test_a_broken_or_hostile_endpoint_is_classified_not_crashed(
        endpoint: Any, status: int, body: bytes, headers: dict[str, str] | None, kind: str, retryable: bool) -> None:
    fake, provider = endpoint
    fake.script.append(await _raw(status, body, headers))
    with pytest.raises(ProviderError) as failure:
        await provider.complete(REQUEST)
    assert (failure.value.kind, failure.value.retryable) == (kind, retryable)
    assert failure.value.retry_after is None  # "nan" is no delay


async def test_an_answer_larger_than_the_limit_is_refused_not_kept(endpoint: Any,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from bot.providers import openai_compat

    monkeypatch.setattr(openai_compat, "MAX_BODY_BYTES", 1_000)
    fake, provider = endpoint
    fake.script.append(await _raw(200, b'{"choices": [{"message": {"content": "' + b"x" * 5_000 + b'"}}]}'))
    fake.script.append([_chunk({"content": "y" * 600}), _chunk({"content": "y" * 600}, "stop")])
    with pytest.raises(ProviderError, match="over 0 MB"):
        await provider.complete(REQUEST)
    with pytest.raises(ProviderError, match="over 0 MB"):
        await provider.complete(REQUEST, on_text=lambda _text: None)


async def test_an_endpoint_that_never_answers_times_out_as_a_network_error(endpoint: Any) -> None:
    fake, provider = endpoint

    async def silent(_request: web.Request) -> web.Response:
        await asyncio.sleep(2)  # far past the deadline below
        return web.Response()

    fake.script.append(silent)
    provider._timeout_s = 0.2  # the deadline for sending and the answer's head (LLM_TIMEOUT_S)
    with pytest.raises(ProviderError) as failure:
        await provider.complete(REQUEST)
    assert (failure.value.kind, failure.value.retryable) == ("network", True)


@pytest.mark.parametrize("bypass", [False, True])
async def test_the_environment_s_proxy_is_used_unless_no_proxy_names_the_host(
        monkeypatch: pytest.MonkeyPatch, bypass: bool) -> None:
    """HTTP(S)_PROXY as the SDK honoured it (read once, not per request); NO_PROXY bypasses it."""
    seen: list[str] = []

    async def proxy(request: web.Request) -> web.Response:
        seen.append(str(request.url))  # a forward proxy gets the absolute URL
        return web.json_response({"choices": [{"message": {"role": "assistant", "content": "via proxy"},
                                               "finish_reason": "stop"}]})

    async def direct(request: web.Request) -> web.Response:
        return web.json_response({"choices": [{"message": {"role": "assistant", "content": "direct"},
                                               "finish_reason": "stop"}]})

    proxy_app, model_app = web.Application(), web.Application()
    proxy_app.router.add_route("*", "/{tail:.*}", proxy)
    model_app.router.add_post("/v1/chat/completions", direct)
    proxy_server, model_server = await RunningServer(proxy_app).start(), await RunningServer(model_app).start()
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy", "ALL_PROXY",
                 "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", proxy_server.url)
    if bypass:
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    provider = OpenAICompatibleProvider(base_url=f"{model_server.url}/v1", api_key="k", model="m", timeout_s=5)
    try:
        answer = await provider.complete(REQUEST)
    finally:
        await provider.aclose()
        await proxy_server.stop()
        await model_server.stop()
    assert answer.content == ("direct" if bypass else "via proxy")
    assert seen == ([] if bypass else [f"{model_server.url}/v1/chat/completions"])
