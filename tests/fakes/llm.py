"""A fake OpenAI-compatible chat-completions server with a script of replies."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

SUMMARY = "Earlier: they checked the service and found the disk full."


@dataclass
class Reply:
    text: str = ""
    tool_calls: list[tuple[str, dict[str, Any] | str]] = field(default_factory=list)
    # Streamed (the request asked ``stream``): the text goes out in these pieces (default: word by word);
    # after ``hold_after`` pieces the stream waits until ``resume`` is set (a model still writing).
    pieces: list[str] | None = None
    hold_after: int | None = None
    resume: asyncio.Event = field(default_factory=asyncio.Event)
    held: asyncio.Event = field(default_factory=asyncio.Event)
    cut_after: int | None = None  # the connection drops after this many pieces (a stream that breaks)
    every_s: float = 0.0  # a pause before each piece after the first (a model writing at its pace)


@dataclass
class HttpError:
    status: int
    message: str = "error"
    retry_after: float | None = None
    code: str | None = None


@dataclass
class Gate:
    """Hold the next request until the test opens the gate (then answer with ``then``)."""

    then: Reply | HttpError
    opened: asyncio.Event = field(default_factory=asyncio.Event)
    reached: asyncio.Event = field(default_factory=asyncio.Event)


Step = Reply | HttpError | Gate


@dataclass
class FakeLLM:
    script: list[Step] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    delay_s: float = 0.0  # every answer waits this long (benchmarks: a slow model)
    arrivals: list[float] = field(default_factory=list)  # time.perf_counter() of each request
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    summaries: int = 0  # context-window summary calls answered (with SUMMARY)
    authorizations: list[str] = field(default_factory=list)  # each request's Authorization header (the key it sent)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        app.router.add_get("/v1/models", self._models)
        return app

    async def _models(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization", "").endswith("bad-key"):
            return web.json_response({"error": {"message": "Incorrect API key provided"}}, status=401)
        return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    def then(self, *steps: Step) -> None:
        self.script.extend(steps)

    def last_user_text(self, request_index: int = -1) -> str:
        msgs = [m for m in self.requests[request_index]["messages"] if m["role"] == "user"]
        return str(msgs[-1]["content"]) if msgs else ""

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.arrivals.append(time.perf_counter())
        self.requests.append(body)
        self.authorizations.append(request.headers.get("Authorization", ""))
        if self._is_summary(body):  # a context-window summary: answered here, never from the script
            self.summaries += 1
            return web.json_response(self._completion(body, Reply(SUMMARY)))
        step: Step = self.script.pop(0) if self.script else Reply(text=self._echo(body))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if isinstance(step, Gate):
            step.reached.set()
            await step.opened.wait()
            step = step.then
        if isinstance(step, HttpError):
            headers = {"retry-after": str(step.retry_after)} if step.retry_after is not None else {}
            error = {"error": {"message": step.message, "type": "error", "code": step.code}}
            return web.json_response(error, status=step.status, headers=headers)
        if body.get("stream"):
            return await self._stream(request, body, step)
        return web.json_response(self._completion(body, step))

    async def _stream(self, request: web.Request, body: dict[str, Any], reply: Reply) -> web.StreamResponse:
        """The reply as server-sent chunks, the way OpenAI streams a chat completion."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        ident, model = f"chatcmpl-{next(self._ids)}", body.get("model", "fake")

        async def send(delta: dict[str, Any], finish: str | None = None) -> None:
            chunk = {"id": ident, "object": "chat.completion.chunk", "created": 0, "model": model,
                     "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())

        await send({"role": "assistant", "content": ""})
        pieces = reply.pieces if reply.pieces is not None else _words(reply.text)
        for index, piece in enumerate(pieces):
            if reply.cut_after is not None and index == reply.cut_after:
                assert request.transport is not None
                request.transport.close()
                return response
            if reply.hold_after is not None and index == reply.hold_after:
                reply.held.set()
                await reply.resume.wait()
            if reply.every_s and index:
                await asyncio.sleep(reply.every_s)
            await send({"content": piece})
        for n, (name, args) in enumerate(reply.tool_calls):
            text = args if isinstance(args, str) else json.dumps(args)
            await send({"tool_calls": [{"index": n, "id": f"call_{next(self._ids)}", "type": "function",
                                        "function": {"name": name, "arguments": ""}}]})
            for half in (text[: len(text) // 2], text[len(text) // 2:]):
                await send({"tool_calls": [{"index": n, "function": {"arguments": half}}]})
        await send({}, "tool_calls" if reply.tool_calls else "stop")
        if (body.get("stream_options") or {}).get("include_usage"):  # OpenAI: a last chunk, no choices
            usage = {"id": ident, "object": "chat.completion.chunk", "created": 0, "model": model, "choices": [],
                     "usage": _usage(body, reply)}
            await response.write(f"data: {json.dumps(usage)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    @staticmethod
    def _is_summary(body: dict[str, Any]) -> bool:
        first = (body.get("messages") or [{}])[0]
        return first.get("role") == "system" and str(first.get("content", "")).startswith("You summarise")

    def streamed(self, request_index: int = -1) -> bool:
        return bool(self.requests[request_index].get("stream"))

    @staticmethod
    def _echo(body: dict[str, Any]) -> str:
        users = [m for m in body["messages"] if m["role"] == "user"]
        return f"echo: {users[-1]['content']}" if users else "echo"

    def _completion(self, body: dict[str, Any], reply: Reply) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
        if reply.tool_calls:
            message["tool_calls"] = [
                {"id": f"call_{next(self._ids)}", "type": "function",
                 "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}
                for name, args in reply.tool_calls
            ]
        return {
            "id": f"chatcmpl-{next(self._ids)}", "object": "chat.completion", "created": 0,
            "model": body.get("model", "fake"),
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "tool_calls" if reply.tool_calls else "stop"}],
            "usage": _usage(body, reply),
        }


def _usage(body: dict[str, Any], reply: Reply) -> dict[str, int]:
    """Tokens as a model would count them, near enough: a token per 4 characters of what went in and out."""
    prompt = len(json.dumps(body.get("messages", []))) // 4 + 1
    completion = (len(reply.text) + len(json.dumps(reply.tool_calls))) // 4 + 1
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _words(text: str) -> list[str]:
    """``text`` in pieces a model might send: each word with the space before it."""
    pieces: list[str] = []
    for word in text.split(" "):
        pieces.append(f" {word}" if pieces else word)
    return pieces
