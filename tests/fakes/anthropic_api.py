"""A fake Anthropic Messages API (``POST /v1/messages``, ``GET /v1/models/{id}``) with a script of replies.

Answers as the real API does: a whole ``message`` as JSON, or, when the request asks ``stream``, server-sent
events (``message_start``, ``content_block_start`` / ``_delta`` / ``_stop``, ``message_delta`` with the
usage, ``message_stop``; ``tool_use`` inputs as ``input_json_delta`` pieces; a ``ping`` among them), and
errors as ``{"type": "error", "error": {"type": …, "message": …}}`` with their headers. It refuses what the
real API refuses in a request's shape (roles that do not alternate, a ``tool_result`` without its
``tool_use``, no ``max_tokens``), so a translation mistake fails a test, not a deployment.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

MODEL = "claude-fake-1"
BAD_KEY = "sk-ant-bad-key"
SUMMARY = "Earlier: they checked the service and found the disk full."
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
               529: "overloaded_error"}


@dataclass
class Reply:
    text: str = ""
    tool_calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    pieces: list[str] | None = None  # streamed text in these pieces (default: word by word)
    cut_after: int | None = None  # the connection drops after this many text pieces (a stream that breaks)
    error_event: str | None = None  # an ``error`` event of this type after the text (e.g. overloaded_error)


@dataclass
class ApiError:
    status: int
    message: str = "error"
    retry_after: float | None = None
    type: str | None = None  # default: the API's type for the status


Step = Reply | ApiError


@dataclass
class FakeAnthropic:
    script: list[Step] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    usages: list[dict[str, int]] = field(default_factory=list)  # the usage each answer reported
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _prefixes: set[str] = field(default_factory=set)  # cached prompt prefixes (cache reads after the first)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_get("/v1/models/{model_id}", self._model)
        return app

    def then(self, *steps: Step) -> None:
        self.script.extend(steps)

    def streamed(self, request_index: int = -1) -> bool:
        return bool(self.requests[request_index].get("stream"))

    async def _model(self, request: web.Request) -> web.Response:
        if api_key(request) == BAD_KEY:
            return _error(ApiError(401, "invalid x-api-key"))
        model_id = request.match_info["model_id"]
        if model_id != MODEL:
            return _error(ApiError(404, f"model: {model_id}"))
        return web.json_response({"type": "model", "id": MODEL, "display_name": "Claude Fake",
                                  "created_at": "2025-01-01T00:00:00Z", "lifecycle": "active"})

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        self.headers.append({k.lower(): v for k, v in request.headers.items()})
        if api_key(request) == BAD_KEY:
            return _error(ApiError(401, "invalid x-api-key"))
        problem = _shape_problem(body)
        if problem:
            return _error(ApiError(400, problem))
        if body["model"] != MODEL:
            return _error(ApiError(404, f"model: {body['model']}"))
        system = "".join(b.get("text", "") for b in body.get("system") or []) if isinstance(
            body.get("system"), list) else str(body.get("system") or "")
        if system.startswith("You summarise"):  # a context-window summary: never from the script
            step: Step = Reply(SUMMARY)
        else:
            step = self.script.pop(0) if self.script else Reply(text=_echo(body))
        if isinstance(step, ApiError):
            return _error(step)
        if body.get("stream"):
            return await self._stream(request, body, step)
        return web.json_response(self._message(body, step))

    def _usage(self, body: dict[str, Any], reply: Reply) -> dict[str, int]:
        """A token per 4 characters, near enough; the cached prefix is written once, then read."""
        usage = {"input_tokens": len(json.dumps(body["messages"])) // 4 + 1,
                 "output_tokens": (len(reply.text) + len(json.dumps(reply.tool_calls))) // 4 + 1,
                 "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
        if "cache_control" in json.dumps([body.get("system"), body.get("tools")]):
            prefix = json.dumps([body.get("system"), body.get("tools")])
            read = prefix in self._prefixes
            self._prefixes.add(prefix)
            usage["cache_read_input_tokens" if read else "cache_creation_input_tokens"] = len(prefix) // 4 + 1
        self.usages.append(usage)
        return usage

    def _blocks(self, reply: Reply) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = [{"type": "text", "text": reply.text}] if reply.text else []
        blocks += [{"type": "tool_use", "id": f"toolu_{next(self._ids):04d}", "name": name, "input": args}
                   for name, args in reply.tool_calls]
        return blocks

    def _message(self, body: dict[str, Any], reply: Reply) -> dict[str, Any]:
        return {"id": f"msg_{next(self._ids)}", "type": "message", "role": "assistant", "model": body["model"],
                "content": self._blocks(reply), "stop_reason": "tool_use" if reply.tool_calls else "end_turn",
                "stop_sequence": None, "usage": self._usage(body, reply)}

    async def _stream(self, request: web.Request, body: dict[str, Any], reply: Reply) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)

        async def send(event: str, data: dict[str, Any]) -> None:
            await response.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())

        usage = self._usage(body, reply)
        start = {key: value for key, value in usage.items() if key != "output_tokens"} | {"output_tokens": 1}
        await send("message_start", {"type": "message_start", "message": {
            "id": f"msg_{next(self._ids)}", "type": "message", "role": "assistant", "model": body["model"],
            "content": [], "stop_reason": None, "stop_sequence": None, "usage": start}})
        index = 0
        if reply.text:
            await send("content_block_start", {"type": "content_block_start", "index": 0,
                                               "content_block": {"type": "text", "text": ""}})
            await send("ping", {"type": "ping"})
            pieces = reply.pieces if reply.pieces is not None else _words(reply.text)
            for n, piece in enumerate(pieces):
                if reply.cut_after is not None and n == reply.cut_after:
                    assert request.transport is not None
                    request.transport.close()
                    return response
                await send("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                   "delta": {"type": "text_delta", "text": piece}})
            await send("content_block_stop", {"type": "content_block_stop", "index": 0})
            index = 1
        if reply.error_event:
            await send("error", {"type": "error", "error": {"type": reply.error_event, "message": "Overloaded"}})
            await response.write_eof()
            return response
        for block in self._blocks(Reply(tool_calls=reply.tool_calls)):
            text = json.dumps(block["input"])
            await send("content_block_start", {"type": "content_block_start", "index": index,
                                               "content_block": {**block, "input": {}}})
            for half in (text[: len(text) // 2], text[len(text) // 2:]):
                await send("content_block_delta", {"type": "content_block_delta", "index": index,
                                                   "delta": {"type": "input_json_delta", "partial_json": half}})
            await send("content_block_stop", {"type": "content_block_stop", "index": index})
            index += 1
        await send("message_delta", {"type": "message_delta",
                                     "delta": {"stop_reason": "tool_use" if reply.tool_calls else "end_turn",
                                               "stop_sequence": None},
                                     "usage": {"output_tokens": usage["output_tokens"]}})
        await send("message_stop", {"type": "message_stop"})
        await response.write_eof()
        return response


def api_key(request: web.Request) -> str | None:
    """The key a request carries: ``x-api-key``, or (the SDK since 2.x) ``Authorization: Bearer``."""
    bearer = request.headers.get("Authorization", "")
    return request.headers.get("x-api-key") or (bearer.removeprefix("Bearer ") if bearer.startswith("Bearer ")
                                                else None)


def _error(error: ApiError) -> web.Response:
    headers = {"request-id": "req_fake"}
    if error.retry_after is not None:
        headers["retry-after"] = str(error.retry_after)
    kind = error.type or ERROR_TYPES.get(error.status, "api_error")
    return web.json_response({"type": "error", "error": {"type": kind, "message": error.message},
                              "request_id": "req_fake"}, status=error.status, headers=headers)


def _shape_problem(body: dict[str, Any]) -> str | None:
    """What the real API would refuse in a request's shape (the subset a translation can get wrong)."""
    if not isinstance(body.get("max_tokens"), int):
        return "max_tokens: Field required"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: at least one message is required"
    if messages[0].get("role") != "user":
        return "messages: first message must use the \"user\" role"
    open_calls: set[str] = set()
    for n, message in enumerate(messages):
        if n and message.get("role") == messages[n - 1].get("role"):
            return f"messages.{n}: roles must alternate between \"user\" and \"assistant\""
        content = message.get("content")
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
        results = [b for b in blocks if b.get("type") == "tool_result"]
        if open_calls and {b.get("tool_use_id") for b in results} != open_calls:
            return f"messages.{n}: each tool_use must have a tool_result block in the next message"
        if blocks[: len(results)] != results:
            return f"messages.{n}: tool_result blocks must come first in the content"
        if results and not open_calls:
            return f"messages.{n}: unexpected tool_use_id found in tool_result blocks"
        for block in blocks:
            if block.get("type") == "text" and not block.get("text"):
                return f"messages.{n}: text content blocks must be non-empty"
        open_calls = {b["id"] for b in blocks if b.get("type") == "tool_use"}
    tools = body.get("tools") or []
    if any(not isinstance(t.get("input_schema"), dict) or "function" in t for t in tools):
        return "tools.0.input_schema: Field required"
    return None


def _echo(body: dict[str, Any]) -> str:
    users = [m for m in body["messages"] if m["role"] == "user"]
    content = users[-1]["content"] if users else ""
    texts = [b.get("text", "") for b in content if b.get("type") == "text"] if isinstance(content, list) else [content]
    return f"echo: {texts[-1]}" if texts else "echo"


def _words(text: str) -> list[str]:
    pieces: list[str] = []
    for word in text.split(" "):
        pieces.append(f" {word}" if pieces else word)
    return pieces
